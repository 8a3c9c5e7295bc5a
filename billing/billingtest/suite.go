// Package billingtest is the conformance suite every payment backend passes
// against the real regtest stack: one suite, run over each backend (as
// Litestream runs one suite over every replica client).
package billingtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// Harness is what the suite needs to know of a backend.
type Harness struct {
	// Open makes a backend recording into l that reaches its server at
	// addr (a host:port; the suite puts a Proxy in front of Server).
	// Called again with the same ledger it is a restart of capvend: any
	// state the backend keeps besides the ledger (a Cashu wallet) must be
	// found again, so Open derives it from dir, which is the same for
	// every call within one subtest.
	Open func(t *testing.T, l *ledger.Ledger, addr, dir string) vend.PaymentBackend
	// Server is the real server's host:port (LND gRPC, or the mint).
	Server string
	// Pay pays bolt11 from the customer node and returns when the payment
	// succeeded or failed. A hold invoice's payment returns only once
	// it is settled or canceled.
	Pay func(ctx context.Context, bolt11 string) error
	// CustomerBalance is the customer's spendable channel balance in msat
	// (hold invoice tests check the money came back).
	CustomerBalance func(ctx context.Context) (int64, error)
	// Expiry is the shortest request expiry the backend honours; the
	// expiry test waits for it.
	Expiry time.Duration
	// Done returns once the running backend b (recording into l) will
	// report nothing more on its own about the settled payments refs: for
	// LND, once its settlement stream has passed theirs; for a Cashu
	// mint, once a check of each began after the call and ended, or
	// nothing watches it any more. The suite's "reported settled once"
	// checks come after it, so a late duplicate is seen, not missed by a
	// wait that was too short.
	Done func(t *testing.T, l *ledger.Ledger, b vend.PaymentBackend, refs ...string)
}

// Recorder collects what a backend reports.
type Recorder struct {
	mu     sync.Mutex
	events map[string][]vend.PaymentEvent
	notify chan struct{}
}

func newRecorder() *Recorder {
	return &Recorder{events: map[string][]vend.PaymentEvent{}, notify: make(chan struct{}, 1)}
}

func (r *Recorder) report(e vend.PaymentEvent) {
	r.mu.Lock()
	r.events[e.Payment.Ref] = append(r.events[e.Payment.Ref], e)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// count returns how many events of state the backend reported for ref.
func (r *Recorder) count(ref string, state vend.PaymentState) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events[ref] {
		if e.Payment.State == state {
			n++
		}
	}
	return n
}

// wait blocks until every ref has an event of state, or the timeout.
func (r *Recorder) wait(t *testing.T, timeout time.Duration, state vend.PaymentState, refs ...string) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		missing := 0
		for _, ref := range refs {
			if r.count(ref, state) == 0 {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		select {
		case <-r.notify:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%d of %d payments not reported %s within %s", missing, len(refs), state, timeout)
		}
	}
}

// running is a backend whose Run goroutine the suite controls.
type running struct {
	vend.PaymentBackend
	cancel  context.CancelFunc
	done    chan error
	once    sync.Once
	stopped atomic.Bool
}

func start(t *testing.T, b vend.PaymentBackend, rec *Recorder) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{PaymentBackend: b, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- b.Run(ctx, rec.report) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends Run and waits for it: capvend going down. Idempotent.
func (r *running) stop() {
	r.once.Do(func() {
		r.stopped.Store(true)
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			panic("backend Run did not return within 30 s of cancel")
		}
	})
}

type env struct {
	h      Harness
	l      *ledger.Ledger
	proxy  *Proxy
	dir    string
	rec    *Recorder
	b      *running // the backend opened last
	calls  int
	callMu sync.Mutex
}

func newEnv(t *testing.T, h Harness) *env {
	dir := t.TempDir()
	l, err := ledger.Open(context.Background(), filepath.Join(dir, "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &env{h: h, l: l, proxy: NewProxy(t, h.Server), dir: dir, rec: newRecorder()}
}

func (e *env) open(t *testing.T) *running {
	e.b = start(t, e.h.Open(t, e.l, e.proxy.Addr(), e.dir), e.rec)
	return e.b
}

// call records a priced call to pay for.
func (e *env) call(t *testing.T, sats int64) vend.Call {
	t.Helper()
	e.callMu.Lock()
	e.calls++
	n := e.calls
	e.callMu.Unlock()
	h := sha256.Sum256([]byte(fmt.Sprint("args ", n)))
	c, _, err := e.l.RecordCall(context.Background(), vend.NewCall{
		Transport: "test", Client: "conformance", RequestID: fmt.Sprint("req-", n), Server: "suite", Name: "paid_echo",
		ArgsHash: hex.EncodeToString(h[:]), Price: vend.Msat(sats * 1000), Idempotent: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) request(t *testing.T, b vend.PaymentBackend, c vend.Call, expiry time.Duration, hold bool) vend.Payment {
	t.Helper()
	p, err := b.Request(context.Background(), vend.PaymentRequest{
		CallID: c.ID, Amount: c.Price, Memo: "conformance " + fmt.Sprint(c.ID), Expiry: expiry, Hold: hold,
	})
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if p.Bolt11 == "" || p.Ref == "" || p.Amount < c.Price || !p.ExpiresAt.After(time.Now()) || p.State != vend.PaymentOpen {
		t.Fatalf("request returned %+v", p)
	}
	got, err := e.l.Call(context.Background(), c.ID)
	if err != nil || got.State != vend.CallAwaitingPayment {
		t.Fatalf("call after request: %+v %v", got, err)
	}
	return p
}

func (e *env) pay(t *testing.T, bolt11 string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.h.Pay(ctx, bolt11); err != nil {
		t.Fatalf("customer pays: %v", err)
	}
}

func (e *env) verify(t *testing.T) {
	t.Helper()
	r, err := e.l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		var b strings.Builder
		r.WriteTo(&b)
		t.Fatalf("ledger verify:\n%s", b.String())
	}
}

// settledOnce checks that each ref was reported settled exactly once and
// booked exactly once, after the backend is done with them (Harness.Done)
// if it still runs.
func (e *env) settledOnce(t *testing.T, refs ...string) {
	t.Helper()
	if e.b != nil && !e.b.stopped.Load() {
		e.h.Done(t, e.l, e.b.PaymentBackend, refs...)
	}
	for _, ref := range refs {
		if n := e.rec.count(ref, vend.PaymentSettled); n != 1 {
			t.Errorf("payment %s reported settled %d times", ref, n)
		}
		p, err := e.l.Payment(context.Background(), ref)
		if err != nil || p.State != vend.PaymentSettled {
			t.Errorf("payment %s in ledger: %+v %v", ref, p, err)
		}
	}
	e.verify(t)
}

// Run runs the conformance suite over the backend h describes.
//
// HoldSettleAndCancel measures how much the customer's balance moved, so
// it runs first and alone. The other tests then run in parallel: each has
// its own ledger, proxy, recorder, wallet directory and backend, and
// asserts only on what it created; they share the server and the
// customer's node, which take concurrent payments. Run returns once all
// have finished. A caller running Run in parallel with other payers from
// the customer (the Cashu variants) must have a backend without hold
// invoices, whose hold test skips.
func Run(t *testing.T, h Harness) {
	if h.Done == nil {
		t.Fatal("billingtest: the harness has no Done")
	}
	t.Run("HoldSettleAndCancel", func(t *testing.T) { testHold(t, h) })
	for _, sub := range []struct {
		name string
		test func(*testing.T, Harness)
	}{
		{"PaySettlesOnce", testPaySettlesOnce},
		{"Expiry", testExpiry},
		{"Cancel", testCancel},
		{"ConcurrentOutOfOrder", testConcurrent},
		{"RestartFindsSettlements", testRestart},
		{"ConnectionDropped", testConnectionDropped},
		{"CanceledWalletInvoicePaidLate", testWalletInvoicePaidLate},
	} {
		t.Run(sub.name, func(t *testing.T) {
			t.Parallel()
			sub.test(t, h)
		})
	}
}

func testPaySettlesOnce(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	c := e.call(t, 21)
	p := e.request(t, b, c, 10*time.Minute, false)
	e.pay(t, p.Bolt11)
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, p.Ref)
	e.settledOnce(t, p.Ref)
	got, _ := e.l.Call(context.Background(), c.ID)
	if got.State != vend.CallPaid {
		t.Fatalf("call is %s after settlement", got.State)
	}
	// Paying the same request again is refused by the backend's server
	// (LND: invoice already paid; mint: quote already paid) and books
	// nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Pay(ctx, p.Bolt11); err == nil {
		t.Error("the same request was paid twice")
	}
	e.settledOnce(t, p.Ref)
}

func testExpiry(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	c := e.call(t, 5)
	p := e.request(t, b, c, h.Expiry, false)
	e.rec.wait(t, h.Expiry+60*time.Second, vend.PaymentExpired, p.Ref)
	got, _ := e.l.Payment(context.Background(), p.Ref)
	if got.State != vend.PaymentExpired {
		t.Fatalf("payment is %s", got.State)
	}
	if cl, _ := e.l.Call(context.Background(), c.ID); cl.State != vend.CallExpired {
		t.Fatalf("call is %s", cl.State)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := h.Pay(ctx, p.Bolt11)
	if !vend.LatePayable(p.Kind) {
		if err == nil {
			t.Fatal("an expired invoice was paid")
		}
		e.verify(t)
		return
	}
	// A mint quote stays payable at the mint: the late money is found,
	// recorded, and owed back; the call never runs.
	if err != nil {
		t.Fatalf("paying the late mint quote: %v", err)
	}
	e.rec.wait(t, 60*time.Second, vend.PaymentSettled, p.Ref)
	e.settledOnce(t, p.Ref)
	if cl, _ := e.l.Call(context.Background(), c.ID); cl.State != vend.CallExpired {
		t.Fatalf("late-paid call is %s", cl.State)
	}
	bal, _ := e.l.Balance(context.Background())
	if bal.Pending.RefundsOwed != p.Amount {
		t.Fatalf("refunds owed %d, want %d", bal.Pending.RefundsOwed, p.Amount)
	}
}

func testCancel(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	c := e.call(t, 7)
	p := e.request(t, b, c, 10*time.Minute, false)
	if err := b.Cancel(context.Background(), p.Ref); err != nil {
		t.Fatal(err)
	}
	if err := b.Cancel(context.Background(), p.Ref); err != nil {
		t.Fatalf("second cancel: %v", err)
	}
	got, _ := e.l.Payment(context.Background(), p.Ref)
	if got.State != vend.PaymentCanceled {
		t.Fatalf("payment is %s", got.State)
	}
	if cl, _ := e.l.Call(context.Background(), c.ID); cl.State != vend.CallCanceled {
		t.Fatalf("call is %s", cl.State)
	}
	if !vend.LatePayable(p.Kind) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Pay(ctx, p.Bolt11); err == nil {
			t.Fatal("a canceled invoice was paid")
		}
	}
	// Canceling a settled payment is refused.
	c2 := e.call(t, 3)
	p2 := e.request(t, b, c2, 10*time.Minute, false)
	e.pay(t, p2.Bolt11)
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, p2.Ref)
	if err := b.Cancel(context.Background(), p2.Ref); err == nil {
		t.Fatal("a settled payment was canceled")
	}
	e.settledOnce(t, p2.Ref)
}

func testConcurrent(t *testing.T, h Harness) {
	const n = 100
	e := newEnv(t, h)
	b := e.open(t)
	payments := make([]vend.Payment, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := e.call(t, int64(1+i%7))
			p, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Memo: "concurrent", Expiry: 10 * time.Minute})
			if err != nil {
				errs <- err
				return
			}
			payments[i] = p
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent request: %v", err)
	}
	order := rand.Perm(n)
	work := make(chan int)
	payErrs := make(chan error, n)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				if err := h.Pay(ctx, payments[i].Bolt11); err != nil {
					payErrs <- fmt.Errorf("payment %d: %w", i, err)
				}
				cancel()
			}
		}()
	}
	for _, i := range order {
		work <- i
	}
	close(work)
	wg.Wait()
	close(payErrs)
	for err := range payErrs {
		t.Fatal(err)
	}
	refs := make([]string, n)
	for i, p := range payments {
		refs[i] = p.Ref
	}
	e.rec.wait(t, 90*time.Second, vend.PaymentSettled, refs...)
	e.settledOnce(t, refs...)
	bal, _ := e.l.Balance(context.Background())
	var want vend.Msat
	for _, p := range payments {
		want += p.Amount
	}
	if len(bal.Tools) != 1 || bal.Tools[0].Revenue != want || bal.Tools[0].Calls != n {
		t.Fatalf("revenue %+v, want %d over %d calls", bal.Tools, want, n)
	}
}

func testRestart(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	var ps []vend.Payment
	for i := 0; i < 4; i++ {
		ps = append(ps, e.request(t, b, e.call(t, int64(2+i)), 10*time.Minute, false))
	}
	e.pay(t, ps[0].Bolt11)
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, ps[0].Ref)
	b.stop() // capvend goes down
	e.pay(t, ps[1].Bolt11)
	e.pay(t, ps[2].Bolt11)
	b2 := e.open(t) // and comes back
	e.rec.wait(t, 60*time.Second, vend.PaymentSettled, ps[1].Ref, ps[2].Ref)
	e.pay(t, ps[3].Bolt11)
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, ps[3].Ref)
	b2.stop()
	e.settledOnce(t, ps[0].Ref, ps[1].Ref, ps[2].Ref, ps[3].Ref)
}

func testConnectionDropped(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	var ps []vend.Payment
	for i := 0; i < 3; i++ {
		ps = append(ps, e.request(t, b, e.call(t, int64(3+i)), 10*time.Minute, false))
	}
	e.proxy.Cut() // mid-stream: the backend's connection breaks
	e.pay(t, ps[0].Bolt11)
	e.pay(t, ps[1].Bolt11)
	e.proxy.WaitRefused(t, 2) // the backend tried to reconnect, and failed
	e.proxy.Restore()
	e.rec.wait(t, 60*time.Second, vend.PaymentSettled, ps[0].Ref, ps[1].Ref)
	e.pay(t, ps[2].Bolt11)
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, ps[2].Ref)
	e.settledOnce(t, ps[0].Ref, ps[1].Ref, ps[2].Ref)
}

// testWalletInvoicePaidLate: a wallet's plain invoice (NWC) cannot be
// withdrawn, so capvend's cancel does not stop its payment: the money that
// arrives is booked once, owed back, and the call never runs. Other
// backends' invoices are withdrawn (Cancel) or are not plain invoices.
func testWalletInvoicePaidLate(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	c := e.call(t, 9)
	p := e.request(t, b, c, 10*time.Minute, false)
	if p.Kind != vend.KindWalletInvoice {
		t.Skipf("the backend issues %s, not wallet invoices", p.Kind)
	}
	if err := b.Cancel(context.Background(), p.Ref); err != nil {
		t.Fatal(err)
	}
	e.pay(t, p.Bolt11)
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, p.Ref)
	e.settledOnce(t, p.Ref)
	if cl, _ := e.l.Call(context.Background(), c.ID); cl.State != vend.CallCanceled {
		t.Fatalf("late-paid call is %s", cl.State)
	}
	bal, _ := e.l.Balance(context.Background())
	if bal.Pending.RefundsOwed != p.Amount {
		t.Fatalf("refunds owed %d, want %d", bal.Pending.RefundsOwed, p.Amount)
	}
}

func testHold(t *testing.T, h Harness) {
	e := newEnv(t, h)
	b := e.open(t)
	hs, ok := b.PaymentBackend.(vend.HoldSettler)
	if !ok || !hs.CanHold() {
		t.Skip("the backend issues no hold invoices")
	}
	ctx := context.Background()
	before, err := h.CustomerBalance(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Success: the HTLC is locked in, the call may run, then settles.
	c := e.call(t, 30)
	p := e.request(t, b, c, 10*time.Minute, true)
	if p.Kind != vend.KindHoldInvoice {
		t.Fatalf("hold request gave a %s", p.Kind)
	}
	paid := make(chan error, 1)
	go func() { paid <- h.Pay(ctx, p.Bolt11) }()
	e.rec.wait(t, 30*time.Second, vend.PaymentAccepted, p.Ref)
	if cl, _ := e.l.Call(ctx, c.ID); cl.State != vend.CallPaid {
		t.Fatalf("call is %s once the HTLC is locked in", cl.State)
	}
	if _, err := e.l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if _, err := hs.SettleHeld(ctx, p.Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := hs.SettleHeld(ctx, p.Ref); err != nil {
		t.Fatalf("second settle: %v", err)
	}
	if err := waitErr(paid, 30*time.Second); err != nil {
		t.Fatalf("customer's payment of the settled hold invoice: %v", err)
	}
	if err := e.l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	e.rec.wait(t, 30*time.Second, vend.PaymentSettled, p.Ref)
	e.settledOnce(t, p.Ref)

	// Failure: the tool fails, the hold invoice is canceled, the money
	// returns to the customer by Lightning itself.
	c2 := e.call(t, 40)
	p2 := e.request(t, b, c2, 10*time.Minute, true)
	go func() { paid <- h.Pay(ctx, p2.Bolt11) }()
	e.rec.wait(t, 30*time.Second, vend.PaymentAccepted, p2.Ref)
	if _, err := e.l.StartExecution(ctx, c2.ID, c2.Binding(), c2.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := e.l.Fail(ctx, c2.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "tool failed"); err != nil {
		t.Fatal(err)
	}
	if err := b.Cancel(ctx, p2.Ref); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(paid, 30*time.Second); err == nil {
		t.Fatal("the customer's payment of a canceled hold invoice succeeded")
	}
	if err := e.l.Refund(ctx, c2.ID, "hold invoice canceled"); err != nil {
		t.Fatal(err)
	}
	after, err := h.CustomerBalance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Only the settled 30 sat left the customer (a direct channel: no fee).
	if before-after != 30_000 {
		t.Fatalf("customer balance moved by %d msat, want 30000 (the canceled 40 sat came back)", before-after)
	}
	e.verify(t)
}

func waitErr(ch <-chan error, d time.Duration) error {
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		return errors.New("timed out")
	}
}
