package vend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/capvend/capvend/vend"
)

// tokenReq is a call of a client without a session (a stock MCP host
// over protocol 2026-07-28, or one that cannot keep its session): explicit
// gating, payment tokens handed out.
func tokenReq(id, args string) vend.CallRequest {
	r := req(id, "demo_echo", args, nil)
	r.Client, r.Anonymous, r.Explicit, r.PaymentTokens = "anonymous", true, true, true
	return r
}

// withToken returns args (a JSON object) with capvend_payment set to tok.
func withToken(t *testing.T, args, tok string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		t.Fatal(err)
	}
	m[vend.PaymentArg] = tok
	b, _ := json.Marshal(m)
	return string(b)
}

// TestPaymentTokenReleasesItsGrantOnce: the payment-required answer
// carries a fresh token; the retry with the token in capvend_payment is
// pending until paid, then runs the call once, with the token stripped
// from what the upstream gets; the same token again is refused. The
// ledger keeps only the token's hash.
func TestPaymentTokenReleasesItsGrantOnce(t *testing.T) {
	h := newHarness(t, false, nil)
	args := `{"text":"tok"}`
	_, err := h.v.CallItem(context.Background(), tokenReq("1", args))
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) {
		t.Fatalf("first call: %v", err)
	}
	p := h.nextPayment(t)
	if !strings.HasPrefix(pr.Token, "cvp_") || len(pr.Token) < 4+32 || pr.Amount != 21_000 || pr.Invoice != p.Bolt11 ||
		!pr.ExpiresAt.Equal(p.ExpiresAt) {
		t.Fatalf("payment required: token %q amount %d invoice %q expires %v (payment %q %v)", pr.Token, pr.Amount, pr.Invoice,
			pr.ExpiresAt, p.Bolt11, p.ExpiresAt)
	}
	retry := withToken(t, args, pr.Token)

	var pp *vend.PaymentPendingError
	if _, err := h.v.CallItem(context.Background(), tokenReq("1", retry)); !errors.As(err, &pp) || pp.Token != pr.Token ||
		!pp.ExpiresAt.Equal(p.ExpiresAt) {
		t.Fatalf("retry before paying: %v %+v", err, pp)
	}
	h.be.pay(p.Ref)
	res, err := h.v.CallItem(context.Background(), tokenReq("1", retry))
	if err != nil || !strings.Contains(string(res.Body), "echo:tok") {
		t.Fatalf("retry after paying: %s %v", res.Body, err)
	}
	if _, err := h.v.CallItem(context.Background(), tokenReq("1", retry)); !errors.Is(err, vend.ErrTokenUsed) {
		t.Fatalf("third call with the same token: %v, want %v", err, vend.ErrTokenUsed)
	}
	if got := h.tools.sentArgs(); len(got) != 1 || got[0] != `echo {"text":"tok"}` {
		t.Fatalf("upstream got %q", got)
	}
	_, stored, _, err := h.l.CallArguments(context.Background(), p.CallID)
	if err != nil || string(stored) != `{"text":"tok"}` {
		t.Fatalf("recorded arguments %s %v", stored, err)
	}
	verify(t, h.l)
	h.l.Close()
	for _, f := range []string{h.l.Path(), h.l.Path() + "-wal"} {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, []byte(pr.Token)) || bytes.Contains(b, []byte(strings.TrimPrefix(pr.Token, "cvp_"))) {
			t.Fatalf("%s holds the token itself", f)
		}
	}
}

// TestPaymentTokenIsBoundToItsCall: a token releases only the call it was
// issued for: other arguments or another tool are refused and run
// nothing; unknown and expired tokens are refused; a non-string value is
// invalid params.
func TestPaymentTokenIsBoundToItsCall(t *testing.T) {
	h := newHarness(t, false, nil)
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), tokenReq("1", `{"text":"a"}`)); !errors.As(err, &pr) {
		t.Fatal(err)
	}
	h.be.pay(h.nextPayment(t).Ref)

	other := tokenReq("2", withToken(t, `{"text":"b"}`, pr.Token))
	if _, err := h.v.CallItem(context.Background(), other); !errors.Is(err, vend.ErrTokenMismatch) {
		t.Fatalf("other arguments: %v", err)
	}
	otherTool := tokenReq("3", withToken(t, `{"text":"a"}`, pr.Token))
	otherTool.Name = "demo_fail"
	if _, err := h.v.CallItem(context.Background(), otherTool); !errors.Is(err, vend.ErrTokenMismatch) {
		t.Fatalf("another tool: %v", err)
	}
	if _, err := h.v.CallItem(context.Background(), tokenReq("4", withToken(t, `{"text":"a"}`, "cvp_00"))); !errors.Is(err, vend.ErrTokenUnknown) {
		t.Fatalf("unknown token: %v", err)
	}
	var ip *vend.InvalidParamsError
	if _, err := h.v.CallItem(context.Background(), tokenReq("5", `{"text":"a","capvend_payment":7}`)); !errors.As(err, &ip) {
		t.Fatalf("a number as token: %v", err)
	}
	// null or "" is no token: a first call, quoted anew (stripped all the same).
	for i, v := range []string{`null`, `""`} {
		var again *vend.PaymentRequiredError
		if _, err := h.v.CallItem(context.Background(), tokenReq(fmt.Sprint("n", i), `{"text":"a","capvend_payment":`+v+`}`)); !errors.As(err, &again) ||
			again.Token == pr.Token {
			t.Fatalf("capvend_payment %s: %v", v, err)
		}
		if c, _, _, _ := h.l.CallArguments(context.Background(), h.nextPayment(t).CallID); c != "demo_echo" {
			t.Fatalf("call of capvend_payment %s: %q", v, c)
		}
	}
	meta := tokenReq("6", withToken(t, `{"text":"a"}`, pr.Token))
	meta.PaymentToken = "cvp_other"
	if _, err := h.v.CallItem(context.Background(), meta); !errors.As(err, &ip) {
		t.Fatalf("two different tokens: %v", err)
	}
	if n := h.tools.count("echo") + h.tools.count("fail"); n != 0 {
		t.Fatalf("ran %d times", n)
	}
	// The token in _meta works as well as the argument.
	meta = tokenReq("7", `{"text":"a"}`)
	meta.PaymentToken = pr.Token
	if res, err := h.v.CallItem(context.Background(), meta); err != nil || !strings.Contains(string(res.Body), "echo:a") {
		t.Fatalf("token in _meta: %s %v", res.Body, err)
	}

	// Expired unpaid: refused as expired (a payment-expired error).
	if _, err := h.v.CallItem(context.Background(), tokenReq("8", `{"text":"late"}`)); !errors.As(err, &pr) {
		t.Fatal(err)
	}
	h.be.expire(h.nextPayment(t).Ref)
	_, err := h.v.CallItem(context.Background(), tokenReq("9", withToken(t, `{"text":"late"}`, pr.Token)))
	if !errors.Is(err, vend.ErrTokenExpired) || !errors.Is(err, vend.ErrPaymentExpired) {
		t.Fatalf("expired token: %v", err)
	}
	if h.tools.count("echo") != 1 {
		t.Fatalf("ran %d times", h.tools.count("echo"))
	}
	verify(t, h.l)
}

// TestPaymentTokenRacesRunOnce: concurrent retries with one paid token:
// exactly one gets the result, every other is refused as used.
func TestPaymentTokenRacesRunOnce(t *testing.T) {
	h := newHarness(t, false, nil)
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), tokenReq("1", `{"text":"race"}`)); !errors.As(err, &pr) {
		t.Fatal(err)
	}
	h.be.pay(h.nextPayment(t).Ref)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := h.v.CallItem(context.Background(), tokenReq("1", withToken(t, `{"text":"race"}`, pr.Token)))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, vend.ErrTokenUsed):
			t.Errorf("retry: %v", err)
		}
	}
	if ok != 1 || h.tools.count("echo") != 1 {
		t.Fatalf("%d results, %d runs; want 1 and 1", ok, h.tools.count("echo"))
	}
	verify(t, h.l)
}

// TestNoTokenUnlessAsked: a front that hands out no tokens gets none, and
// nothing is stored for one.
func TestNoTokenUnlessAsked(t *testing.T) {
	h := newHarness(t, false, nil)
	r := tokenReq("1", `{"text":"x"}`)
	r.PaymentTokens = false
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) || pr.Token != "" {
		t.Fatalf("%v %+v", err, pr)
	}
}

// reservingTools offers, besides fakeTools', a tool whose schema declares
// capvend_payment itself.
type reservingTools struct{ *fakeTools }

func (r reservingTools) Tools() []vend.Item {
	return append(r.fakeTools.Tools(), vend.Item{Name: "demo_own", Server: "demo", UpstreamName: "own",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"capvend_payment":{"type":"string"}}}`)})
}

// TestToolDeclaringPaymentArgIsNotOffered: capvend could not tell such a
// tool's argument from a payment token, so it neither lists nor runs it.
func TestToolDeclaringPaymentArgIsNotOffered(t *testing.T) {
	h := newHarness(t, false, func(c *vend.Config) { c.Tools = reservingTools{&fakeTools{}} })
	for _, tool := range h.v.Tools() {
		if tool.Name == "demo_own" {
			t.Fatal("demo_own listed")
		}
	}
	if len(h.v.Tools()) != 3 {
		t.Fatalf("tools %v", h.v.Tools())
	}
	if _, err := h.v.CallItem(context.Background(), req("1", "demo_own", `{"capvend_payment":"x"}`, nil)); !errors.Is(err, vend.ErrUnknownTool) {
		t.Fatalf("call: %v", err)
	}
}

// TestCanceledTokenTellsTheClientNoOperatorDetail: the token of a call
// the operator's restore canceled is refused as canceled and owed back,
// and the refusal, which goes to whoever presents the token, carries none
// of the reason recorded in the books (it names the replica the ledger
// came from: a bucket, a host, a path).
func TestCanceledTokenTellsTheClientNoOperatorDetail(t *testing.T) {
	h := newHarness(t, false, nil)
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), tokenReq("1", `{"text":"a"}`)); !errors.As(err, &pr) {
		t.Fatal(err)
	}
	p := h.nextPayment(t)
	const secret = "s3://acme-books-7f3a/capvend/prod"
	if _, err := h.l.SettleRestored(context.Background(), "the ledger was restored from "+secret+" as of yesterday"); err != nil {
		t.Fatal(err)
	}
	h.be.pay(p.Ref) // paid after the restore: owed back, never run
	_, err := h.v.CallItem(context.Background(), tokenReq("2", withToken(t, `{"text":"a"}`, pr.Token)))
	if !errors.Is(err, vend.ErrTokenCanceled) || !strings.Contains(err.Error(), "owed back, never run") {
		t.Fatalf("token of a call the restore canceled: %v", err)
	}
	if strings.Contains(err.Error(), "acme") || strings.Contains(err.Error(), "restored from") {
		t.Fatalf("the refusal shows the books' reason: %v", err)
	}
	if n := h.tools.count("echo"); n != 0 {
		t.Fatalf("ran %d times", n)
	}
}
