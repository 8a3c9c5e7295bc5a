package vend_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/capvend/capvend/vend"
)

// mppToken is the Authorization: Payment token lightning-tools 9.0.1
// builds (buildMppCredential): base64url, no padding, of the JCS object
// {challenge: {echoed auth-params}, payload: {preimage}}.
func mppToken(ch *vend.MPPChallenge, preimage string) string {
	echo := map[string]string{"id": ch.ID, "intent": ch.Intent, "method": ch.Method, "realm": ch.Realm, "request": ch.Request}
	if ch.Expires != "" {
		echo["expires"] = ch.Expires
	}
	b, _ := json.Marshal(map[string]any{"challenge": echo, "payload": map[string]string{"preimage": preimage}})
	return base64.RawURLEncoding.EncodeToString(b)
}

// x402Payload is the payment payload lightning-tools 9.0.1 builds
// (buildX402PaymentSignature), before its base64.
func x402Payload(req *vend.X402Requirements) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"x402Version": 2, "scheme": req.Scheme, "network": req.Network,
		"payload": map[string]string{"invoice": req.Extra.Invoice}, "accepted": req})
	return b
}

// TestMPPReleasesItsCallOnce: an HTTP 402 request's payment-required
// answer carries an MPP Lightning charge challenge for its invoice (amount
// in sats, currency sat, the invoice and its payment hash); the
// credential with the preimage, presented before the backend reported
// the payment, waits for it and runs the call once. The same credential
// again, for other arguments, or with a forged id or the wrong preimage
// runs nothing.
func TestMPPReleasesItsCallOnce(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, nil)
	args := `{"text":"mpp"}`
	pr, p, pre := challenge(t, h, "1", args)
	ch := pr.MPP
	if ch == nil || ch.Method != "lightning" || ch.Intent != "charge" || ch.Realm != "capvend" || ch.ID == "" || ch.Expires == "" {
		t.Fatalf("challenge %+v", ch)
	}
	rb, _ := base64.RawURLEncoding.DecodeString(ch.Request)
	var req struct {
		Amount, Currency string
		MethodDetails    struct{ Invoice, PaymentHash string }
	}
	if json.Unmarshal(rb, &req) != nil || req.Amount != "21" || req.Currency != "sat" || req.MethodDetails.Invoice != p.Bolt11 ||
		req.MethodDetails.PaymentHash != p.Ref || !strings.HasPrefix(string(rb), `{"amount":"21","currency":"sat","description":`) {
		t.Fatalf("request %s", rb)
	}

	retry := func(id, args, token string) vend.CallRequest {
		r := l402Req(id, args)
		r.MPP = token
		return r
	}
	forged := *ch
	forged.ID = base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	for name, r := range map[string]vend.CallRequest{
		"wrong preimage": retry("x1", args, mppToken(ch, strings.Repeat("00", 32))),
		"forged id":      retry("x2", args, mppToken(&forged, pre)),
		"not base64url":  retry("x3", args, "!!"),
		"other args":     retry("x4", `{"text":"other"}`, mppToken(ch, pre)),
	} {
		if _, err := h.v.CallItem(ctx, r); !errors.Is(err, vend.ErrMPPInvalid) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	o := h.callAsync(retry("1", args, mppToken(ch, pre)))
	h.be.pay(p.Ref)
	if res := result(t, o); res.err != nil || !strings.Contains(string(res.res.Body), "echo:mpp") {
		t.Fatalf("paid retry: %s %v", res.res.Body, res.err)
	}
	if _, err := h.v.CallItem(ctx, retry("2", args, mppToken(ch, pre))); !errors.Is(err, vend.ErrTokenUsed) {
		t.Fatalf("replay: %v", err)
	}
	if n := len(h.tools.sentArgs()); n != 1 {
		t.Fatalf("ran %d times", n)
	}
	verify(t, h.l)
}

// TestX402ReleasesItsCallToItsClientOnce: the same answer carries x402
// requirements (exact, the regtest network, the amount in msat, extra:
// paymentMethod lightning and the invoice). The payload naming the paid
// invoice releases the call once to the client it was quoted to; for
// another client it releases nothing (a quote of its own); for other
// arguments, another amount or a changed invoice it is refused; a payload
// for an invoice still unpaid waits for its report.
func TestX402ReleasesItsCallToItsClientOnce(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, nil)
	args := `{"text":"x402"}`
	mine := func(id, args string, payload json.RawMessage) vend.CallRequest {
		r := req(id, "demo_echo", args, nil)
		r.Client, r.L402, r.X402 = "session-a", true, payload
		return r
	}
	_, err := h.v.CallItem(ctx, mine("1", args, nil))
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || pr.X402 == nil {
		t.Fatalf("unpaid call: %v", err)
	}
	p := h.nextPayment(t)
	x := pr.X402
	if x.Scheme != "exact" || x.Extra.PaymentMethod != "lightning" || x.Extra.Invoice != p.Bolt11 || x.Amount != "21000" ||
		x.Asset != "BTC" || x.Network != "bip122:0f9188f13cb7b2c71f2a335e3a4fc328" || x.MaxTimeoutSeconds <= 0 {
		t.Fatalf("requirements %+v", x)
	}
	cheap := *x
	cheap.Amount = "1000"
	swapped := *x
	swapped.Extra.Invoice = "lnbcrt1other"
	for name, r := range map[string]vend.CallRequest{
		"other args":     mine("x1", `{"text":"other"}`, x402Payload(x)),
		"another amount": mine("x2", args, x402Payload(&cheap)),
		"swapped":        mine("x3", args, x402Payload(&swapped)),
		"version 1":      mine("x4", args, json.RawMessage(strings.Replace(string(x402Payload(x)), `"x402Version":2`, `"x402Version":1`, 1))),
	} {
		if _, err := h.v.CallItem(ctx, r); !errors.Is(err, vend.ErrX402Invalid) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	o := h.callAsync(mine("1", args, x402Payload(x)))
	h.be.pay(p.Ref)
	if res := result(t, o); res.err != nil || !strings.Contains(string(res.res.Body), "echo:x402") {
		t.Fatalf("paid retry: %s %v", res.res.Body, res.err)
	}
	thief := mine("t1", args, x402Payload(x))
	thief.Client = "session-b"
	if _, err := h.v.CallItem(ctx, thief); !errors.Is(err, vend.ErrTokenUsed) {
		t.Fatalf("another client after the run: %v", err)
	}
	if _, err := h.v.CallItem(ctx, mine("2", args, x402Payload(x))); !errors.Is(err, vend.ErrTokenUsed) {
		t.Fatalf("replay: %v", err)
	}

	// Another client presenting a payload for a paid call not yet run:
	// bound, it releases nothing (its own quote).
	_, err = h.v.CallItem(ctx, mine("3", `{"text":"y"}`, nil))
	if !errors.As(err, &pr) {
		t.Fatal(err)
	}
	p2 := h.nextPayment(t)
	h.be.pay(p2.Ref)
	thief = mine("t2", `{"text":"y"}`, x402Payload(pr.X402))
	thief.Client = "session-b"
	if _, err := h.v.CallItem(ctx, thief); !errors.As(err, new(*vend.PaymentRequiredError)) {
		t.Fatalf("another client: %v", err)
	}
	h.nextPayment(t)
	if n := len(h.tools.sentArgs()); n != 1 {
		t.Fatalf("ran %d times", n)
	}
	if res, err := h.v.CallItem(ctx, mine("4", `{"text":"y"}`, x402Payload(pr.X402))); err != nil || !strings.Contains(string(res.Body), "echo:y") {
		t.Fatalf("its own client: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestPublicChannelRefusesMPPAndX402: on a plaintext Nostr request either
// credential is refused naming encryption, and no answer there carries a
// challenge.
func TestPublicChannelRefusesMPPAndX402(t *testing.T) {
	h := newHarness(t, false, nil)
	for name, mod := range map[string]func(*vend.CallRequest){
		"mpp":  func(r *vend.CallRequest) { r.MPP = "e30" },
		"x402": func(r *vend.CallRequest) { r.X402 = json.RawMessage(`{}`) },
	} {
		r := req("p-"+name, "demo_echo", `{"text":"x"}`, nil)
		r.Client, r.Public = strings.Repeat("ab", 32), true
		mod(&r)
		if _, err := h.v.CallItem(context.Background(), r); !errors.Is(err, vend.ErrPublicSecret) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// TestBolt11PaymentHash reads the p field of a real regtest invoice
// (BOLT 11's test vector, on mainnet).
func TestBolt11PaymentHash(t *testing.T) {
	const inv = "lnbc2500u1pvjluezsp5zyg3zyg3zyg3zyg3zyg3zyg3zyg3zyg3zyg3zyg3zyg3zyg3zygspp5qqqsyqcyq5rqwzqfqqqsyqcyq5rqwzqfqqqsyqcyq5rqwzqfqypqdq5xysxxatsyp3k7enxv4jsxqzpu9qrsgquk0rl77nj30yxdy8j9vdx85fkpmdla2087ne0xh8nhedh8w27kyke0lp53ut353s06fv3qfegext0eh0ymjpf39tuven09sam30g4vgpfna3rh"
	h, err := vend.Bolt11PaymentHash(inv)
	if err != nil || h != "0001020304050607080900010203040506070809000102030405060708090102" {
		t.Fatalf("%s %v", h, err)
	}
	if _, err := vend.Bolt11PaymentHash("lnbcrt-fake-00"); err == nil {
		t.Fatal("a fake invoice decoded")
	}
}

// FuzzParseX402 never panics on a payload.
func FuzzParseX402(f *testing.F) {
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"exact","extra":{"paymentMethod":"lightning","invoice":"lnbc1"}},"payload":{"invoice":"lnbc1"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := vend.ParseX402(b)
		if err == nil && p.Payload.Invoice != p.Accepted.Extra.Invoice {
			t.Fatal("accepted a swapped invoice")
		}
		_, _ = vend.Bolt11PaymentHash(string(b))
	})
}

// TestPayPageToken: an explicit-gating answer carries its call's page
// token (cvv_), which names that call, shows its invoice and amount and
// whether it was paid, and releases nothing: presented as a payment
// token it is unknown. A token changed in one character, or made for
// another call id, shows nothing.
func TestPayPageToken(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, nil)
	r := req("1", "demo_echo", `{"text":"page"}`, nil)
	r.Explicit, r.PaymentTokens = true, true
	_, err := h.v.CallItem(ctx, r)
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || !strings.HasPrefix(pr.PayPage, "cvv_") || pr.Token == "" {
		t.Fatalf("answer: %v %+v", err, pr)
	}
	p := h.nextPayment(t)
	pg, err := h.v.PayPage(ctx, pr.PayPage)
	if err != nil || pg.Invoice != p.Bolt11 || pg.Amount != 21_000 || pg.Tool != "demo_echo" || pg.Paid || pg.Expired {
		t.Fatalf("page %+v %v", pg, err)
	}
	forged := pr.PayPage[:len(pr.PayPage)-1] + map[bool]string{true: "A", false: "B"}[strings.HasSuffix(pr.PayPage, "B")]
	other, _ := h.v.PayPageToken(ctx, p.CallID+1)
	for _, tok := range []string{forged, other, pr.Token, "cvv_", ""} {
		if _, err := h.v.PayPage(ctx, tok); !errors.Is(err, vend.ErrPayPageUnknown) {
			t.Fatalf("%q: %v", tok, err)
		}
	}
	steal := req("2", "demo_echo", `{"text":"page"}`, nil)
	steal.Client, steal.PaymentToken = "client-2", pr.PayPage
	if _, err := h.v.CallItem(ctx, steal); !errors.Is(err, vend.ErrTokenUnknown) {
		t.Fatalf("the page token as a payment token: %v", err)
	}
	h.be.pay(p.Ref)
	if pg, err = h.v.PayPage(ctx, pr.PayPage); err != nil || !pg.Paid {
		t.Fatalf("paid page %+v %v", pg, err)
	}
	if n := len(h.tools.sentArgs()); n != 0 {
		t.Fatalf("ran %d times", n)
	}
}
