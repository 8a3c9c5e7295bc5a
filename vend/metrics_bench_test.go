package vend_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/adapters/admin"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// BenchmarkMetricsOverhead measures what the Prometheus metrics (an
// admin.Metrics as the ledger's and the Vendor's Observer) cost: paid
// calls (quote, payment, settlement, execution, delivery: five durable
// ledger commits) and free calls, by 16 callers at once, each without
// ("off") and with ("on") metrics, side by side in one run. Targets: on
// costs <= 3% of paid-call and <= 5% of free-call throughput.
func BenchmarkMetricsOverhead(b *testing.B) {
	for _, kind := range []string{"paid", "free"} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/metrics=%s", kind, map[bool]string{false: "off", true: "on"}[on]), func(b *testing.B) {
				h := metricsHarness(b, on)
				benchCalls(b, h, kind == "paid", 16)
			})
		}
	}
}

// metricsHarness is a harness whose ledger and Vendor report to a new
// admin.Metrics when on.
func metricsHarness(b *testing.B, on bool) *harness {
	var obs vend.Observer
	if on {
		obs = admin.NewMetrics([]string{"demo"}, []admin.Item{{Server: "demo", Tool: "echo"}}, admin.Sources{}, nil)
	}
	l, err := ledger.Open(context.Background(), filepath.Join(b.TempDir(), "capvend.db"), ledger.Options{Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return harnessOn(b, l, false, func(c *vend.Config) {
		c.Observer = obs
		c.MaxUnpaidPerClient, c.MaxUnpaidTotal = 1000, 1000
	})
}

// benchCalls runs b.N calls (paid: each paid at once through the fake
// backend) by callers goroutines, and reports calls/s.
func benchCalls(b *testing.B, h *harness, paid bool, callers int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				id := strconv.FormatInt(i, 10)
				r := req(id, "demo_free", `{"text":"x`+id+`"}`, nil)
				r.Client = "client-" + strconv.Itoa(int(i%64))
				if !paid {
					if _, err := h.v.CallTool(h.ctx, r); err != nil {
						errs <- err
						return
					}
					continue
				}
				r.Tool = "demo_echo"
				ch := h.callAsync(r)
				p := <-h.be.last // some caller's payment request: pay it
				h.be.pay(p.Ref)
				if o := <-ch; o.err != nil {
					errs <- o.err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}
