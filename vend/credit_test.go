package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

func withCredit(c *vend.Config) { c.Credit.Enabled = true }

// creditOf reads _meta["capvend/credit"] of an answer.
func creditOf(t testing.TB, body json.RawMessage) vend.CreditInfo {
	t.Helper()
	var r struct {
		Meta map[string]vend.CreditInfo `json:"_meta"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	info, ok := r.Meta[vend.MetaCredit]
	if !ok {
		t.Fatalf("no _meta[%q] in %s", vend.MetaCredit, body)
	}
	return info
}

// buyCredit tops up (a new account if r.Credit and r.CreditSelf are
// unset) with sats, paying the invoice, and returns the answer's credit.
func (h *harness) buyCredit(t testing.TB, r vend.CallRequest, sats int) vend.CreditInfo {
	t.Helper()
	r.Name, r.Arguments = vend.TopUpTool, json.RawMessage(fmt.Sprintf(`{"sats":%d}`, sats))
	ch := h.callAsync(r)
	p := h.nextPayment(t)
	if p.Amount != vend.Msat(sats*1000) {
		t.Fatalf("top-up invoice of %d msat for %d sats", p.Amount, sats)
	}
	h.be.pay(p.Ref)
	o := result(t, ch)
	if o.err != nil || o.res.IsError {
		t.Fatalf("top-up: %s %v", o.res.Body, o.err)
	}
	info := creditOf(t, o.res.Body)
	if r.CreditSelf { // a Nostr key's own account: no token spends it without the key
		if info.Token != "" || strings.Contains(string(o.res.Body), "cvc_") {
			t.Fatalf("a key account's top-up answered with a token: %s", o.res.Body)
		}
		return info
	}
	if info.Token == "" || !strings.Contains(string(o.res.Body), info.Token) {
		t.Fatalf("top-up answer lacks the token in its text: %s", o.res.Body)
	}
	return info
}

// TestCreditBuysFiveCallsAt21Sats: 100 sats bought; four calls at 21 sats
// are paid from credit with no payment request; the fifth is refused as
// exhausted, with what to top up, and nothing runs for it.
func TestCreditBuysFiveCallsAt21Sats(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, true, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 100)
	if info.Balance != 100 || info.BalanceMsat != 100_000 {
		t.Fatalf("after top-up: %+v", info)
	}
	for i := range 4 {
		r := req(fmt.Sprint("c", i), "demo_echo", `{"text":"hi"}`, nil)
		r.Credit = info.Token
		res, err := h.v.CallItem(ctx, r)
		if err != nil || !strings.Contains(string(res.Body), "echo:hi") {
			t.Fatalf("call %d: %s %v", i, res.Body, err)
		}
		if got := creditOf(t, res.Body); got.Balance != int64(100-21*(i+1)) || got.Token != "" || got.Account != info.Account {
			t.Fatalf("call %d: credit %+v", i, got)
		}
	}
	select {
	case p := <-h.be.last:
		t.Fatalf("a credit call asked for a payment: %+v", p)
	default:
	}
	r := req("c4", "demo_echo", `{"text":"hi"}`, nil)
	r.Credit = info.Token
	_, err := h.v.CallItem(ctx, r)
	var ex *vend.CreditExhaustedError
	if !errors.As(err, &ex) || ex.Balance != 16_000 || ex.TopUpSats() != 5 || ex.Account != info.Account {
		t.Fatalf("fifth call: %v", err)
	}
	if n := h.tools.count("echo"); n != 4 {
		t.Fatalf("echo ran %d times, want 4", n)
	}
	// Its replay gets its stored answer and draws nothing again.
	r = req("c0", "demo_echo", `{"text":"hi"}`, nil)
	r.Credit = info.Token
	if res, err := h.v.CallItem(ctx, r); err != nil || creditOf(t, res.Body).Balance != 16 || h.tools.count("echo") != 4 {
		t.Fatalf("replay: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestConcurrentCreditCallsOnTheLast21Sats: eight calls at once on 21
// sats: one runs, seven are told to top up.
func TestConcurrentCreditCallsOnTheLast21Sats(t *testing.T) {
	h := newHarness(t, false, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 21)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		r := req(fmt.Sprint("c", i), "demo_echo", fmt.Sprintf(`{"text":"%d"}`, i), nil)
		r.Credit = info.Token
		wg.Go(func() { _, errs[i] = h.v.CallItem(context.Background(), r) })
	}
	wg.Wait()
	ran, refused := 0, 0
	for _, err := range errs {
		var ex *vend.CreditExhaustedError
		switch {
		case err == nil:
			ran++
		case errors.As(err, &ex):
			refused++
		default:
			t.Fatalf("unexpected: %v", err)
		}
	}
	if ran != 1 || refused != 7 || h.tools.count("echo") != 1 {
		t.Fatalf("ran %d, refused %d, upstream ran %d", ran, refused, h.tools.count("echo"))
	}
	verify(t, h.l)
}

// TestFailedCreditCallGivesItsDrawBack: a tool that fails costs nothing.
func TestFailedCreditCallGivesItsDrawBack(t *testing.T) {
	h := newHarness(t, false, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 30)
	r := req("f", "demo_fail", `{"text":"x"}`, nil)
	r.Credit = info.Token
	res, err := h.v.CallItem(context.Background(), r)
	if err != nil || !res.IsError {
		t.Fatalf("%s %v", res.Body, err)
	}
	if got := creditOf(t, res.Body); got.BalanceMsat != 30_000 {
		t.Fatalf("balance after a failed call %+v, want 30 sats", got)
	}
	verify(t, h.l)
}

// TestCreditTokensAreBoundToTheirAccount: a forged or altered token, or
// one naming another account with the wrong MAC, pays nothing and records
// nothing; a Nostr client's own account needs no token.
func TestCreditTokensAreBoundToTheirAccount(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 50)
	forged := []string{
		flipLast(info.Token),
		strings.Replace(info.Token, info.Account, "t"+strings.Repeat("0", 24), 1),
		"cvc_" + info.Account,
		"garbage",
	}
	for i, tok := range forged {
		r := req(fmt.Sprint("x", i), "demo_echo", `{"text":"hi"}`, nil)
		r.Credit = tok
		var ip *vend.InvalidParamsError
		if _, err := h.v.CallItem(ctx, r); !errors.As(err, &ip) {
			t.Fatalf("token %q: %v", tok, err)
		}
	}
	if _, err := h.l.CallByRequest(ctx, "test", "client-1", "x0"); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("a refused token recorded a call: %v", err)
	}
	// The token in the argument capvend_credit: stripped before anything
	// else sees the arguments.
	r := req("arg", "demo_echo", `{"text":"a","capvend_credit":"`+info.Token+`"}`, nil)
	if res, err := h.v.CallItem(ctx, r); err != nil || creditOf(t, res.Body).Balance != 29 {
		t.Fatalf("argument token: %s %v", res.Body, err)
	}
	if sent := h.tools.sentArgs(); sent[len(sent)-1] != `echo {"text":"a"}` {
		t.Fatalf("upstream got %q", sent[len(sent)-1])
	}
	// A Nostr client's own account: its pubkey, proven by the front.
	nostr := req("n-topup", "", "", nil)
	nostr.Client, nostr.CreditSelf = strings.Repeat("ab", 32), true
	own := h.buyCredit(t, nostr, 21)
	if own.Account != vend.NostrAccount(nostr.Client) {
		t.Fatalf("Nostr top-up credited %s", own.Account)
	}
	nostr.RequestID, nostr.Name, nostr.Arguments = "n1", "demo_echo", json.RawMessage(`{"text":"n"}`)
	if res, err := h.v.CallItem(ctx, nostr); err != nil || creditOf(t, res.Body).Balance != 0 {
		t.Fatalf("Nostr credit call: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestInterruptedCreditCallsAfterRestart: a credit call a crash left
// executing is run again if idempotent, given back if not; the books
// agree after the restart.
func TestInterruptedCreditCallsAfterRestart(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 100)
	drawn := func(id string, idempotent bool) vend.Call {
		args := `{"text":"` + id + `"}`
		c, _, err := h.l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "client-1", RequestID: id, Server: "demo", Kind: vend.ItemTool,
			Name: "echo", ArgsHash: argsHash(t, "tools/call", "demo_echo", args), Price: 21_000, Idempotent: idempotent,
			ExposedName: "demo_echo", Arguments: []byte(args)})
		if err != nil {
			t.Fatal(err)
		}
		if c, _, err = h.l.DrawCredit(ctx, c.ID, info.Account, c.Binding(), c.Released(vend.SchemeCreditToken)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	again, back := drawn("again", true), drawn("back", false)
	h2 := harnessOn(t, h.l, false, withCredit) // the restart
	waitState(t, h2.l, again.ID, vend.CallDelivered)
	waitState(t, h2.l, back.ID, vend.CallRefunded)
	if b, err := h.l.CreditBalance(ctx, info.Account); err != nil || b != 79_000 {
		t.Fatalf("balance %d (%v), want 79000: one delivered, one given back", b, err)
	}
	verify(t, h.l)
}

// TestTopUpIsListedAndBounded: the top-up tool is listed when credit is
// on (not otherwise), and refuses amounts out of bounds before anything
// is recorded.
func TestTopUpIsListedAndBounded(t *testing.T) {
	listed := func(h *harness) bool {
		for _, tl := range h.v.Tools() {
			if tl.Name == vend.TopUpTool {
				return tl.Price == 1000
			}
		}
		return false
	}
	if off := newHarness(t, false, nil); listed(off) {
		t.Fatal("top-up listed with credit off")
	}
	h := newHarness(t, false, func(c *vend.Config) { c.Credit.Enabled, c.Credit.MaxTopUp = true, 500_000 })
	if !listed(h) {
		t.Fatal("top-up not listed")
	}
	for i, args := range []string{`{"sats":0}`, `{"sats":501}`, `{"sats":-3}`, `{"sats":"9"}`, `{}`} {
		var ip *vend.InvalidParamsError
		if _, err := h.v.CallItem(context.Background(), req(fmt.Sprint(i), vend.TopUpTool, args, nil)); !errors.As(err, &ip) {
			t.Fatalf("%s: %v", args, err)
		}
	}
	accts, err := h.l.CreditAccounts(context.Background(), "")
	if err != nil || len(accts) != 0 {
		t.Fatalf("accounts %v %v", accts, err)
	}
}

var _ vend.CreditLedger = (*ledger.Ledger)(nil)

// TestTopUpEntryPointPaidByPreimage: the entry point for other payment
// fronts: quote, pay the invoice, repeat with its preimage: credited
// once; the same proof again credits nothing.
func TestTopUpEntryPointPaidByPreimage(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, withCredit)
	tr := vend.TopUpRequest{Transport: "l402", Client: "anonymous", RequestID: "1", Sats: 40}
	_, err := h.v.TopUp(ctx, tr)
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || pr.Amount != 40_000 {
		t.Fatalf("first: %v", err)
	}
	p := h.nextPayment(t)
	h.be.pay(p.Ref)
	h.be.mu.Lock()
	tr.RequestID, tr.PaymentProof = "2", h.be.preimages[p.Ref]
	h.be.mu.Unlock()
	info, err := h.v.TopUp(ctx, tr)
	if err != nil || info.BalanceMsat != 40_000 || info.Token == "" {
		t.Fatalf("paid: %+v %v", info, err)
	}
	tr.RequestID = "3"
	if _, err := h.v.TopUp(ctx, tr); err == nil {
		t.Fatal("the same payment credited twice")
	}
	if b, _ := h.l.CreditBalance(ctx, info.Account); b != 40_000 {
		t.Fatalf("balance %d", b)
	}
	verify(t, h.l)
}

// flipLast changes a token's last hex digit (to another one, always).
func flipLast(tok string) string {
	last := "0"
	if strings.HasSuffix(tok, "0") {
		last = "1"
	}
	return tok[:len(tok)-1] + last
}
