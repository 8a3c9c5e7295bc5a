package vend_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// withPrices makes a harness use rules for the "demo" server.
func withPrices(t testing.TB, rules map[string]pricing.Rule) func(*vend.Config) {
	return func(c *vend.Config) { c.Prices = newBook(t, rules) }
}

// drain returns the payments requested within d.
func (h *harness) drain(d time.Duration) []vend.Payment {
	var ps []vend.Payment
	for {
		select {
		case p := <-h.be.last:
			ps = append(ps, p)
		case <-time.After(d):
			return ps
		}
	}
}

func TestFreeQuotaThenPriced(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"echo": {Price: 21_000, FreePerDay: 3}}))
	var chans []<-chan outcome
	for i := 0; i < 10; i++ {
		chans = append(chans, h.callAsync(req(fmt.Sprint("r", i), "demo_echo", `{"text":"hi"}`, nil)))
	}
	var ps []vend.Payment
	for len(ps) < 7 {
		ps = append(ps, h.nextPayment(t))
	}
	if more := h.drain(200 * time.Millisecond); len(more) != 0 {
		t.Fatalf("%d payments requested of 10 calls with 3 free", 7+len(more))
	}
	if n := h.tools.count("echo"); n != 3 {
		t.Fatalf("%d calls ran before any payment, want 3 free ones", n)
	}
	for _, p := range ps {
		if p.Amount != 21_000 {
			t.Fatalf("a call after the quota costs %d", p.Amount)
		}
		h.be.pay(p.Ref)
	}
	for _, ch := range chans {
		if o := result(t, ch); o.err != nil || !strings.Contains(string(o.res.Body), "echo:hi") {
			t.Fatalf("%s %v", o.res.Body, o.err)
		}
	}
	b, err := h.l.Balance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Tools) != 1 || b.Tools[0].Calls != 7 {
		t.Fatalf("journal: %+v (want 7 paid calls; free ones book nothing)", b.Tools)
	}
	verify(t, h.l)
}

func TestFreeQuotaReplayAndPricedReplay(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"echo": {Price: 21_000, FreePerDay: 1}}))
	ctx := context.Background()
	for i := 0; i < 3; i++ { // the first request and two replays of it
		if _, err := h.v.CallItem(ctx, req("free-1", "demo_echo", `{"text":"a"}`, nil)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case p := <-h.be.last:
		t.Fatalf("a replay of a free call was priced: %+v", p)
	default:
	}
	// The quota is one: a new request is priced, and so is its replay.
	ch := h.callAsync(req("paid-1", "demo_echo", `{"text":"b"}`, nil))
	p := h.nextPayment(t)
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}
	res, err := h.v.CallItem(ctx, req("paid-1", "demo_echo", `{"text":"b"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "echo:b") {
		t.Fatalf("replay of the paid call: %s %v", res.Body, err)
	}
	if n := h.tools.count("echo"); n != 4 { // three free runs (replays of free calls run again), one paid
		t.Fatalf("ran %d times", n)
	}
	verify(t, h.l)
}

func TestFreeQuotaOfAnonymousClientsIsBySource(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"echo": {Price: 21_000, FreePerDay: 2}}))
	anon := func(source string) vend.CallRequest {
		r := req("1", "demo_echo", `{"text":"x"}`, nil) // anonymous request ids collide
		r.Client, r.Anonymous, r.Source = "anonymous", true, source
		return r
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 2; i++ {
		if _, err := h.v.CallItem(ctx, anon("192.0.2.1")); err != nil {
			t.Fatal(err)
		}
	}
	// The same id from the same address again is not a replay: priced.
	ch := h.callAsync(anon("192.0.2.1"))
	if p := h.nextPayment(t); p.Amount != 21_000 {
		t.Fatalf("amount %d", p.Amount)
	}
	// Another address has its own quota.
	if _, err := h.v.CallItem(ctx, anon("192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if n := h.tools.count("echo"); n != 3 {
		t.Fatalf("ran %d times, want 3 free", n)
	}
	_ = ch // left waiting for its payment; the harness ends it
}

// paramsNotes records the payment_required notifications' params.
type paramsNotes struct {
	mu   sync.Mutex
	got  []any
	once sync.Once
	sent chan struct{} // closed at the first one
}

func newParamsNotes() *paramsNotes { return &paramsNotes{sent: make(chan struct{})} }

func (n *paramsNotes) notify(method string, params any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if method == vend.NotifyPaymentRequired {
		n.got = append(n.got, params)
		n.once.Do(func() { close(n.sent) })
	}
}

func (n *paramsNotes) required() []any {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]any(nil), n.got...)
}

func TestPaymentDescriptionSaysHowThePriceWasComputed(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"echo": {Price: 1000, Max: 50_000,
		Per: &pricing.Per{Kind: pricing.PerItem, Arg: "ids", Price: 2000}}}))
	const want = "demo_echo: 3 items of ids × 2 sat/item + 1 sat = 7 sat"
	n := newParamsNotes()
	r := req("1", "demo_echo", `{"text":"x","ids":[1,2,3]}`, nil)
	r.Notify = n.notify
	ch := h.callAsync(r)
	p := h.nextPayment(t)
	if p.Amount != 7000 {
		t.Fatalf("amount %d", p.Amount)
	}
	select {
	case <-n.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("no payment_required")
	}
	got := n.required()
	if len(got) != 1 || got[0].(vend.PaymentOption).Description != want || got[0].(vend.PaymentOption).Amount != 7 {
		t.Fatalf("payment_required %+v, want description %q", got, want)
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}

	// Explicit gating: the -32042 options carry it too (Lightning and Cashu).
	r = req("2", "demo_echo", `{"text":"x","ids":[1,2,3]}`, nil)
	r.Explicit = true
	_, err := h.v.CallItem(context.Background(), r)
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || len(pr.Options) != 2 {
		t.Fatalf("%v", err)
	}
	for _, o := range pr.Options {
		if !strings.HasPrefix(o.Description, want) {
			t.Errorf("%s option: %q, want %q", o.PMI, o.Description, want)
		}
	}
}

func TestUnpriceableArgumentsAreInvalidParams(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"echo": {Max: 50_000,
		Per: &pricing.Per{Kind: pricing.PerUnit, Arg: "n", Price: 1000}}}))
	for _, args := range []string{`{"text":"x","n":"3"}`, `{"text":"x","n":-2}`, `{"text":"x","n":[1]}`} {
		_, err := h.v.CallItem(context.Background(), req("a", "demo_echo", args, nil))
		var ip *vend.InvalidParamsError
		if !errors.As(err, &ip) || !strings.Contains(ip.Reason, "n must") {
			t.Errorf("%s: %v", args, err)
		}
	}
	if b, _ := h.l.Balance(context.Background()); b.Pending.AwaitingCalls != 0 {
		t.Fatalf("something was quoted: %+v", b.Pending)
	}
	// 2.5 units are 3; a missing argument is none: free.
	ch := h.callAsync(req("b", "demo_echo", `{"text":"x","n":2.5}`, nil))
	if p := h.nextPayment(t); p.Amount != 3000 {
		t.Fatalf("amount %d", p.Amount)
	} else {
		h.be.pay(p.Ref)
	}
	result(t, ch)
	if _, err := h.v.CallItem(context.Background(), req("c", "demo_echo", `{"text":"x"}`, nil)); err != nil {
		t.Fatal(err)
	}
	if n := h.tools.count("echo"); n != 2 {
		t.Fatalf("ran %d times", n)
	}
}

func TestSetPricesSwapsTheBook(t *testing.T) {
	h := newHarness(t, false, nil) // echo costs 21 sat
	price := func() vend.Msat {
		for _, tl := range h.v.Tools() {
			if tl.Name == "demo_echo" {
				return tl.Price
			}
		}
		t.Fatal("no demo_echo")
		return 0
	}
	if price() != 21_000 {
		t.Fatalf("listed %d", price())
	}
	old := h.callAsync(req("old", "demo_echo", `{"text":"x"}`, nil))
	p := h.nextPayment(t)

	h.v.SetPrices(newBook(t, map[string]pricing.Rule{"echo": {Price: 5000, Max: 40_000,
		Per: &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 1000}}}))
	if price() != 5000 {
		t.Fatalf("Tools lists %d after SetPrices", price())
	}
	if lo, hi := h.v.ListedPrice(vend.Item{Server: "demo", UpstreamName: "echo"}); lo != 5000 || hi != 40_000 {
		t.Fatalf("ListedPrice %d-%d", lo, hi)
	}
	// The call quoted before keeps its price.
	h.be.pay(p.Ref)
	if o := result(t, old); o.err != nil || p.Amount != 21_000 {
		t.Fatalf("%v amount %d", o.err, p.Amount)
	}
	// A new call is quoted from the new book.
	ch := h.callAsync(req("new", "demo_echo", `{"text":"x"}`, nil))
	if p := h.nextPayment(t); p.Amount != 6000 {
		t.Fatalf("new call costs %d, want 6000", p.Amount)
	} else {
		h.be.pay(p.Ref)
	}
	result(t, ch)
	verify(t, h.l)
}

func TestSetPricesConcurrentWithCalls(t *testing.T) {
	h := newHarness(t, false, nil)
	books := []*pricing.Book{
		newBook(t, map[string]pricing.Rule{"echo": {Price: 21_000}}),
		newBook(t, map[string]pricing.Rule{}), // echo free
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				h.v.SetPrices(books[i%2])
				h.v.Tools()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	for i := 0; i < 20; i++ {
		// Free or priced, depending on the book at that moment; a priced
		// one waits for a payment until ctx ends.
		_, err := h.v.CallItem(ctx, req(fmt.Sprint("c", i), "demo_echo", `{"text":"x"}`, nil))
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
