package vend_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// timedTools records when each call reached the upstream.
type timedTools struct {
	fakeTools
	mu      sync.Mutex
	reached map[string]time.Time // by the "text" argument
}

func (f *timedTools) CallTool(ctx context.Context, t vend.Item, args json.RawMessage, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	now := time.Now()
	var a struct{ Text string }
	json.Unmarshal(args, &a)
	f.mu.Lock()
	f.reached[a.Text] = now
	f.mu.Unlock()
	return f.fakeTools.CallTool(ctx, t, args, tok, progress)
}

// BenchmarkSettleToExecute measures the latency from a backend reporting a
// settlement to the call reaching its upstream: routing the event, the
// ledger's claim (one durable transaction) and the notification. Target:
// p50 <= 20 ms.
func BenchmarkSettleToExecute(b *testing.B) {
	tools := &timedTools{reached: map[string]time.Time{}}
	h := newHarness(b, false, func(c *vend.Config) { c.Tools = tools })
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		text := "bench-" + strconv.Itoa(i)
		ch := h.callAsync(req(fmt.Sprint(i), "demo_echo", `{"text":"`+text+`"}`, nil))
		p := <-h.be.last
		settled := time.Now()
		h.be.pay(p.Ref)
		o := <-ch
		if o.err != nil {
			b.Fatal(o.err)
		}
		tools.mu.Lock()
		lat = append(lat, tools.reached[text].Sub(settled))
		tools.mu.Unlock()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkPendingQuotesRSS holds 10,000 calls waiting for payment (each
// with its goroutine, waiter and ledger rows) and reports the process's
// resident memory. Target: <= 150 MB.
func BenchmarkPendingQuotesRSS(b *testing.B) {
	const pending = 10_000
	for i := 0; i < b.N; i++ {
		h := newHarness(b, false, func(c *vend.Config) {
			c.MaxUnpaidPerClient, c.MaxUnpaidTotal = pending, pending
			// None may expire while the rest are issued, however slow
			// the machine: they are counted once all are waiting.
			c.TTL = time.Hour
		})
		// What the harness itself would hold per call is not capvend's:
		// the payments reported to it are read at once, and the payer's
		// preimages (LND's) are not kept.
		h.be.last, h.be.payerless = make(chan vend.Payment, 16), true
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		// At most issuing requests wait for their payment request at once:
		// the line to issue them is bounded (a client holds one place
		// once it is a quarter full), and all 10,000 at once would be
		// refused as a flood, never to be quoted.
		const issuing = 16
		line := make(chan struct{}, issuing)
		go func() {
			for n := 0; n < pending && ctx.Err() == nil; n++ {
				line <- struct{}{}
				wg.Add(1)
				r := req(fmt.Sprint(n), "demo_echo", `{"text":"`+strconv.Itoa(n)+`"}`, nil)
				go func() {
					defer wg.Done()
					if _, err := h.v.CallItem(ctx, r); err != nil && ctx.Err() == nil {
						b.Errorf("call %s: %v", r.RequestID, err)
					}
				}()
			}
		}()
		for n := 0; n < pending; n++ {
			<-h.be.last
			<-line
		}
		for range 3 {
			runtime.GC() // each cycle may halve the stacks of waiting goroutines
		}
		debug.FreeOSMemory() // what the scavenger would return over time
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(rssKB())/1024, "RSS-MB")
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MB")
		b.ReportMetric(float64(ms.StackInuse)/(1<<20), "stacks-MB")
		bal, _ := h.l.Balance(context.Background())
		if bal.Pending.AwaitingCalls != pending {
			b.Fatalf("%d calls awaiting payment, want %d", bal.Pending.AwaitingCalls, pending)
		}
		cancel()
		wg.Wait()
	}
}

func rssKB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkCreditCall measures a priced call paid from prepaid credit on
// the real ledger with a fake upstream, from 8 goroutines: what a credit
// call costs capvend itself (the regtest benchmark is
// internal/cli BenchmarkCreditCalls).
func BenchmarkCreditCall(b *testing.B) {
	h := newHarness(b, false, withCredit)
	info := h.buyCredit(b, req("topup", "", "", nil), 1_000_000)
	var seq atomic.Int64
	b.SetParallelism(4) // 8 clients on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			r := req(fmt.Sprint("c", i), "demo_echo", fmt.Sprintf(`{"text":"%d"}`, i), nil)
			r.Credit = info.Token
			if res, err := h.v.CallItem(context.Background(), r); err != nil || res.IsError {
				b.Fatalf("%s %v", res.Body, err)
			}
		}
	})
}
