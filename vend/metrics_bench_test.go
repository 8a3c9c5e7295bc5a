package vend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/adapters/admin"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// BenchmarkMetricsOverhead measures what the Prometheus metrics (an
// admin.Metrics as the ledger's and the Vendor's Observer) cost: paid
// calls (quote, payment, settlement, execution, delivery: five durable
// ledger commits) and free calls, by 16 callers at once, without ("off")
// and with ("on") metrics, side by side: pairs of rounds, off and on
// (see overhead), on a ledger in /dev/shm (fsync is free there, so the
// CPU the metrics cost is not hidden behind the disk's waits, nor
// drowned in its noise). It reports each side's median calls/s and CPU
// time per call, and the median pair's cost in % of off's throughput
// (cost-%) and CPU per call (cpu-cost-%). Targets: <= 3% for paid calls,
// <= 5% for free calls.
func BenchmarkMetricsOverhead(b *testing.B) { overhead(b, false) }

// BenchmarkMonitoringOverhead is BenchmarkMetricsOverhead with continuous
// reconciliation on too: during the "on" rounds (only), a reconciler runs
// at once and then every reconcileEvery against a node whose invoice list
// holds every invoice the calls paid, so each run compares the new ones
// with the ledger and records itself (three commits). Targets (issue
// #13): metrics and reconciliation together cost <= 3% of paid-call
// throughput and <= 5% of free-call throughput. Give it rounds of a second
// or more (-benchtime 20s, see overheadPairs): in a shorter round the
// reconciler runs more often than every reconcileEvery.
func BenchmarkMonitoringOverhead(b *testing.B) { overhead(b, true) }

// reconcileEvery is the benchmark's reconcile.interval: ten times shorter
// than serve allows (10 s), 300 times shorter than its default (5 min).
const reconcileEvery = time.Second

// overhead runs the side-by-side rounds of BenchmarkMetricsOverhead, with
// a reconciler during the "on" rounds if rec. The rounds come in
// overheadPairs pairs, off then on or on then off (alternating), each
// round a b.N/overheadPairs/2 calls; each pair gives a cost (on against
// off: calls/s, and the process's CPU time per call), and the median
// pair's is reported: a pair's rounds run back to back, so the load of
// the rest of a shared machine changes less within a pair than across
// the run. The rounds are labeled on=true/false for the CPU profile
// (-cpuprofile, then go tool pprof -tagfocus on=true).
func overhead(b *testing.B, rec bool) {
	for _, kind := range []string{"paid", "free"} {
		b.Run(kind, func(b *testing.B) {
			dir := shmDir(b)
			hs := map[bool]*benchHarness{}
			for _, on := range []bool{false, true} {
				// The ledger's writer goroutine, started by Open, takes
				// the label too: the profile then splits its work by side.
				pprof.Do(context.Background(), onLabel(on), func(context.Context) {
					hs[on] = &benchHarness{h: metricsHarness(b, dir, on)}
				})
			}
			if rec {
				// Each side's node lists the invoices its calls paid (as
				// LND does whether or not capvend reconciles); only "on"
				// reconciles.
				hs[false].lnd, hs[true].lnd = &benchLND{}, &benchLND{}
				hs[true].reconciled = true
			}
			var sides testkit.OnOff
			var runs int
			n := max(b.N/overheadPairs/2, 1)
			b.ResetTimer()
			for r := 0; r < overheadPairs; r++ {
				for _, on := range []bool{r%2 == 1, r%2 == 0} { // who goes first alternates
					pprof.Do(context.Background(), onLabel(on), func(context.Context) {
						stop := hs[on].reconcile(b)
						sides.Round(on, n, func() time.Duration { return benchCalls(b, hs[on], kind == "paid", 16, n) })
						runs += stop()
					})
				}
			}
			b.StopTimer()
			sides.Report(b)
			if rec {
				b.ReportMetric(float64(runs), "reconcile-runs")
			}
		})
	}
}

// onLabel is the profile label of side on's work.
func onLabel(on bool) pprof.LabelSet { return pprof.Labels("on", strconv.FormatBool(on)) }

// overheadPairs is how many off/on pairs of rounds overhead runs. Give
// the benchmark about two seconds per pair (-benchtime 20s) so that a
// round lasts about the reconciler's interval: the reconciler runs at
// the start of each "on" round, and every reconcileEvery in it.
const overheadPairs = 10

// benchLND is an LND node's invoice list as the reconciler reads it: the
// invoices the benchmark's calls paid, settled, in add-index order.
type benchLND struct {
	mu   sync.Mutex
	invs []reconcile.Invoice
}

func (n *benchLND) settled(ref string, amount vend.Msat) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.invs = append(n.invs, reconcile.Invoice{Ref: ref, State: reconcile.InvoiceSettled, AmountPaid: amount,
		AddIndex: uint64(len(n.invs) + 1), SettleIndex: uint64(len(n.invs) + 1)})
}

// Invoices implements reconcile.LND.
func (n *benchLND) Invoices(_ context.Context, after uint64, max int) ([]reconcile.Invoice, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	from := min(int(after), len(n.invs))
	return append([]reconcile.Invoice(nil), n.invs[from:min(from+max, len(n.invs))]...), nil
}

// CancelInvoice implements reconcile.LND: nothing is ever to cancel here.
func (n *benchLND) CancelInvoice(context.Context, string) error {
	return errors.New("benchmark: no invoice is canceled")
}

// reconcile starts bh's reconciler (if it has a node) and returns the
// function that stops it, which returns how many runs it finished.
func (bh *benchHarness) reconcile(b *testing.B) (stop func() int) {
	if !bh.reconciled {
		return func() int { return 0 }
	}
	var runs atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	r, err := reconcile.New(reconcile.Config{Store: bh.h.l, LND: bh.lnd, Repair: true, Report: bh.h.v.Report,
		Interval: reconcileEvery, Observe: func(s reconcile.Summary) {
			if len(s.Differences) > 0 || (s.Err != nil && ctx.Err() == nil) {
				b.Errorf("reconciliation found %d differences: %v", len(s.Differences), s.Err)
			}
			runs.Add(1)
		}})
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	return func() int {
		cancel()
		<-done
		return int(runs.Load())
	}
}

// shmDir is a new directory in /dev/shm, removed when b ends.
func shmDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "capvend-bench")
	if err != nil {
		b.Skip("no /dev/shm:", err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// benchHarness is a harness and the last request id used on it.
type benchHarness struct {
	h    *harness
	next atomic.Int64
	lnd  *benchLND // if not nil, paid invoices are listed there
	// reconciled: a reconciler compares lnd with the ledger during
	// the rounds.
	reconciled bool
}

// metricsHarness is a harness whose ledger and Vendor report to a new
// admin.Metrics when on.
func metricsHarness(b *testing.B, dir string, on bool) *harness {
	var obs vend.Observer
	if on {
		obs = admin.NewMetrics([]string{"demo"}, []admin.Item{{Server: "demo", Tool: "echo"}}, admin.Sources{}, nil)
	}
	l, err := ledger.Open(context.Background(), filepath.Join(dir, fmt.Sprintf("capvend-%v.db", on)), ledger.Options{Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return harnessOn(b, l, false, func(c *vend.Config) {
		c.Observer = obs
		c.MaxUnpaidPerClient, c.MaxUnpaidTotal = 1000, 1000
	})
}

// benchCalls runs n calls (paid: each paid at once through the fake
// backend) by callers goroutines, and returns how long they took.
func benchCalls(b *testing.B, bh *benchHarness, paid bool, callers, n int) time.Duration {
	h, next := bh.h, &bh.next
	last := next.Load() + int64(n) // request ids go on from the last round's
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := time.Now()
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > last {
					return
				}
				id := strconv.FormatInt(i, 10)
				r := req(id, "demo_free", `{"text":"x`+id+`"}`, nil)
				r.Client = "client-" + strconv.Itoa(int(i%64))
				if !paid {
					if _, err := h.v.CallItem(h.ctx, r); err != nil {
						errs <- err
						return
					}
					continue
				}
				r.Name = "demo_echo"
				ch := h.callAsync(r)
				p := <-h.be.last // some caller's payment request: pay it
				h.be.pay(p.Ref)
				if bh.lnd != nil {
					bh.lnd.settled(p.Ref, p.Amount)
				}
				if o := <-ch; o.err != nil {
					errs <- o.err
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	return d
}
