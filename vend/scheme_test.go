package vend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/capvend/capvend/vend"
)

// paidGrant has client's explicit-gating call r quoted and paid (a plain
// invoice), and returns the invoice's preimage: what every routing hop
// learned at settlement.
func (h *harness) paidGrant(t *testing.T, r vend.CallRequest) string {
	t.Helper()
	r.Explicit = true
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) {
		t.Fatalf("quote: %v", err)
	}
	p := h.nextPayment(t)
	if p.Kind != vend.KindInvoice {
		t.Fatalf("explicit gating issued a %s", p.Kind)
	}
	h.be.pay(p.Ref)
	h.be.mu.Lock()
	defer h.be.mu.Unlock()
	return h.be.preimages[p.Ref]
}

// TestPreimageOfAnotherClientReleasesNothing (issue 26, hole 1): a plain
// invoice's preimage is learned by every routing hop; presented by
// another client, or by a client without an identity, it releases
// nothing (that request is quoted anew), and the quoted client's own
// repeat still gets its call.
func TestPreimageOfAnotherClientReleasesNothing(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, true, nil)
	mine := req("a1", "demo_echo", `{"text":"p1"}`, nil)
	pre := h.paidGrant(t, mine)
	for _, thief := range []struct {
		name      string
		transport string
		client    string
		anonymous bool
	}{
		{"another session", "test", "client-2", false},
		{"another transport", "nostr", "client-1", false},
		{"no identity", "test", "client-1", true},
	} {
		r := req("b-"+thief.name, "demo_echo", `{"text":"p1"}`, nil)
		r.Transport, r.Client, r.Anonymous = thief.transport, thief.client, thief.anonymous
		r.Explicit, r.PaymentProof = true, pre
		var pr *vend.PaymentRequiredError
		if res, err := h.v.CallItem(ctx, r); !errors.As(err, &pr) {
			t.Fatalf("%s with the preimage: %s %v", thief.name, res.Body, err)
		}
		h.nextPayment(t) // its own quote
	}
	if n := h.tools.count("echo"); n != 0 {
		t.Fatalf("ran %d times for others", n)
	}
	mine.RequestID, mine.Explicit, mine.PaymentProof = "a2", true, pre
	if res, err := h.v.CallItem(ctx, mine); err != nil || !strings.Contains(string(res.Body), "echo:p1") {
		t.Fatalf("the quoted client's repeat: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestTopUpPreimageOfAnotherClientHandsOverNoToken (issue 26, hole 1): a
// refill of an existing account by explicit gating, paid by a plain
// invoice: another client presenting its preimage with the same top-up
// gets its own quote, never the account's credit token.
func TestTopUpPreimageOfAnotherClientHandsOverNoToken(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, true, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 50)
	refill := req("topup-2", vend.TopUpTool, `{"sats":10}`, nil)
	refill.Credit = info.Token
	pre := h.paidGrant(t, refill)
	thief := req("x", vend.TopUpTool, `{"sats":10}`, nil)
	thief.Client, thief.Explicit, thief.PaymentProof = "client-2", true, pre
	res, err := h.v.CallItem(ctx, thief)
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || strings.Contains(string(res.Body), "cvc_") {
		t.Fatalf("the thief's top-up: %s %v", res.Body, err)
	}
	h.nextPayment(t)
	refill.RequestID, refill.Explicit, refill.PaymentProof = "topup-3", true, pre
	res, err = h.v.CallItem(ctx, refill)
	if err != nil || creditOf(t, res.Body).BalanceMsat != 60_000 || creditOf(t, res.Body).Token != info.Token {
		t.Fatalf("the owner's repeat: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestPublicChannelCarriesNoSecret (issue 26, hole 2): a request on a
// public channel (a plaintext Nostr event) that carries a bearer secret is
// refused before anything is recorded or spent, with an error naming
// encryption; one whose answer would hand back a credit token is refused
// too; a key account's top-up and calls work there, with no token.
func TestPublicChannelCarriesNoSecret(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, withCredit)
	info := h.buyCredit(t, req("topup-1", "", "", nil), 50)
	key := strings.Repeat("cd", 32)
	for i, tc := range []struct {
		name string
		mod  func(*vend.CallRequest)
	}{
		{"cashu token", func(r *vend.CallRequest) { r.CashuToken = "good:21" }},
		{"credit token", func(r *vend.CallRequest) { r.Credit = info.Token }},
		{"credit token argument", func(r *vend.CallRequest) { r.Arguments = []byte(`{"text":"x","capvend_credit":"` + info.Token + `"}`) }},
		{"payment token", func(r *vend.CallRequest) { r.PaymentToken = "cvp_" + strings.Repeat("0", 40) }},
		{"payment token argument", func(r *vend.CallRequest) {
			r.Arguments = []byte(`{"text":"x","capvend_payment":"cvp_` + strings.Repeat("0", 40) + `"}`)
		}},
		{"preimage", func(r *vend.CallRequest) { r.Explicit, r.PaymentProof = true, strings.Repeat("ab", 32) }},
		{"top-up of a new token account", func(r *vend.CallRequest) { r.Name, r.Arguments = vend.TopUpTool, []byte(`{"sats":5}`) }},
		{"free call with a cashu token", func(r *vend.CallRequest) { r.Name, r.CashuToken = "demo_free", "good:21" }},
	} {
		r := req(fmt.Sprint("pub", i), "demo_echo", `{"text":"x"}`, nil)
		r.Client, r.Public = key, true
		tc.mod(&r)
		_, err := h.v.CallItem(ctx, r)
		if !errors.Is(err, vend.ErrPublicSecret) || !strings.Contains(err.Error(), "encrypted") {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := h.l.CallByRequest(ctx, "test", key, r.RequestID); !errors.Is(err, vend.ErrNotFound) {
			t.Fatalf("%s: a refused request recorded a call: %v", tc.name, err)
		}
	}
	if n := h.tools.count("echo") + h.tools.count("free"); n != 0 {
		t.Fatalf("refused requests ran %d times", n)
	}
	if b, _ := h.l.CreditBalance(ctx, info.Account); b != 50_000 {
		t.Fatalf("balance %d after refused requests", b)
	}
	// The key's own account: a plaintext top-up and call, no token.
	own := req("pub-topup", "", "", nil)
	own.Client, own.Public, own.CreditSelf = key, true, true
	got := h.buyCredit(t, own, 30)
	if got.Token != "" {
		t.Fatalf("key account top-up: %+v", got)
	}
	call := req("pub-call", "demo_echo", `{"text":"own"}`, nil)
	call.Client, call.Public, call.CreditSelf = key, true, true
	res, err := h.v.CallItem(ctx, call)
	if err != nil || creditOf(t, res.Body).BalanceMsat != 9_000 || strings.Contains(string(res.Body), "cvc_") {
		t.Fatalf("key account call: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestKeyAccountHasNoToken (issue 26, hole 2): a token naming a Nostr
// key's account, even one made with the ledger's own key (as earlier
// versions handed out), spends nothing: only requests signed by the key
// do.
func TestKeyAccountHasNoToken(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, withCredit)
	own := req("topup", "", "", nil)
	own.Client, own.CreditSelf = strings.Repeat("ef", 32), true
	h.buyCredit(t, own, 30)
	key, err := h.l.CreditKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := req("steal", "demo_echo", `{"text":"x"}`, nil)
	r.Client, r.Credit = "client-2", vend.CreditToken(key, vend.NostrAccount(own.Client))
	var ip *vend.InvalidParamsError
	if _, err := h.v.CallItem(ctx, r); !errors.As(err, &ip) || !errors.Is(err, vend.ErrCreditToken) && !strings.Contains(err.Error(), "signed by its key") {
		t.Fatalf("a token of a key account: %v", err)
	}
	if b, _ := h.l.CreditBalance(ctx, vend.NostrAccount(own.Client)); b != 30_000 {
		t.Fatalf("balance %d", b)
	}
}

// TestReleaseCheckFollowsTheTable: a release to the call's own client
// passes for every scheme; to another client only for a bearer one.
func TestReleaseCheckFollowsTheTable(t *testing.T) {
	c := vend.NewCall{Transport: "test", Client: "a"}
	for _, s := range vend.Schemes() {
		own := vend.Release{Scheme: s.Name, Transport: "test", Client: "a"}
		other := vend.Release{Scheme: s.Name, Transport: "test", Client: "b"}
		if err := own.Check(c); err != nil {
			t.Errorf("%s to the call's own client: %v", s.Name, err)
		}
		if err := other.Check(c); (err == nil) != s.Bearer {
			t.Errorf("%s (bearer %v) to another client: %v", s.Name, s.Bearer, err)
		}
	}
	if err := (vend.Release{Scheme: "made-up", Transport: "test", Client: "a"}).Check(c); err == nil {
		t.Error("an unknown scheme passed")
	}
}

// TestDocsShowTheSchemeTable: the "Ways to pay" table of
// docs/ARCHITECTURE.md is the code's (vend.SchemesMarkdown): the docs
// cannot drift from the table that is enforced.
func TestDocsShowTheSchemeTable(t *testing.T) {
	const doc = "../docs/ARCHITECTURE.md"
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), vend.SchemesMarkdown()) {
		t.Fatalf("%s's Ways to pay table differs from vend.SchemesMarkdown(); put this in:\n%s", doc, vend.SchemesMarkdown())
	}
}

// TestPlaintextRepeatOfATopUpGetsNoToken: a key pays a top-up of a token
// account it asked for encrypted, then repeats it in plaintext: the grant
// is its own, but the answer would carry the account's token in a public
// event, so the repeat is refused naming encryption (the cross-product
// found this), and the encrypted repeat still gets the token.
func TestPlaintextRepeatOfATopUpGetsNoToken(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, true, withCredit)
	r := req("t1", vend.TopUpTool, `{"sats":10}`, nil)
	r.Client = strings.Repeat("ab", 32)
	h.paidGrant(t, r)
	plain := r
	plain.RequestID, plain.Explicit, plain.Public = "t2", true, true
	if res, err := h.v.CallItem(ctx, plain); !errors.Is(err, vend.ErrPublicSecret) {
		t.Fatalf("plaintext repeat: %s %v", res.Body, err)
	}
	r.RequestID, r.Explicit = "t3", true
	if res, err := h.v.CallItem(ctx, r); err != nil || creditOf(t, res.Body).Token == "" {
		t.Fatalf("encrypted repeat: %s %v", res.Body, err)
	}
	verify(t, h.l)
}
