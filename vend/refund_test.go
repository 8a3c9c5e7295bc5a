package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// fakeCashu is a Cashu backend for unit tests: it takes "good:<sats>"
// tokens and pays refunds with made-up tokens, booked in the real ledger;
// down makes the wallet unable to make one (the mint is unreachable).
type fakeCashu struct {
	led    *ledger.Ledger
	down   atomic.Bool
	made   atomic.Int32 // refund tokens made
	report atomic.Pointer[func(vend.PaymentEvent)]
	quotes chan vend.Payment // each mint quote requested
	// running, if not nil, is closed once Run has its report function.
	running chan struct{}
}

var (
	_ vend.TokenAcceptor = (*fakeCashu)(nil)
	_ vend.RefundPayer   = (*fakeCashu)(nil)
)

func (f *fakeCashu) Name() vend.Backend { return vend.BackendCashu }

// Request issues a mint quote (a made-up bolt11); payQuote pays it.
func (f *fakeCashu) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	p, err := f.led.RecordPayment(ctx, r.CallID, vend.NewPayment{Backend: vend.BackendCashu, Kind: vend.KindMintQuote,
		Ref: fmt.Sprintf("quote-%d", r.CallID), Bolt11: "lnbcrt-quote", MintURL: "http://mint", Amount: r.Amount, ExpiresAt: time.Now().Add(r.Expiry)})
	if err == nil && f.quotes != nil {
		f.quotes <- p
	}
	return p, err
}

// (report=false: the settlement is recorded, not reported.)
func (f *fakeCashu) payQuote(t *testing.T, ref string, report bool) {
	p, err := f.led.Payment(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = f.led.SettlePayment(context.Background(), vend.Settlement{Ref: ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	if report {
		(*f.report.Load())(vend.PaymentEvent{Payment: p})
	}
}

func (f *fakeCashu) Cancel(ctx context.Context, ref string) error { return nil }
func (f *fakeCashu) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	f.report.Store(&report)
	if f.running != nil {
		close(f.running)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakeCashu) AcceptToken(ctx context.Context, id vend.CallID, price vend.Msat, token string) (vend.TokenReceipt, error) {
	var sats int64
	if _, err := fmt.Sscanf(token, "good:%d", &sats); err != nil || vend.Msat(sats*1000) < price {
		return vend.TokenReceipt{}, vend.ErrBadToken
	}
	p, err := f.led.RecordPayment(ctx, id, vend.NewPayment{Backend: vend.BackendCashu, Kind: vend.KindToken, Ref: fmt.Sprintf("token-%d", id),
		MintURL: "http://mint", Amount: vend.Msat(sats * 1000), ExpiresAt: time.Now().Add(time.Minute)})
	if err != nil {
		return vend.TokenReceipt{}, err
	}
	p, err = f.led.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: vend.Msat(sats * 1000)})
	return vend.TokenReceipt{Payment: p}, err
}

func (f *fakeCashu) PayRefund(ctx context.Context, r vend.Refund) (vend.Refund, error) {
	if f.down.Load() {
		return r, errors.New("mint unavailable")
	}
	f.made.Add(1)
	return f.led.PayRefund(ctx, r.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: r.MintURL,
		Paid: vend.Msat(r.Amount.SatsCeil() * 1000), Token: fmt.Sprintf("cashuBrefund%d", r.ID)})
}

// brokenTools is fakeTools whose "fail" tool cannot be reached at all.
type brokenTools struct{ *fakeTools }

func (b brokenTools) CallTool(ctx context.Context, t vend.Item, args json.RawMessage, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	if t.UpstreamName == "fail" {
		return nil, errors.New("connection refused")
	}
	return b.fakeTools.CallTool(ctx, t, args, tok, progress)
}

func withCashu(c *fakeCashu, broken bool) func(*vend.Config) {
	return func(cfg *vend.Config) {
		// First: it, not fakeBackend, takes the tokens.
		cfg.Backends = append([]vend.PaymentBackend{c}, cfg.Backends...)
		if broken {
			cfg.Tools = brokenTools{cfg.Tools.(*fakeTools)}
		}
	}
}

// refundMeta returns the refund a result carries in _meta.
func refundMeta(t *testing.T, body json.RawMessage) (vend.RefundInfo, bool) {
	t.Helper()
	var r struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("result %s: %v", body, err)
	}
	raw, ok := r.Meta[vend.MetaRefund]
	if !ok {
		return vend.RefundInfo{}, false
	}
	var info vend.RefundInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatal(err)
	}
	return info, true
}

// TestFailedCashuCallIsRefundedAsEcash: a Cashu-paid call whose tool fails
// gets its money back at once as a Cashu token, in the result's _meta (the
// tool answered isError) or in the error (the tool could not run), booked
// as paid out; a replay gets the same token, and none is made twice.
func TestFailedCashuCallIsRefundedAsEcash(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("unreachable=", broken), func(t *testing.T) {
			c := &fakeCashu{}
			h := newHarness(t, false, withCashu(c, broken))
			c.led = h.l
			ctx := context.Background()
			r := req("1", "demo_fail", `{"text":"x"}`, nil)
			r.CashuToken = "good:12" // price 10 sat: 12 paid, 12 owed back
			res, err := h.v.CallItem(ctx, r)
			var info vend.RefundInfo
			if broken {
				var re *vend.RefundError
				if !errors.As(err, &re) || !errors.Is(err, vend.ErrUpstream) {
					t.Fatalf("want a RefundError matching ErrUpstream, got %v", err)
				}
				info = re.Refund
			} else {
				if err != nil || !res.IsError {
					t.Fatalf("%s %v", res.Body, err)
				}
				var ok bool
				if info, ok = refundMeta(t, res.Body); !ok {
					t.Fatalf("no refund in %s", res.Body)
				}
				if !strings.Contains(string(res.Body), "boom") {
					t.Fatalf("the tool's own answer is gone: %s", res.Body)
				}
			}
			if info.Owed || info.Amount != 12 || info.Unit != "sat" || !strings.HasPrefix(info.Cashu, "cashuBrefund") {
				t.Fatalf("refund %+v", info)
			}
			call, _ := h.l.Call(ctx, 1)
			rf, err := h.l.CallRefund(ctx, call.ID)
			if err != nil || rf.State != vend.RefundPaid || rf.Token != info.Cashu {
				t.Fatalf("ledger refund %+v %v", rf, err)
			}
			b, _ := h.l.Balance(ctx)
			if b.Pending.RefundsOwed != 0 {
				t.Fatalf("owed %d", b.Pending.RefundsOwed)
			}
			verify(t, h.l)

			// The client lost the answer and repeats the request: the same
			// token, from the ledger; no second one is made.
			// (A call that could not run is replayed from its stored
			// isError result.)
			res2, err2 := h.v.CallItem(ctx, r)
			if err2 != nil {
				t.Fatalf("replay: %v", err2)
			}
			again, _ := refundMeta(t, res2.Body)
			if again != info || c.made.Load() != 1 {
				t.Fatalf("replay refund %+v (first %+v), tokens made %d", again, info, c.made.Load())
			}
		})
	}
}

// TestCashuRefundStaysOwedWhileTheMintIsDown: no token can be made: the
// client is told the refund is owed; its repeat of the request, once the
// mint is back, gets the token.
func TestCashuRefundStaysOwedWhileTheMintIsDown(t *testing.T) {
	c := &fakeCashu{}
	c.down.Store(true)
	h := newHarness(t, false, withCashu(c, true))
	c.led = h.l
	ctx := context.Background()
	r := req("1", "demo_fail", `{"text":"x"}`, nil)
	r.CashuToken = "good:10"
	_, err := h.v.CallItem(ctx, r)
	var re *vend.RefundError
	if !errors.As(err, &re) || !re.Refund.Owed || re.Refund.Cashu != "" || re.Refund.Amount != 10 {
		t.Fatalf("want an owed refund, got %v", err)
	}
	owed, _ := h.l.Refunds(ctx, false)
	if len(owed) != 1 || owed[0].Client != "client-1" || owed[0].MintURL != "http://mint" {
		t.Fatalf("owed %+v", owed)
	}
	verify(t, h.l)
	c.down.Store(false)
	res, err := h.v.CallItem(ctx, r)
	if info, ok := refundMeta(t, res.Body); err != nil || !ok || info.Owed || info.Cashu == "" {
		t.Fatalf("after the mint is back: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestFailedInvoiceCallIsOwedToTheRefundInvoice: a plain LND invoice's
// failed call is a refund owed to the client, with the bolt11 it gave;
// the client is told so. A hold invoice is canceled instead: no refund.
func TestFailedInvoiceCallIsOwedToTheRefundInvoice(t *testing.T) {
	h := newHarness(t, false, nil)
	ctx := context.Background()
	r := req("1", "demo_fail", `{"text":"x"}`, nil)
	r.RefundInvoice = "LIGHTNING:LNBCRT100N1PJQXYZPP5QQQSYQCYQ5RQWZQFQQQSYQCYQ5RQWZQFQQQSYQCYQ5RQWZQFQYPQDQ"
	ch := h.callAsync(r)
	h.be.pay(h.nextPayment(t).Ref)
	o := result(t, ch)
	if o.err != nil || !o.res.IsError {
		t.Fatalf("%s %v", o.res.Body, o.err)
	}
	info, ok := refundMeta(t, o.res.Body)
	if !ok || !info.Owed || info.Cashu != "" || info.Amount != 10 {
		t.Fatalf("refund %+v in %s", info, o.res.Body)
	}
	owed, _ := h.l.Refunds(ctx, false)
	if len(owed) != 1 || owed[0].Invoice != strings.ToLower(strings.TrimPrefix(r.RefundInvoice, "LIGHTNING:")) ||
		owed[0].Transport != "test" || owed[0].Client != "client-1" || owed[0].Amount != 10_000 {
		t.Fatalf("owed %+v", owed)
	}
	verify(t, h.l)

	// Not a bolt11: refused before anything is quoted.
	bad := req("2", "demo_echo", `{"text":"x"}`, nil)
	bad.RefundInvoice = "https://example.com/refund"
	var ip *vend.InvalidParamsError
	if _, err := h.v.CallItem(ctx, bad); !errors.As(err, &ip) {
		t.Fatalf("bad refund invoice: %v", err)
	}

	hh := newHarness(t, true, nil)
	ch = hh.callAsync(req("1", "demo_fail", `{"text":"x"}`, nil))
	hh.be.pay(hh.nextPayment(t).Ref)
	o = result(t, ch)
	if _, ok := refundMeta(t, o.res.Body); ok || o.err != nil {
		t.Fatalf("a canceled hold invoice got a refund: %s %v", o.res.Body, o.err)
	}
	if owed, _ := hh.l.Refunds(ctx, true); len(owed) != 0 {
		t.Fatalf("refunds %+v", owed)
	}
}

// TestCashuRefundWaitsForItsClient: a mint quote paid after its client
// left runs in the background and fails: the refund is not made into a
// token nobody would receive; it stays owed until the client repeats its
// request, which gets the token.
func TestCashuRefundWaitsForItsClient(t *testing.T) {
	c := &fakeCashu{quotes: make(chan vend.Payment, 1), running: make(chan struct{})}
	h := newHarness(t, false, withCashu(c, true))
	c.led = h.l
	select {
	case <-c.running:
	case <-time.After(10 * time.Second):
		t.Fatal("the vendor did not start its cashu backend")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := req("1", "demo_fail", `{"text":"x"}`, nil)
	r.InvoiceFrom = vend.BackendCashu
	done := make(chan error, 1)
	go func() {
		_, err := h.v.CallItem(ctx, r)
		done <- err
	}()
	p := <-c.quotes
	cancel() // the client leaves
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	c.payQuote(t, p.Ref, true) // and its invoice is paid anyway
	waitState(t, h.l, p.CallID, vend.CallRefunded)
	if rf, err := h.l.CallRefund(context.Background(), p.CallID); err != nil || rf.State != vend.RefundOwed || c.made.Load() != 0 {
		t.Fatalf("refund %+v %v, tokens made %d", rf, err, c.made.Load())
	}
	verify(t, h.l)
	res, err := h.v.CallItem(context.Background(), r)
	info, ok := refundMeta(t, res.Body)
	if err != nil || !ok || info.Owed || info.Cashu == "" || c.made.Load() != 1 {
		t.Fatalf("the client's repeat: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestLatePaymentIsRefundedOnTheReplay: a mint quote paid after it expired
// (the call never runs) is owed back; the client's repeat of the request
// gets the expiry error with its refund as ecash.
func TestLatePaymentIsRefundedOnTheReplay(t *testing.T) {
	c := &fakeCashu{quotes: make(chan vend.Payment, 1), running: make(chan struct{})}
	h := newHarness(t, false, withCashu(c, false))
	c.led = h.l
	select {
	case <-c.running:
	case <-time.After(10 * time.Second):
		t.Fatal("the vendor did not start its cashu backend")
	}
	r := req("1", "demo_echo", `{"text":"x"}`, nil)
	r.InvoiceFrom = vend.BackendCashu
	ch := h.callAsync(r)
	p := <-c.quotes
	ended, err := h.l.EndPayment(context.Background(), p.Ref, vend.PaymentExpired, "expired")
	if err != nil {
		t.Fatal(err)
	}
	(*c.report.Load())(vend.PaymentEvent{Payment: ended})
	if o := result(t, ch); !errors.Is(o.err, vend.ErrPaymentExpired) {
		t.Fatalf("first answer: %v", o.err)
	}
	// Paid late: owed back. (Not reported: a report of a settlement
	// whose call cannot run deadlocks vend's run->resume on main, the
	// issue's self-deadlock item, fixed elsewhere.)
	c.payQuote(t, p.Ref, false)
	_, err = h.v.CallItem(context.Background(), r)
	var re *vend.RefundError
	if !errors.As(err, &re) || !errors.Is(err, vend.ErrPaymentExpired) || re.Refund.Owed || re.Refund.Cashu == "" || h.tools.count("echo") != 0 {
		t.Fatalf("replay after a late payment: %v (runs %d)", err, h.tools.count("echo"))
	}
	verify(t, h.l)
}
