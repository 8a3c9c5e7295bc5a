package vend_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// fakeBackend is a payment backend for fast unit tests: the test "pays"
// by calling pay. Every change goes through the real ledger, as a real
// backend's would.
type fakeBackend struct {
	led  vend.Ledger
	hold bool

	running chan struct{} // closed once Run has its report function

	mu        sync.Mutex
	report    func(vend.PaymentEvent)
	last      chan vend.Payment // each Request's payment
	preimages map[string]string // ref -> hex preimage: what a payer learns
	// payerless: no preimages are kept (BenchmarkPendingQuotesRSS
	// measures capvend; LND keeps them in its own process).
	payerless bool
	urgent    []bool // vend.IsUrgent of each Request's and SettleHeld's context
}

// urgency returns vend.IsUrgent of the contexts of every Request and
// SettleHeld so far, in order.
func (f *fakeBackend) urgency() []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bool(nil), f.urgent...)
}

func (f *fakeBackend) noteUrgency(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.urgent = append(f.urgent, vend.IsUrgent(ctx))
}

var (
	_ vend.HoldSettler   = (*fakeBackend)(nil)
	_ vend.TokenAcceptor = (*fakeBackend)(nil)
)

func (f *fakeBackend) Name() vend.Backend { return vend.BackendLND }
func (f *fakeBackend) CanHold() bool      { return f.hold }

func (f *fakeBackend) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	f.noteUrgency(ctx)
	pre := make([]byte, 32)
	rand.Read(pre)
	h := sha256.Sum256(pre)
	np := vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: hex.EncodeToString(h[:]),
		Bolt11: "lnbcrt-fake-" + hex.EncodeToString(h[:4]), Amount: r.Amount, ExpiresAt: time.Now().Add(r.Expiry)}
	if r.Hold && f.hold {
		np.Kind, np.HoldPreimage = vend.KindHoldInvoice, pre
	}
	p, err := f.led.RecordPayment(ctx, r.CallID, np)
	if err == nil && f.last != nil {
		f.mu.Lock()
		if f.preimages == nil {
			f.preimages = map[string]string{}
		}
		if !f.payerless {
			f.preimages[p.Ref] = hex.EncodeToString(pre)
		}
		f.mu.Unlock()
		f.last <- p
	}
	return p, err
}

func (f *fakeBackend) emit(p vend.Payment, err error) {
	if err != nil {
		panic(err)
	}
	f.mu.Lock()
	report := f.report
	f.mu.Unlock()
	report(vend.PaymentEvent{Payment: p})
}

// pay settles (or, for a hold invoice, locks in) a payment.
func (f *fakeBackend) pay(ref string) {
	p, _ := f.led.Payment(context.Background(), ref)
	if p.Kind == vend.KindHoldInvoice {
		f.emit(f.led.AcceptPayment(context.Background(), ref))
		return
	}
	f.emit(f.led.SettlePayment(context.Background(), vend.Settlement{Ref: ref, Amount: p.Amount}))
}

func (f *fakeBackend) expire(ref string) {
	f.emit(f.led.EndPayment(context.Background(), ref, vend.PaymentExpired, "expired"))
}

func (f *fakeBackend) Cancel(ctx context.Context, ref string) error {
	p, err := f.led.Payment(ctx, ref)
	if err != nil || p.State == vend.PaymentCanceled || p.State == vend.PaymentExpired {
		return err
	}
	_, err = f.led.EndPayment(ctx, ref, vend.PaymentCanceled, "canceled")
	return err
}

func (f *fakeBackend) SettleHeld(ctx context.Context, ref string) (vend.Payment, error) {
	f.noteUrgency(ctx)
	p, _ := f.led.Payment(ctx, ref)
	return f.led.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: p.Amount})
}

func (f *fakeBackend) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	f.mu.Lock()
	f.report = report
	f.mu.Unlock()
	close(f.running)
	<-ctx.Done()
	return ctx.Err()
}

// AcceptToken takes "good:<sats>" tokens.
func (f *fakeBackend) AcceptToken(ctx context.Context, id vend.CallID, price vend.Msat, token string) (vend.TokenReceipt, error) {
	var sats int64
	if _, err := fmt.Sscanf(token, "good:%d", &sats); err != nil {
		return vend.TokenReceipt{}, errors.New("malformed token")
	}
	if vend.Msat(sats*1000) < price {
		return vend.TokenReceipt{}, errors.New("underpaid")
	}
	ref := fmt.Sprintf("token-%d", id)
	p, err := f.led.RecordPayment(ctx, id, vend.NewPayment{Backend: vend.BackendCashu, Kind: vend.KindToken, Ref: ref,
		MintURL: "http://mint", Amount: price, ExpiresAt: time.Now().Add(time.Minute)})
	if err != nil {
		return vend.TokenReceipt{}, err
	}
	p, err = f.led.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: price})
	return vend.TokenReceipt{Payment: p}, err
}

// fakeTools is a tool source with counted executions.
type fakeTools struct {
	calls sync.Map // tool name -> *atomic.Int32

	mu   sync.Mutex
	sent []string // "upstream-name arguments" of every call, in order
}

// sentArgs returns what every call sent upstream: "tool arguments".
func (f *fakeTools) sentArgs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sent...)
}

var echoSchema = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","maxLength":100}},"required":["text"]}`)

func (f *fakeTools) Tools() []vend.Item {
	return []vend.Item{
		{Name: "demo_echo", Server: "demo", UpstreamName: "echo", InputSchema: echoSchema},
		{Name: "demo_fail", Server: "demo", UpstreamName: "fail", InputSchema: echoSchema},
		{Name: "demo_free", Server: "demo", UpstreamName: "free", InputSchema: echoSchema},
	}
}

func (f *fakeTools) count(tool string) int32 {
	c, _ := f.calls.LoadOrStore(tool, new(atomic.Int32))
	return c.(*atomic.Int32).Load()
}

func (f *fakeTools) CallTool(ctx context.Context, t vend.Item, args json.RawMessage, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	c, _ := f.calls.LoadOrStore(t.UpstreamName, new(atomic.Int32))
	c.(*atomic.Int32).Add(1)
	f.mu.Lock()
	f.sent = append(f.sent, t.UpstreamName+" "+string(args))
	f.mu.Unlock()
	var a struct{ Text string }
	json.Unmarshal(args, &a)
	if progress != nil {
		progress(json.RawMessage(fmt.Sprintf(`{"progressToken":%s,"progress":1,"total":1}`, tok)))
	}
	if t.UpstreamName == "fail" {
		return json.RawMessage(`{"isError":true,"content":[{"type":"text","text":"boom"}]}`), nil
	}
	if a.Text == "elicit" { // asks the client, as an upstream may
		fn := vend.ElicitFrom(ctx)
		if fn == nil {
			return json.RawMessage(`{"content":[{"type":"text","text":"echo:no elicit"}]}`), nil
		}
		ans, err := fn(ctx, json.RawMessage(`{"message":"sure?"}`))
		if err != nil {
			return nil, err
		}
		txt, _ := json.Marshal("echo:" + string(ans))
		return json.RawMessage(`{"content":[{"type":"text","text":` + string(txt) + `}]}`), nil
	}
	return json.RawMessage(fmt.Sprintf(`{"content":[{"type":"text","text":"echo:%s"}]}`, a.Text)), nil
}

type harness struct {
	v     *vend.Vendor
	l     *ledger.Ledger
	be    *fakeBackend
	tools *fakeTools
	// ctx ends when the test does: calls still waiting then (for a
	// payment nobody makes) return, and calls tracks them.
	ctx   context.Context
	calls sync.WaitGroup
}

func newHarness(t testing.TB, hold bool, mod func(*vend.Config)) *harness {
	t.Helper()
	l := tempLedger(t)
	return harnessOn(t, l, hold, mod)
}

// newBook builds a price book for the "demo" server.
func newBook(t testing.TB, rules map[string]pricing.Rule) *pricing.Book {
	t.Helper()
	b, err := pricing.NewBook(map[string]map[string]pricing.Rule{"demo": rules})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// harnessOn starts a Vendor on an existing ledger: capvend (re)starting.
func harnessOn(t testing.TB, l *ledger.Ledger, hold bool, mod func(*vend.Config)) *harness {
	t.Helper()
	be := &fakeBackend{led: l, hold: hold, last: make(chan vend.Payment, 100), running: make(chan struct{})}
	tools := &fakeTools{}
	cfg := vend.Config{
		Ledger: l, Backends: []vend.PaymentBackend{be}, Tools: tools,
		Prices: newBook(t, map[string]pricing.Rule{
			"echo": {Price: 21_000}, "fail": {Price: 10_000},
		}),
		TTL: time.Minute,
	}
	if mod != nil {
		mod(&cfg)
	}
	v, err := vend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()
	h := &harness{v: v, l: l, be: be, tools: tools, ctx: ctx}
	t.Cleanup(func() { cancel(); <-done; h.calls.Wait() })
	// Run registers the report function asynchronously.
	select {
	case <-be.running:
	case <-time.After(10 * time.Second):
		t.Fatal("the vendor did not start its payment backend")
	}
	return h
}

// notes records notifications sent to one client.
type notes struct {
	mu      sync.Mutex
	got     []string
	changed chan struct{} // closed (and replaced) at each notification
}

func (n *notes) notify(method string, params any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, method)
	if n.changed != nil {
		close(n.changed)
		n.changed = nil
	}
}

// waitFor waits until method was sent.
func (n *notes) waitFor(t *testing.T, method string) {
	t.Helper()
	n.waitN(t, method, 1)
}

// waitN waits until method was sent k times.
func (n *notes) waitN(t *testing.T, method string, k int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		n.mu.Lock()
		if countOf(n.got, method) >= k {
			n.mu.Unlock()
			return
		}
		if n.changed == nil {
			n.changed = make(chan struct{})
		}
		changed := n.changed
		n.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no %s; got %v", method, n.methods())
		}
	}
}

func (n *notes) methods() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.got...)
}

func req(id, tool, args string, n *notes) vend.CallRequest {
	r := vend.CallRequest{Transport: "test", Client: "client-1", RequestID: id, Name: tool, Arguments: json.RawMessage(args)}
	if n != nil {
		r.Notify = n.notify
	}
	return r
}

type outcome struct {
	res vend.CallResult
	err error
}

func (h *harness) callAsync(r vend.CallRequest) <-chan outcome {
	ch := make(chan outcome, 1)
	h.calls.Add(1)
	go func() {
		defer h.calls.Done()
		res, err := h.v.CallItem(h.ctx, r)
		ch <- outcome{res, err}
	}()
	return ch
}

func (h *harness) nextPayment(t testing.TB) vend.Payment {
	t.Helper()
	select {
	case p := <-h.be.last:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no payment requested")
	}
	return vend.Payment{}
}

func result(t testing.TB, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("call did not return")
	}
	return outcome{}
}

func verify(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	ledgerkit.Verify(t, l)
}

func TestFreeCallRunsWithoutPayment(t *testing.T) {
	h := newHarness(t, false, nil)
	res, err := h.v.CallItem(context.Background(), req("1", "demo_free", `{"text":"hi"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "echo:hi") {
		t.Fatalf("%s %v", res.Body, err)
	}
	if b, _ := h.l.Balance(context.Background()); len(b.Tools) != 0 || b.Pending.AwaitingCalls != 0 {
		t.Fatalf("a free call touched the ledger: %+v", b)
	}
}

func TestPricedCallIsPaidThenRunOnceAndReplaysFromTheLedger(t *testing.T) {
	h := newHarness(t, false, nil)
	n := &notes{}
	ch := h.callAsync(req("7", "demo_echo", `{"text":"hi"}`, n))
	p := h.nextPayment(t)
	if h.tools.count("echo") != 0 {
		t.Fatal("ran before payment")
	}
	n.waitFor(t, vend.NotifyPaymentRequired) // paid before that, there is nothing to ask
	h.be.pay(p.Ref)
	o := result(t, ch)
	if o.err != nil || !strings.Contains(string(o.res.Body), "echo:hi") {
		t.Fatalf("%s %v", o.res.Body, o.err)
	}
	if got := strings.Join(n.methods(), ","); got != vend.NotifyPaymentRequired+","+vend.NotifyPaymentAccepted {
		t.Fatalf("notifications %s", got)
	}
	// The same request again: the stored answer, no payment, no run.
	n2 := &notes{}
	res, err := h.v.CallItem(context.Background(), req("7", "demo_echo", `{"text":"hi"}`, n2))
	if err != nil || string(res.Body) != string(o.res.Body) || len(n2.methods()) != 0 || h.tools.count("echo") != 1 {
		t.Fatalf("replay: %s %v %v runs=%d", res.Body, err, n2.methods(), h.tools.count("echo"))
	}
	verify(t, h.l)
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	h := newHarness(t, false, nil)
	first := h.callAsync(req("9", "demo_echo", `{"text":"x"}`, nil))
	p := h.nextPayment(t)
	var chans []<-chan outcome
	for i := 0; i < 10; i++ {
		chans = append(chans, h.callAsync(req("9", "demo_echo", `{"text":"x"}`, nil)))
	}
	h.be.pay(p.Ref)
	for _, ch := range append(chans, first) {
		if o := result(t, ch); o.err != nil || !strings.Contains(string(o.res.Body), "echo:x") {
			t.Fatalf("%s %v", o.res.Body, o.err)
		}
	}
	if n := h.tools.count("echo"); n != 1 {
		t.Fatalf("ran %d times", n)
	}
	verify(t, h.l)
}

func TestInvalidArgumentsAreRefusedBeforeAnyCharge(t *testing.T) {
	h := newHarness(t, false, nil)
	for _, args := range []string{`{}`, `{"text":5}`, `{"text":"` + strings.Repeat("x", 101) + `"}`, `[1]`, `"text"`} {
		_, err := h.v.CallItem(context.Background(), req("a", "demo_echo", args, nil))
		var ip *vend.InvalidParamsError
		if !errors.As(err, &ip) {
			t.Fatalf("%s: %v", args, err)
		}
	}
	if _, err := h.v.CallItem(context.Background(), req("b", "nope", `{}`, nil)); !errors.Is(err, vend.ErrUnknownTool) {
		t.Fatalf("unknown tool: %v", err)
	}
	if b, _ := h.l.Balance(context.Background()); b.Pending.AwaitingCalls != 0 || b.Pending.OpenPayments != 0 {
		t.Fatalf("something was quoted: %+v", b.Pending)
	}
	select {
	case p := <-h.be.last:
		t.Fatalf("payment requested: %+v", p)
	default:
	}
}

func TestExpiredPaymentIsRejectedAndNothingRuns(t *testing.T) {
	h := newHarness(t, false, nil)
	n := &notes{}
	ch := h.callAsync(req("1", "demo_echo", `{"text":"hi"}`, n))
	p := h.nextPayment(t)
	h.be.expire(p.Ref)
	o := result(t, ch)
	if !errors.Is(o.err, vend.ErrPaymentExpired) || h.tools.count("echo") != 0 {
		t.Fatalf("%v runs=%d", o.err, h.tools.count("echo"))
	}
	if got := n.methods(); got[len(got)-1] != vend.NotifyPaymentRejected {
		t.Fatalf("notifications %v", got)
	}
	verify(t, h.l)
}

func TestHoldInvoiceSettledAfterSuccessCanceledAfterFailure(t *testing.T) {
	h := newHarness(t, true, nil)
	ch := h.callAsync(req("1", "demo_echo", `{"text":"ok"}`, nil))
	p := h.nextPayment(t)
	if p.Kind != vend.KindHoldInvoice {
		t.Fatalf("kind %s", p.Kind)
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}
	if got, _ := h.l.Payment(context.Background(), p.Ref); got.State != vend.PaymentSettled {
		t.Fatalf("hold invoice is %s after success", got.State)
	}

	ch = h.callAsync(req("2", "demo_fail", `{"text":"x"}`, nil))
	p = h.nextPayment(t)
	h.be.pay(p.Ref)
	o := result(t, ch)
	if o.err != nil || !o.res.IsError {
		t.Fatalf("failed tool: %+v %v", o.res, o.err)
	}
	if got, _ := h.l.Payment(context.Background(), p.Ref); got.State != vend.PaymentCanceled {
		t.Fatalf("hold invoice is %s after failure", got.State)
	}
	b, _ := h.l.Balance(context.Background())
	if b.Pending.RefundsOwed != 0 || len(b.Tools) != 1 || b.Tools[0].Revenue != 21_000 {
		t.Fatalf("balance %+v", b)
	}
	verify(t, h.l)
}

// Work on money in motion is marked vend.Urgent, so the ledger serves
// its reads ahead of a flood's: a paid call's settlement, and every
// request of a client that paid before; a stranger's first quote is not.
func TestPaidWorkIsUrgent(t *testing.T) {
	h := newHarness(t, true, nil)
	for i, id := range []string{"1", "2"} {
		ch := h.callAsync(req(id, "demo_echo", `{"text":"u`+id+`"}`, nil))
		h.be.pay(h.nextPayment(t).Ref)
		if o := result(t, ch); o.err != nil {
			t.Fatalf("call %d: %v", i+1, o.err)
		}
	}
	// Request, SettleHeld of the first call; the same of the second.
	if got, want := fmt.Sprint(h.be.urgency()), "[false true true true]"; got != want {
		t.Fatalf("urgency of Request, SettleHeld, Request, SettleHeld: %s, want %s", got, want)
	}
}

func TestFailedToolWithPlainInvoiceIsRefundedAsOwed(t *testing.T) {
	h := newHarness(t, false, nil)
	ch := h.callAsync(req("1", "demo_fail", `{"text":"x"}`, nil))
	h.be.pay(h.nextPayment(t).Ref)
	if o := result(t, ch); o.err != nil || !o.res.IsError {
		t.Fatalf("%+v %v", o.res, o.err)
	}
	b, _ := h.l.Balance(context.Background())
	if b.Pending.RefundsOwed != 10_000 {
		t.Fatalf("refunds owed %d", b.Pending.RefundsOwed)
	}
	verify(t, h.l)
}

func TestExplicitGatingGrantIsSingleUse(t *testing.T) {
	h := newHarness(t, true, nil)
	r := req("1", "demo_echo", `{"text":"g"}`, nil)
	r.Explicit = true
	_, err := h.v.CallItem(context.Background(), r)
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || len(pr.Options) != 2 || pr.Options[0].PMI != vend.PMILightning || pr.Options[0].Amount != 21 ||
		pr.Options[1].PMI != vend.PMICashu {
		t.Fatalf("first call: %v %+v", err, pr)
	}
	p := h.nextPayment(t)
	if p.Kind != vend.KindInvoice {
		t.Fatalf("explicit gating issued a %s", p.Kind)
	}
	// Repeated before paying: pending.
	r.RequestID = "2"
	var pp *vend.PaymentPendingError
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pp) {
		t.Fatalf("before payment: %v", err)
	}
	h.be.pay(p.Ref)
	r.RequestID = "3"
	res, err := h.v.CallItem(context.Background(), r)
	if err != nil || !strings.Contains(string(res.Body), "echo:g") {
		t.Fatalf("after payment: %s %v", res.Body, err)
	}
	// The grant is used up: the next identical call must pay again.
	r.RequestID = "4"
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) {
		t.Fatalf("reused grant: %v", err)
	}
	// Another client cannot use this client's grant.
	if h.tools.count("echo") != 1 {
		t.Fatalf("ran %d times", h.tools.count("echo"))
	}
	verify(t, h.l)
}

func TestGrantIsBoundToTheClient(t *testing.T) {
	h := newHarness(t, false, nil)
	r := req("1", "demo_echo", `{"text":"mine"}`, nil)
	r.Explicit = true
	h.v.CallItem(context.Background(), r)
	h.be.pay(h.nextPayment(t).Ref)
	thief := r
	thief.Client, thief.RequestID = "client-2", "x"
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), thief); !errors.As(err, &pr) {
		t.Fatalf("another client used the grant: %v", err)
	}
	if h.tools.count("echo") != 0 {
		t.Fatal("ran for the wrong client")
	}
}

func TestCashuTokenPaysAtOnce(t *testing.T) {
	h := newHarness(t, false, nil)
	r := req("1", "demo_echo", `{"text":"t"}`, nil)
	r.CashuToken = "good:21"
	if res, err := h.v.CallItem(context.Background(), r); err != nil || !strings.Contains(string(res.Body), "echo:t") {
		t.Fatalf("%s %v", res.Body, err)
	}
	r.RequestID, r.CashuToken = "2", "good:5"
	if _, err := h.v.CallItem(context.Background(), r); !errors.Is(err, vend.ErrPaymentFailed) {
		t.Fatalf("underpaid token: %v", err)
	}
	r.RequestID, r.CashuToken = "3", "garbage"
	if _, err := h.v.CallItem(context.Background(), r); !errors.Is(err, vend.ErrPaymentFailed) {
		t.Fatalf("malformed token: %v", err)
	}
	if h.tools.count("echo") != 1 {
		t.Fatalf("ran %d times", h.tools.count("echo"))
	}
	verify(t, h.l)
}

func TestUnpaidQuotesAreLimitedPerClient(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.MaxUnpaidPerClient = 1 })
	ch := h.callAsync(req("1", "demo_echo", `{"text":"a"}`, nil))
	p := h.nextPayment(t)
	if _, err := h.v.CallItem(context.Background(), req("2", "demo_echo", `{"text":"b"}`, nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("second unpaid quote: %v", err)
	}
	other := req("3", "demo_echo", `{"text":"c"}`, nil)
	other.Client = "client-2"
	ch2 := h.callAsync(other)
	p2 := h.nextPayment(t)
	h.be.pay(p.Ref)
	h.be.pay(p2.Ref)
	result(t, ch)
	result(t, ch2)
	verify(t, h.l)
}

func TestHeartbeatsWhileWaitingForPayment(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.Heartbeat = 20 * time.Millisecond })
	n := &notes{}
	r := req("1", "demo_echo", `{"text":"a"}`, n)
	r.ProgressToken = json.RawMessage(`"tok"`)
	ch := h.callAsync(r)
	p := h.nextPayment(t)
	n.waitN(t, vend.NotifyProgress, 2)
	h.be.pay(p.Ref)
	result(t, ch)
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

func TestPaidAfterTheClientLeftRunsAndWaitsForTheReplay(t *testing.T) {
	h := newHarness(t, false, nil)
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() {
		_, err := h.v.CallItem(ctx, req("1", "demo_echo", `{"text":"later"}`, nil))
		ch <- err
	}()
	p := h.nextPayment(t)
	cancel() // the client leaves
	if err := <-ch; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	h.be.pay(p.Ref) // and pays anyway
	waitState(t, h.l, p.CallID, vend.CallDelivered)
	res, err := h.v.CallItem(context.Background(), req("1", "demo_echo", `{"text":"later"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "echo:later") || h.tools.count("echo") != 1 {
		t.Fatalf("%s %v runs=%d", res.Body, err, h.tools.count("echo"))
	}
	verify(t, h.l)
}

// argsHash is the canonical hash vend records for a request of method
// for name with the arguments object args.
func argsHash(t testing.TB, method, name, args string) string {
	t.Helper()
	params, _ := json.Marshal(map[string]any{"name": name, "arguments": json.RawMessage(args)})
	h, err := vend.CanonicalHash(method, params)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// crashedCall leaves a call as a crash at some step would: the ledger
// rows only, no process.
func crashedCall(t *testing.T, l *ledger.Ledger, id, tool string, idempotent, hold, explicit bool, steps int) (vend.Call, vend.Payment) {
	t.Helper()
	ctx := context.Background()
	price := vend.Msat(21_000)
	if tool == "demo_fail" {
		price = 10_000
	}
	args := `{"text":"` + id + `"}`
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "client-1", RequestID: id, Server: "demo",
		Name: strings.TrimPrefix(tool, "demo_"), ArgsHash: argsHash(t, "tools/call", tool, args), Price: price, Idempotent: idempotent,
		ExposedName: tool, Arguments: []byte(args), Explicit: explicit})
	if err != nil {
		t.Fatal(err)
	}
	pre := make([]byte, 32)
	rand.Read(pre)
	ph := sha256.Sum256(pre)
	np := vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: hex.EncodeToString(ph[:]), Bolt11: "lnbcrt1",
		Amount: price, ExpiresAt: time.Now().Add(time.Hour)}
	if hold {
		np.Kind, np.HoldPreimage = vend.KindHoldInvoice, pre
	}
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	if steps >= 1 { // paid
		if hold {
			p, err = l.AcceptPayment(ctx, p.Ref)
		} else {
			p, err = l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: price})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if steps >= 2 { // executing
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			t.Fatal(err)
		}
	}
	if steps >= 3 { // failed
		if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{"isError":true}`)}, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	return c, p
}

func TestRecoverFinishesWhatACrashLeft(t *testing.T) {
	l := tempLedger(t)
	paid, _ := crashedCall(t, l, "paid", "demo_echo", true, false, false, 1)
	rerun, _ := crashedCall(t, l, "rerun", "demo_echo", true, false, false, 2)
	once, _ := crashedCall(t, l, "once", "demo_echo", false, false, false, 2)
	failed, _ := crashedCall(t, l, "failed", "demo_fail", true, false, false, 3)
	held, heldPay := crashedCall(t, l, "held", "demo_echo", true, true, false, 1)
	grant, _ := crashedCall(t, l, "grant", "demo_echo", true, false, true, 1)
	quoted, _, _ := l.RecordCall(context.Background(), vend.NewCall{Transport: "test", Client: "client-1", RequestID: "quoted",
		Server: "demo", Name: "echo", ArgsHash: strings.Repeat("a", 64), Price: 21_000, Idempotent: true})

	h := harnessOn(t, l, true, nil) // capvend starts again
	waitState(t, l, paid.ID, vend.CallDelivered)
	if c := waitState(t, l, rerun.ID, vend.CallDelivered); c.Executions != 2 {
		t.Fatalf("re-run call executed %d times", c.Executions)
	}
	waitState(t, l, once.ID, vend.CallRefunded)
	waitState(t, l, failed.ID, vend.CallRefunded)
	waitState(t, l, held.ID, vend.CallRefunded)
	waitState(t, l, quoted.ID, vend.CallCanceled)
	if p, _ := l.Payment(context.Background(), heldPay.Ref); p.State != vend.PaymentCanceled {
		t.Fatalf("abandoned hold invoice is %s", p.State)
	}
	select { // Recover has handled every call the crash left
	case <-h.v.RecoveredForTest():
	case <-time.After(10 * time.Second):
		t.Fatal("Recover did not return")
	}
	if c, _ := l.Call(context.Background(), grant.ID); c.State != vend.CallPaid {
		t.Fatalf("explicit grant is %s, want paid (waiting for its client)", c.State)
	}
	// echo ran for "paid" and "rerun" only: never for the non-idempotent
	// interrupted call.
	if n := h.tools.count("echo"); n != 2 {
		t.Fatalf("echo ran %d times, want 2", n)
	}
	res, err := h.v.CallItem(context.Background(), req("paid", "demo_echo", `{"text":"paid"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "echo:paid") {
		t.Fatalf("replay after recovery: %s %v", res.Body, err)
	}
	verify(t, l)
}

func TestAnonymousClientsNeitherCollideNorShareGrants(t *testing.T) {
	h := newHarness(t, false, nil)
	anon := func(id, text string) vend.CallRequest {
		r := req(id, "demo_echo", `{"text":"`+text+`"}`, nil)
		r.Client, r.Anonymous = "anonymous", true
		return r
	}
	// Two anonymous clients both use request id 1: two calls, two payments.
	a := h.callAsync(anon("1", "alice"))
	pa := h.nextPayment(t)
	b := h.callAsync(anon("1", "bob"))
	pb := h.nextPayment(t)
	if pa.CallID == pb.CallID {
		t.Fatal("two anonymous clients share a call")
	}
	h.be.pay(pa.Ref)
	h.be.pay(pb.Ref)
	if o := result(t, a); !strings.Contains(string(o.res.Body), "echo:alice") {
		t.Fatalf("alice got %s %v", o.res.Body, o.err)
	}
	if o := result(t, b); !strings.Contains(string(o.res.Body), "echo:bob") {
		t.Fatalf("bob got %s %v", o.res.Body, o.err)
	}

	// Explicit gating without a session: the grant goes only to the holder
	// of its payment token. The invoice's preimage, which every routing
	// hop learns, releases nothing to a client without an identity.
	r := anon("2", "grant")
	r.Explicit, r.PaymentTokens = true, true
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) || pr.Token == "" {
		t.Fatal(err)
	}
	token := pr.Token
	p := h.nextPayment(t)
	h.be.pay(p.Ref)
	r.RequestID = "3"
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) {
		t.Fatalf("an anonymous repeat without proof used the grant: %v", err)
	}
	h.nextPayment(t) // that repeat was quoted anew
	r.RequestID, r.PaymentProof = "4", strings.Repeat("00", 32)
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) {
		t.Fatalf("a wrong preimage used the grant: %v", err)
	}
	h.nextPayment(t)
	pre, _ := h.l.HoldPreimage(context.Background(), p.Ref) // the fake backend made a plain invoice: no preimage stored
	if pre != nil {
		t.Fatal("unexpected preimage")
	}
	h.be.mu.Lock()
	proof := h.be.preimages[p.Ref]
	h.be.mu.Unlock()
	r.RequestID, r.PaymentProof = "5", proof
	if res, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) {
		t.Fatalf("the preimage alone released an anonymous grant: %s %v", res.Body, err)
	}
	h.nextPayment(t)
	r.RequestID, r.PaymentProof, r.PaymentToken = "6", "", token
	res, err := h.v.CallItem(context.Background(), r)
	if err != nil || !strings.Contains(string(res.Body), "echo:grant") {
		t.Fatalf("with the payment token: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

func TestRateLimitPerClient(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.RequestsPerMinute = 3 })
	for i := 0; i < 3; i++ {
		if _, err := h.v.CallItem(context.Background(), req(fmt.Sprint(i), "demo_free", `{"text":"x"}`, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.v.CallItem(context.Background(), req("4", "demo_free", `{"text":"x"}`, nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("fourth call in a minute: %v", err)
	}
	other := req("5", "demo_free", `{"text":"x"}`, nil)
	other.Client = "client-2"
	if _, err := h.v.CallItem(context.Background(), other); err != nil {
		t.Fatalf("another client was limited: %v", err)
	}
	// Anonymous clients are told apart by their source address.
	for i, src := range []string{"ip:10.0.0.1", "ip:10.0.0.1", "ip:10.0.0.1", "ip:10.0.0.2"} {
		r := req(fmt.Sprint("a", i), "demo_free", `{"text":"x"}`, nil)
		r.Client, r.Anonymous, r.Source = "anonymous", true, src
		if _, err := h.v.CallItem(context.Background(), r); err != nil {
			t.Fatalf("anonymous %d: %v", i, err)
		}
	}
	r := req("a9", "demo_free", `{"text":"x"}`, nil)
	r.Client, r.Anonymous, r.Source = "anonymous", true, "ip:10.0.0.1"
	if _, err := h.v.CallItem(context.Background(), r); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("fourth anonymous call from one address: %v", err)
	}
}
