package vend_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// sharedVendor is a Vendor sharing l with other instances (Config.Shared)
// as instance; stop ends its Run (and so releases its leases).
func sharedVendor(t *testing.T, l *ledger.Ledger, instance string, tools *fakeTools) (v *vend.Vendor, stop func()) {
	t.Helper()
	be := &fakeBackend{led: l, last: make(chan vend.Payment, 100), running: make(chan struct{})}
	v, err := vend.New(vend.Config{Ledger: l, Backends: []vend.PaymentBackend{be}, Tools: tools,
		Prices: newBook(t, map[string]pricing.Rule{"echo": {Price: 21_000}}), TTL: time.Minute,
		Shared: vend.SharedConfig{Leases: l, Instance: instance, LeaseTTL: 2 * time.Second, Renew: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return v, stop
}

// waitHolder waits until the lease name is held by want.
func waitHolder(t *testing.T, l *ledger.Ledger, name, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a deadlock guard
	for {
		got, err := l.LeaseHolder(context.Background(), name)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s held by %q (%v), want %q", name, got, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSharedRecoveryRunsOnTheLeaseHolder: two Vendors share a ledger. One
// holds the work lease and recovers the paid call of a dead run; it
// leaves the paid call of a run whose instance is alive (holds its run's
// lease) until that lease ends, then recovers it too. The other instance
// leads (WhileLeading starts its work) only once the first stops, and
// each call ran once.
func TestSharedRecoveryRunsOnTheLeaseHolder(t *testing.T) {
	ctx := context.Background()
	l, err := openLedger(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dead, _ := crashedCall(t, l, "dead", "demo_echo", true, false, false, 1)
	// A paid call of a live instance ("ghost", holding its run's lease).
	alive, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "client-1", RequestID: "alive", Server: "demo",
		Name: "echo", ArgsHash: argsHash(t, "tools/call", "demo_echo", `{"text":"alive"}`), Price: 21_000, Idempotent: true,
		ExposedName: "demo_echo", Arguments: []byte(`{"text":"alive"}`), Run: "ghost-run"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.RecordPayment(ctx, alive.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
		Ref: "ab" + dead.ArgsHash[2:], Bolt11: "lnbcrt1", Amount: 21_000, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 21_000}); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.TakeLease(ctx, "run:ghost-run", "ghost", time.Hour); err != nil || !ok {
		t.Fatalf("ghost's run lease: %v %v", ok, err)
	}

	tools := &fakeTools{}
	a, stopA := sharedVendor(t, l, "A", tools)
	waitHolder(t, l, vend.LeaseWork, "A")
	waitState(t, l, dead.ID, vend.CallDelivered)
	<-a.Recovered()
	b, _ := sharedVendor(t, l, "B", tools)
	bLeads := make(chan struct{}, 100)
	leadCtx, stopLead := context.WithCancel(ctx)
	led := make(chan error, 1)
	go func() {
		led <- b.WhileLeading(leadCtx, func(ctx context.Context) error { bLeads <- struct{}{}; <-ctx.Done(); return nil })
	}()
	defer func() { stopLead(); <-led }()
	if err := a.Recover(ctx); err != nil { // once more, deterministically
		t.Fatal(err)
	}
	if c, _ := l.Call(ctx, alive.ID); c.State != vend.CallPaid {
		t.Fatalf("the live instance's paid call is %s after recovery, want paid (left to it)", c.State)
	}
	if b.Leading() {
		t.Fatal("B leads while A holds the work lease")
	}
	// The ghost dies: its lease ends, and the holder takes its call over.
	if err := l.ReleaseLease(ctx, "run:ghost-run", "ghost"); err != nil {
		t.Fatal(err)
	}
	waitState(t, l, alive.ID, vend.CallDelivered)
	stopA() // releases the work lease: B takes it at its next renewal
	waitHolder(t, l, vend.LeaseWork, "B")
	select {
	case <-bLeads:
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatal("B holds the work lease but its leading work did not start")
	}
	if n := tools.count("echo"); n != 2 {
		t.Fatalf("echo ran %d times, want 2 (each call once)", n)
	}
	verify(t, l)
}

// TestSharedPaymentSeenByAnotherInstance: two instances share a ledger
// and both watch the same LND; the one without the waiting call records
// the hold invoice's lock-in first. It leaves the call to its instance
// (it would otherwise cancel the hold invoice: nobody waits there), and
// the waiting call reads the payment from the ledger, runs once and is
// delivered.
func TestSharedPaymentSeenByAnotherInstance(t *testing.T) {
	ctx := context.Background()
	l, a, b := twoInstances(t, true)
	ch := a.callAsync(req("1", "demo_echo", `{"text":"hi"}`, nil))
	p := a.nextPayment(t)
	b.be.pay(p.Ref) // B's watcher records the lock-in and reports it to B
	if o := result(t, ch); o.err != nil {
		t.Fatalf("the call on A: %v", o.err)
	}
	if n := a.tools.count("echo") + b.tools.count("echo"); n != 1 {
		t.Fatalf("echo ran %d times, want 1", n)
	}
	if c := waitState(t, l, p.CallID, vend.CallDelivered); c.State != vend.CallDelivered {
		t.Fatalf("call %s", c.State)
	}
	if got, _ := l.Payment(ctx, p.Ref); got.State != vend.PaymentSettled {
		t.Fatalf("hold invoice %s, want settled", got.State)
	}
	verify(t, l)
}

// TestSharedRateLimitCountsAcrossInstances: with the rate limit counted in
// the shared ledger, a client's calls on two instances add up: the third
// call in a minute of a two-a-minute limit is refused, whichever instance
// gets it.
func TestSharedRateLimitCountsAcrossInstances(t *testing.T) {
	ctx := context.Background()
	l, err := openLedger(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	shared := func(name string) func(*vend.Config) {
		return func(c *vend.Config) {
			c.RequestsPerMinute, c.MaxUnpaidPerClient = 2, 10
			c.Shared = vend.SharedConfig{Leases: l, Instance: name, Rates: l}
		}
	}
	a := harnessOn(t, l, false, shared("A"))
	b := harnessOn(t, l, false, shared("B"))
	ch1 := a.callAsync(from("1", "pubkey-1", "", nil))
	p1 := a.nextPayment(t)
	ch2 := b.callAsync(from("2", "pubkey-1", "", nil))
	p2 := b.nextPayment(t)
	if o := result(t, a.callAsync(from("3", "pubkey-1", "", nil))); !errors.Is(o.err, vend.ErrLimit) {
		t.Fatalf("a third call a minute over two instances: %v", o.err)
	}
	a.be.pay(p1.Ref)
	b.be.pay(p2.Ref)
	for _, ch := range []<-chan outcome{ch1, ch2} {
		if o := result(t, ch); o.err != nil {
			t.Fatal(o.err)
		}
	}
	verify(t, l)
}

// TestSharedPaidAfterClientLeftOnAnotherInstance: the client of a call on
// A leaves before paying; it pays anyway and B's watcher records the
// payment first (each instance watches the same LND), so A's backend
// reports nothing. A still takes the payment on: a plain invoice's call
// runs once (its answer kept for the replay), and a locked-in hold
// invoice is canceled (the money goes back), without waiting for A's
// next start or the invoice's expiry.
func TestSharedPaidAfterClientLeftOnAnotherInstance(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(map[bool]string{false: "invoice", true: "hold"}[hold], func(t *testing.T) {
			ctx := context.Background()
			l, a, b := twoInstances(t, hold)
			cctx, leave := context.WithCancel(ctx)
			left := make(chan error, 1)
			go func() {
				_, err := a.v.CallItem(cctx, req("1", "demo_echo", `{"text":"later"}`, nil))
				left <- err
			}()
			p := a.nextPayment(t)
			leave()
			if err := <-left; !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			b.be.pay(p.Ref) // B's watcher records it and reports it to B only
			if !hold {
				waitState(t, l, p.CallID, vend.CallDelivered)
				res, err := a.v.CallItem(ctx, req("1", "demo_echo", `{"text":"later"}`, nil))
				if err != nil || !strings.Contains(string(res.Body), "echo:later") {
					t.Fatalf("the replay on A: %s %v", res.Body, err)
				}
			} else {
				waitState(t, l, p.CallID, vend.CallRefunded)
				if got, _ := l.Payment(ctx, p.Ref); got.State != vend.PaymentCanceled {
					t.Fatalf("hold invoice %s, want canceled", got.State)
				}
			}
			want := map[bool]int32{false: 1, true: 0}[hold]
			if n := a.tools.count("echo") + b.tools.count("echo"); n != want {
				t.Fatalf("echo ran %d times, want %d", n, want)
			}
			verify(t, l)
		})
	}
}

// twoInstances runs two Vendors, A and B, sharing one ledger (leases, a
// fast ledger poll), each with its own payment backend (hold invoices if
// hold): two instances that watch the same LND.
func twoInstances(t *testing.T, hold bool) (l *ledger.Ledger, a, b *harness) {
	t.Helper()
	l = tempLedger(t)
	shared := func(name string) func(*vend.Config) {
		return func(c *vend.Config) {
			c.Shared = vend.SharedConfig{Leases: l, Instance: name, Poll: 20 * time.Millisecond}
		}
	}
	return l, harnessOn(t, l, hold, shared("A")), harnessOn(t, l, hold, shared("B"))
}

// TestUnpaidLimitsAcrossInstances: with Shared.Unpaid, a client's open
// unpaid payment requests on every instance count toward
// MaxUnpaidPerClient (a client at its limit on A and B together is
// refused on B, and nothing is written for it), and MaxUnpaidTotal counts
// every instance's: an instance whose new quote finds the total reached
// withdraws its own oldest request of its busiest client.
func TestUnpaidLimitsAcrossInstances(t *testing.T) {
	l := tempLedger(t)
	shared := func(name string) func(*vend.Config) {
		return func(c *vend.Config) {
			c.MaxUnpaidPerClient, c.MaxUnpaidTotal = 2, 3
			c.Shared = vend.SharedConfig{Leases: l, Instance: name, Poll: 20 * time.Millisecond, Unpaid: l}
		}
	}
	a, b := harnessOn(t, l, false, shared("A")), harnessOn(t, l, false, shared("B"))
	ctx := context.Background()
	gated := func(h *harness, id, client string) (vend.Payment, error) { // an explicit-gating quote: answered at once
		t.Helper()
		r := from(id, client, "", nil)
		r.Explicit = true
		var pr *vend.PaymentRequiredError
		_, err := h.v.CallItem(ctx, r)
		if !errors.As(err, &pr) {
			return vend.Payment{}, err
		}
		return <-h.be.last, nil
	}
	if _, err := gated(a, "s1", "spammer"); err != nil {
		t.Fatal(err)
	}
	s2, err := gated(b, "s2", "spammer")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gated(b, "s3", "spammer"); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("the client's third unpaid quote, its second on B: %v, want ErrLimit", err)
	}
	if _, err := l.CallByRequest(ctx, "test", "spammer", "s3"); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("a refused quote was written: %v", err)
	}
	// The total (3) is reached with a third client's quote on A; B's next
	// new customer gets a quote, and B withdraws its own oldest request
	// of its busiest client: s2.
	if _, err := gated(a, "h1", "honest-old"); err != nil {
		t.Fatal(err)
	}
	if _, err := gated(b, "h2", "honest-new"); err != nil {
		t.Fatalf("a new customer when the shared total is reached: %v", err)
	}
	waitState(t, l, s2.CallID, vend.CallCanceled)
	verify(t, l)
}
