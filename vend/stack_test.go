package vend_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/racesupp"
	"github.com/capvend/capvend/vend"
)

// TestWaitingCallsKeepSmallStacks: a call waiting for its payment parks on
// a stack the runtime shrinks to 8 KB: the frames from its caller down to
// the select in waitPaid use well under a quarter of 16 KB. A frame grown
// on that path (one wider select, a helper inlined into the loop) doubles
// the stack of every waiting call: 80 MB more for 10,000 of them
// (BenchmarkPendingQuotesRSS, where it happened once).
func TestWaitingCallsKeepSmallStacks(t *testing.T) {
	const n = 200
	h := newHarness(t, false, func(c *vend.Config) {
		c.MaxUnpaidPerClient, c.MaxUnpaidTotal, c.TTL = n, n, time.Hour
	})
	h.be.last = make(chan vend.Payment, n)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	stacks := func() uint64 {
		for range 3 {
			runtime.GC() // each cycle may halve the stacks of waiting goroutines
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.StackInuse
	}
	before := stacks()
	for i := range n { // one at a time: the line to issue them is bounded
		h.calls.Add(1)
		r := req(fmt.Sprint(i), "demo_echo", `{"text":"`+strconv.Itoa(i)+`"}`, nil)
		go func() {
			defer h.calls.Done()
			h.v.CallItem(ctx, r)
		}()
		h.nextPayment(t)
	}
	per := (int64(stacks()) - int64(before)) / n
	want := int64(8 << 10)
	if racesupp.Enabled {
		want = 16 << 10 // the race detector's instrumentation widens every frame
	}
	t.Logf("%d bytes of stack per waiting call", per)
	if per > want*3/2 {
		t.Fatalf("%d bytes of stack per waiting call, want %d", per, want)
	}
}
