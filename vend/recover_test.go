package vend_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// gatedTools holds every tool call until the gate opens.
type gatedTools struct {
	*fakeTools
	gate    chan struct{}
	entered atomic.Int32
}

func (g *gatedTools) CallTool(ctx context.Context, t vend.Item, args json.RawMessage, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	g.entered.Add(1)
	<-g.gate
	return g.fakeTools.CallTool(ctx, t, args, tok, progress)
}

// TestRecoverFanOutIsBounded: Recover runs the paid calls a crash left
// with a bounded pool of workers, not one goroutine per call.
func TestRecoverFanOutIsBounded(t *testing.T) {
	const calls, bound = 30, 8
	l := tempLedger(t)
	var ids []vend.CallID
	for i := 0; i < calls; i++ {
		c, _ := crashedCall(t, l, fmt.Sprint("c", i), "demo_echo", true, false, false, 1)
		ids = append(ids, c.ID)
	}
	// Recover tells when it finds every worker busy, and how many calls
	// it had handed out by then: with the tools gated, no worker ends,
	// so that is exactly its bound.
	full := make(chan int, 1)
	// Removed after the harness stops (cleanups run last first).
	t.Cleanup(vend.SetRecoverFullForTest(func(started int) {
		select {
		case full <- started:
		default:
		}
	}))
	tools := &gatedTools{fakeTools: &fakeTools{}, gate: make(chan struct{})}
	h := harnessOn(t, l, false, func(c *vend.Config) { c.Tools = tools })
	var open sync.Once
	release := func() { open.Do(func() { close(tools.gate) }) }
	t.Cleanup(release) // before the harness stops: its Run waits for Recover
	select {
	case started := <-full:
		if started != bound {
			t.Fatalf("Recover found its workers busy after handing out %d calls; want %d", started, bound)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Recover never waited for a worker with %d calls to run: %d entered the tool at once", calls, tools.entered.Load())
	}
	if n := tools.entered.Load(); n > bound {
		t.Fatalf("%d calls ran at once; want at most %d", n, bound)
	}
	release()
	for _, id := range ids {
		waitState(t, l, id, vend.CallDelivered)
	}
	if n := h.tools.count("echo") + tools.count("echo"); n != calls {
		t.Fatalf("echo ran %d times, want %d", n, calls)
	}
	verify(t, l)
}

// TestRecoverRefundsWhatItCannotRun: a paid call Recover cannot run as
// recorded (no recorded arguments, a tool no longer offered) is refunded
// with the reason instead of staying paid, to fail the same way at every
// start.
func TestRecoverRefundsWhatItCannotRun(t *testing.T) {
	ctx := context.Background()
	l, err := openLedger(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	gone, _ := crashedCall(t, l, "gone", "demo_gone", true, false, false, 1)
	goneRunning, _ := crashedCall(t, l, "gone-running", "demo_gone", true, false, false, 2)
	bare, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "client-1", RequestID: "bare", Server: "demo",
		Name: "echo", ArgsHash: argsHash(t, "tools/call", "demo_echo", `{"text":"bare"}`), Price: 21_000, Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.RecordPayment(ctx, bare.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
		Ref: strings.Repeat("b", 64), Bolt11: "lnbcrt1", Amount: 21_000, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 21_000}); err != nil {
		t.Fatal(err)
	}
	h := harnessOn(t, l, false, func(c *vend.Config) { c.ToolWait = 50 * time.Millisecond })
	for id, reason := range map[vend.CallID]string{
		gone.ID:        "its tool is no longer offered",
		goneRunning.ID: "its tool is no longer offered",
		bare.ID:        "no arguments were recorded",
	} {
		if c := waitState(t, l, id, vend.CallRefunded); !strings.Contains(c.Reason, reason) {
			t.Errorf("call %d refunded for %q, want %q", id, c.Reason, reason)
		}
	}
	if b, _ := l.Balance(ctx); b.Pending.RefundsOwed != 21_000+21_000+21_000 {
		t.Fatalf("refunds owed %d msat", b.Pending.RefundsOwed)
	}
	if h.tools.count("echo") != 0 {
		t.Fatal("something ran")
	}
	verify(t, l)
}

// TestRecoverFinishesAPreviousRunsCallsStampedAhead: a previous run whose
// clock was ahead (an hour, then stepped back before this start) left a
// paid call: Recover runs it. Telling runs apart by wall-clock time took
// it for this run's own and left it paid.
func TestRecoverFinishesAPreviousRunsCallsStampedAhead(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	ahead, err := openLedger(ctx, path, ledger.Options{Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	paid, _ := crashedCall(t, ahead, "paid", "demo_echo", true, false, false, 1)
	if err := ahead.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := openLedger(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := harnessOn(t, l, false, nil)
	waitState(t, l, paid.ID, vend.CallDelivered)
	if n := h.tools.count("echo"); n != 1 {
		t.Fatalf("echo ran %d times, want 1", n)
	}
	verify(t, l)
}

// recordedLedger is the real ledger, telling each call it records.
type recordedLedger struct {
	*ledger.Ledger
	recorded chan vend.CallID
}

func (l *recordedLedger) RecordCall(ctx context.Context, c vend.NewCall) (vend.Call, bool, error) {
	call, created, err := l.Ledger.RecordCall(ctx, c)
	if err == nil && created {
		l.recorded <- call.ID
	}
	return call, created, err
}

// TestRecoverLeavesThisRunsCallsAlone: a call this run recorded and is
// still serving (here quoted, waiting for its turn to issue its payment
// request) is not a previous run's, even when the ledger's clock stamps it
// an hour back: Recover leaves it to its request. Telling runs apart by
// wall-clock time canceled it.
func TestRecoverLeavesThisRunsCallsAlone(t *testing.T) {
	ctx := context.Background()
	l, err := openLedger(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rl := &recordedLedger{Ledger: l, recorded: make(chan vend.CallID, 1)}
	h := harnessOn(t, l, false, func(c *vend.Config) { c.Ledger = rl })
	vend.SetIssueLineForTest(h.v, 1, 1)
	giveBack, err := vend.TakeIssueTurnForTest(h.v)
	if err != nil {
		t.Fatal(err)
	}
	ch := h.callAsync(req("1", "demo_echo", `{"text":"mine"}`, nil))
	var id vend.CallID
	select {
	case id = <-rl.recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not recorded")
	}
	if err := h.v.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := l.Call(ctx, id); c.State != vend.CallQuoted {
		t.Fatalf("this run's waiting call is %s (%s) after Recover, want quoted", c.State, c.Reason)
	}
	giveBack()
	h.be.pay(h.nextPayment(t).Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatalf("paid: %v", o.err)
	}
	verify(t, l)
}
