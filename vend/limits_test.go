package vend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// from is a request of client from source (Source-else-Client counts).
func from(id, client, source string, n *notes) vend.CallRequest {
	r := req(id, "demo_echo", `{"text":"`+id+`"}`, n)
	r.Client, r.Source = client, source
	return r
}

func TestLimitsCountBySourceElseClient(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.MaxUnpaidPerClient = 1; c.RequestsPerMinute = 2 })
	// Two sessions from one address are one client for the limits.
	ch := h.callAsync(from("1", "session-a", "ip:10.0.0.1", nil))
	p := h.nextPayment(t)
	if _, err := h.v.CallItem(context.Background(), from("2", "session-b", "ip:10.0.0.1", nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("a second session from the same address got a second unpaid quote: %v", err)
	}
	// The rate limit too: 2 a minute per address, whatever the session.
	if _, err := h.v.CallItem(context.Background(), from("3", "session-c", "ip:10.0.0.1", nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("a third call a minute from the same address: %v", err)
	}
	// Without a Source, the client (a Nostr pubkey) counts.
	ch2 := h.callAsync(from("4", "pubkey-1", "", nil))
	p2 := h.nextPayment(t)
	if _, err := h.v.CallItem(context.Background(), from("5", "pubkey-1", "", nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("a second unpaid quote of one pubkey: %v", err)
	}
	h.be.pay(p.Ref)
	h.be.pay(p2.Ref)
	result(t, ch)
	result(t, ch2)
	verify(t, h.l)
}

// TestOldestUnpaidIsShed: when every unpaid slot is taken, the oldest
// unpaid quote of the client holding the most is withdrawn (its invoice
// canceled, its call ended, its client told) so a new customer still
// gets a quote.
func TestOldestUnpaidIsShed(t *testing.T) {
	h := newHarness(t, true, func(c *vend.Config) { c.MaxUnpaidPerClient = 2; c.MaxUnpaidTotal = 3 })
	na := &notes{}
	a1 := h.callAsync(from("a1", "spammer", "", na))
	pa1 := h.nextPayment(t)
	a2 := h.callAsync(from("a2", "spammer", "", nil))
	pa2 := h.nextPayment(t)
	b1 := h.callAsync(from("b1", "honest-old", "", nil))
	pb1 := h.nextPayment(t)
	// Full. A new customer comes.
	c1 := h.callAsync(from("c1", "honest-new", "", nil))
	pc1 := h.nextPayment(t)
	o := result(t, a1)
	if !errors.Is(o.err, vend.ErrLimit) {
		t.Fatalf("the shed call answered %v, want ErrLimit", o.err)
	}
	if m := na.methods(); countOf(m, vend.NotifyPaymentRejected) != 1 {
		t.Fatalf("the shed call's client got %v, want payment_rejected", m)
	}
	if p, _ := h.l.Payment(context.Background(), pa1.Ref); p.State != vend.PaymentCanceled {
		t.Fatalf("the shed invoice is %s, want canceled", p.State)
	}
	if c, _ := h.l.Call(context.Background(), pa1.CallID); c.State != vend.CallCanceled {
		t.Fatalf("the shed call is %s, want canceled", c.State)
	}
	// The others are still payable.
	for _, p := range []vend.Payment{pa2, pb1, pc1} {
		h.be.pay(p.Ref)
	}
	for _, ch := range []<-chan outcome{a2, b1, c1} {
		if o := result(t, ch); o.err != nil {
			t.Fatal(o.err)
		}
	}
	if h.tools.count("echo") != 3 {
		t.Fatalf("ran %d", h.tools.count("echo"))
	}
	verify(t, h.l)
}

// TestUnpaidCountsTheOpenInvoiceNotTheWaiter: a client that leaves (drops
// its connection) does not free its slot while its invoice stays payable,
// and explicit-gating quotes count too: otherwise connect-and-drop makes
// unbounded open invoices.
func TestUnpaidCountsTheOpenInvoiceNotTheWaiter(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.MaxUnpaidPerClient = 1 })
	ctx, leave := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := h.v.CallItem(ctx, from("1", "dropper", "", nil)); done <- err }()
	p := h.nextPayment(t)
	leave()
	<-done
	if _, err := h.v.CallItem(context.Background(), from("2", "dropper", "", nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("after leaving, the client got another unpaid quote: %v", err)
	}
	h.be.expire(p.Ref) // the invoice ends: the slot is free again
	ch := h.callAsync(from("3", "dropper", "", nil))
	p3 := h.nextPayment(t)
	h.be.pay(p3.Ref)
	result(t, ch)

	g := from("4", "gater", "", nil)
	g.Explicit = true
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), g); !errors.As(err, &pr) {
		t.Fatalf("explicit gating: %v", err)
	}
	<-h.be.last
	g2 := from("5", "gater", "", nil)
	g2.Explicit = true
	g2.Arguments = []byte(`{"text":"other"}`)
	if _, err := h.v.CallItem(context.Background(), g2); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("a second unpaid explicit-gating quote: %v", err)
	}
	verify(t, h.l)
}

// TestProofOfWork: a request that would get a free call or an unpaid quote
// needs the work its front requires; one paying with a token does not,
// and one without enough work is priced instead of getting a free use.
func TestProofOfWork(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) {
		c.Prices = newBook(t, map[string]pricing.Rule{"echo": {Price: 21_000, FreePerDay: 1}})
	})
	weak := func(id string) vend.CallRequest {
		r := from(id, "pubkey-1", "", nil)
		r.Work, r.WorkRequired = 3, 8
		return r
	}
	var we *vend.WorkRequiredError
	if _, err := h.v.CallItem(context.Background(), weak("1")); !errors.As(err, &we) || we.Required != 8 || we.Work != 3 {
		t.Fatalf("a weak request for a free use: %v", err)
	}
	if h.tools.count("echo") != 0 {
		t.Fatal("it ran")
	}
	r := weak("2")
	r.Name = "demo_free"
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &we) {
		t.Fatalf("a weak request for a free tool: %v", err)
	}
	// With a token it pays, work or not (weak requests get no free use).
	r = weak("3")
	r.CashuToken = "good:21"
	if _, err := h.v.CallItem(context.Background(), r); err != nil {
		t.Fatalf("a weak request paying with a token: %v", err)
	}
	// Enough work: the free use, then a quote.
	strong := from("4", "pubkey-1", "", nil)
	strong.Work, strong.WorkRequired = 8, 8
	if _, err := h.v.CallItem(context.Background(), strong); err != nil {
		t.Fatalf("enough work: %v", err)
	}
	strong.RequestID = "5"
	ch := h.callAsync(strong)
	p := h.nextPayment(t)
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}
	verify(t, h.l)
}

func TestFreePerDayTotal(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) {
		c.Prices = newBook(t, map[string]pricing.Rule{"echo": {Price: 21_000, FreePerDay: 1, FreePerDayTotal: 2}})
	})
	for i := 0; i < 2; i++ {
		if _, err := h.v.CallItem(context.Background(), from("1", fmt.Sprint("fresh-", i), "", nil)); err != nil {
			t.Fatalf("free call %d: %v", i, err)
		}
	}
	ch := h.callAsync(from("1", "fresh-3", "", nil))
	p := h.nextPayment(t) // the third fresh key is quoted
	h.be.pay(p.Ref)
	result(t, ch)
	if h.tools.count("echo") != 3 {
		t.Fatalf("ran %d", h.tools.count("echo"))
	}
	verify(t, h.l)
}

// A client at its unpaid limit is refused before anything is written for
// the request (a flood from one address costs no ledger write), while a
// replay of a request it holds still finds its call.
func TestRefusedAtTheClientLimitWritesNothing(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.MaxUnpaidPerClient = 1 })
	ctx := context.Background()
	n := &notes{}
	first := from("1", "session-a", "ip:10.0.0.1", n)
	ch := h.callAsync(first)
	p := h.nextPayment(t)
	if _, err := h.v.CallItem(ctx, from("2", "session-a", "ip:10.0.0.1", nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("a second unpaid quote: %v", err)
	}
	if c, err := h.l.CallByRequest(ctx, "test", "session-a", "2"); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("the refused request was recorded: %+v %v", c, err)
	}
	// The client repeats its first request (say, after a dropped
	// connection): it is its own call, not a new quote.
	again := h.callAsync(first)
	h.be.pay(p.Ref)
	for _, c := range []<-chan outcome{ch, again} {
		if o := result(t, c); o.err != nil {
			t.Fatalf("paid call: %v", o.err)
		}
	}
	if got := h.tools.count("echo"); got != 1 {
		t.Fatalf("ran %d times", got)
	}
	verify(t, h.l)
}

// gatedLedger holds each RecordCall until the test opens its gate, and
// says which request reached it.
type gatedLedger struct {
	*ledger.Ledger
	reached chan string
	gate    chan struct{}
}

func (g *gatedLedger) RecordCall(ctx context.Context, c vend.NewCall) (vend.Call, bool, error) {
	g.reached <- c.RequestID
	<-g.gate
	return g.Ledger.RecordCall(ctx, c)
}

// A request takes its place in the line to issue a payment request before
// its call is recorded, so requests being recorded cannot all find the
// line open and then overfill it: the next one is refused at once, with
// nothing written. (Checking the line, then recording, then joining let a
// flood's requests, queued behind the ledger's writer, pass the check
// together; each then cost a record and a cancel: 781 goroutines waited on
// the writer under capvend-flood.)
func TestPlaceInTheIssueLineIsTakenBeforeRecording(t *testing.T) {
	gl := &gatedLedger{reached: make(chan string, 10), gate: make(chan struct{})}
	h := newHarness(t, false, func(c *vend.Config) {
		gl.Ledger = c.Ledger.(*ledger.Ledger)
		c.Ledger = gl
	})
	vend.SetIssueLineForTest(h.v, 1, 1)
	giveBack, err := vend.TakeIssueTurnForTest(h.v)
	if err != nil {
		t.Fatal(err)
	}
	b := h.callAsync(from("b", "client-b", "", nil))
	if got := <-gl.reached; got != "b" {
		t.Fatalf("%s reached the ledger", got)
	}
	c := h.callAsync(from("c", "client-c", "", nil))
	select {
	case got := <-gl.reached:
		close(gl.gate)
		t.Fatalf("request %s was recorded though b holds the line's only place", got)
	case o := <-c:
		if !errors.Is(o.err, vend.ErrLimit) {
			t.Fatalf("c: %v, want ErrLimit", o.err)
		}
	}
	close(gl.gate)
	giveBack()
	h.be.pay(h.nextPayment(t).Ref)
	if o := result(t, b); o.err != nil {
		t.Fatalf("b, paid: %v", o.err)
	}
	if _, err := gl.Ledger.CallByRequest(context.Background(), "test", "client-c", "c"); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("the refused request was recorded: %v", err)
	}
	verify(t, gl.Ledger)
}
