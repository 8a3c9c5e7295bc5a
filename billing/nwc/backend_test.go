package nwc_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// events records what a backend reports.
type events struct {
	mu sync.Mutex
	by map[string][]vend.PaymentState
}

func (e *events) report(ev vend.PaymentEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.by == nil {
		e.by = map[string][]vend.PaymentState{}
	}
	e.by[ev.Payment.Ref] = append(e.by[ev.Payment.Ref], ev.Payment.State)
}

func (e *events) count(ref string, st vend.PaymentState) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.by[ref] {
		if s == st {
			n++
		}
	}
	return n
}

func (e *events) wait(t *testing.T, ref string, st vend.PaymentState) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); e.count(ref, st) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("payment %s not reported %s in 60 s", ref, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fixture is a ledger and an NWC backend on one of a wallet's connections,
// running until the test ends.
type fixture struct {
	l   *ledger.Ledger
	b   *nwc.Backend
	c   *nwc.Client
	ev  *events
	n   int
	run func() (stop func())
}

func newFixture(t *testing.T, w *wallet, conn, relay string) *fixture {
	t.Helper()
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c, err := nwc.NewClient(w.uri(t, conn, relay), nwc.ClientConfig{Timeout: 20 * time.Second, ConnectTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	b, err := nwc.New(context.Background(), c, l, nwc.Config{Hold: true, Sweep: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{l: l, b: b, c: c, ev: &events{}}
	f.run = func() func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); b.Run(ctx, f.ev.report) }()
		for deadline := time.Now().Add(30 * time.Second); !b.Available(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the backend did not connect in 30 s")
			}
		}
		var once sync.Once
		stop := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		return stop
	}
	return f
}

func (f *fixture) request(t *testing.T, sats int64, hold bool) (vend.Call, vend.Payment) {
	t.Helper()
	f.n++
	h := sha256.Sum256([]byte(fmt.Sprint("args ", f.n)))
	c, _, err := f.l.RecordCall(context.Background(), vend.NewCall{Transport: "test", Client: "nwc", RequestID: fmt.Sprint(f.n),
		Server: "s", Name: "t", ArgsHash: hex.EncodeToString(h[:]), Price: vend.Msat(sats * 1000)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Memo: "test", Expiry: 10 * time.Minute, Hold: hold})
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func pay(t *testing.T, w *wallet, bolt11 string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := w.stack.Pay(ctx, bolt11); err != nil {
		t.Fatal(err)
	}
}

// TestNIP04Connection: a wallet whose info event offers only NIP-04 is
// spoken to in NIP-04, hold invoices and notifications included.
func TestNIP04Connection(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCNIP04, w.relay.Open)
	f.run()
	if s := f.c.Current(); s == nil || s.Encryption() != nwc.NIP04 {
		t.Fatalf("session %+v", s)
	}
	c, p := f.request(t, 11, true)
	if p.Kind != vend.KindHoldInvoice {
		t.Fatalf("a %s", p.Kind)
	}
	go w.stack.Pay(context.Background(), p.Bolt11)
	f.ev.wait(t, p.Ref, vend.PaymentAccepted)
	if _, err := f.l.StartExecution(context.Background(), c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.SettleHeld(context.Background(), p.Ref); err != nil {
		t.Fatal(err)
	}
	f.ev.wait(t, p.Ref, vend.PaymentSettled)
}

// TestRelayCutWhileSettling: the wallet's relay is cut (the test relay's
// gate) while payments settle, their notifications lost; after the
// reconnect each is looked up and booked exactly once, and a hold
// invoice locked in meanwhile is settled through the wallet.
func TestRelayCutWhileSettling(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCHold, w.relay.Gated)
	f.run()
	_, plain := f.request(t, 7, false)
	c2, hold := f.request(t, 8, true)
	w.relay.Cut()
	for deadline := time.Now().Add(30 * time.Second); f.b.Available(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the backend did not notice the cut")
		}
	}
	if _, err := f.b.Request(context.Background(), vend.PaymentRequest{CallID: c2.ID, Amount: 1000, Expiry: time.Minute}); !errors.Is(err, nwc.ErrUnreachable) {
		t.Fatalf("a request while cut: %v", err)
	}
	pay(t, w, plain.Bolt11)
	paid := make(chan error, 1)
	go func() { _, err := w.stack.Pay(context.Background(), hold.Bolt11); paid <- err }()
	time.Sleep(2 * time.Second) // both settle at the wallet, their notifications sent to nobody
	w.relay.Restore()
	f.ev.wait(t, plain.Ref, vend.PaymentSettled)
	f.ev.wait(t, hold.Ref, vend.PaymentAccepted)
	if _, err := f.l.StartExecution(context.Background(), c2.ID, c2.Binding(), c2.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.SettleHeld(context.Background(), hold.Ref); err != nil {
		t.Fatal(err)
	}
	if err := <-paid; err != nil {
		t.Fatalf("the customer's hold payment: %v", err)
	}
	time.Sleep(time.Second) // late notifications, if any, come now
	for _, ref := range []string{plain.Ref, hold.Ref} {
		if n := f.ev.count(ref, vend.PaymentSettled); n != 1 {
			t.Errorf("%s reported settled %d times", ref, n)
		}
	}
	r, err := f.l.Verify(context.Background())
	if err != nil || !r.OK() {
		t.Fatalf("verify: %+v %v", r, err)
	}
}

// TestReconcile: a payment settled while capvend was down is found by the
// reconciler's list_transactions and booked once; then the books agree.
func TestReconcile(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCHold, w.relay.Open)
	_, p1 := f.request(t, 5, false)
	_, p2 := f.request(t, 6, false)
	stop := f.run()
	pay(t, w, p1.Bolt11)
	f.ev.wait(t, p1.Ref, vend.PaymentSettled)
	stop() // capvend goes down
	pay(t, w, p2.Bolt11)
	rec, err := reconcile.New(reconcile.Config{Store: f.l, Repair: true, NWC: []reconcile.NWC{nwc.NewReconciler(f.c, "")}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := rec.Once(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Differences) != 1 || s.Differences[0].Kind != reconcile.SettledUnbooked || s.Differences[0].Ref != p2.Ref || s.Repaired != 1 {
		t.Fatalf("first run: %+v", s.Differences)
	}
	if got, _ := f.l.Payment(context.Background(), p2.Ref); got.State != vend.PaymentSettled {
		t.Fatalf("payment after the repair: %s", got.State)
	}
	if s, err = rec.Once(context.Background()); err != nil || len(s.Differences) != 0 {
		t.Fatalf("second run: %+v %v", s.Differences, err)
	}
	r, err := f.l.Verify(context.Background())
	if err != nil || !r.OK() {
		t.Fatalf("verify: %+v %v", r, err)
	}
}
