package redteam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

// Issue 26, "Who may release a paid call, and what may travel in the
// clear": the holes between the ways to pay.

// creditShop is the option line that sells prepaid credit.
const creditShop = "credit:\n  enabled: true\n"

// preimageOf pays bolt11 from the customer node and returns its preimage
// (hex): what every routing hop learned at settlement. An invoice of
// capvend's LND (a payment the ledger holds by its hash) is waited for
// until capvend recorded it settled: the customer's node knows first.
func preimageOf(t *testing.T, sh *shop, bolt11 string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := sh.s.Pay(ctx, bolt11)
	if err != nil {
		t.Fatalf("paying %.20s…: %v", bolt11, err)
	}
	hash, db := paymentHash(t, bolt11), openLedger(t, sh.db)
	state := func() string {
		var s string
		db.QueryRow(`SELECT state FROM payments WHERE ref = ?`, hash).Scan(&s)
		return s
	}
	if state() != "" {
		waitUntil(t, "capvend recorded the payment settled", func() bool { return state() == "settled" })
	}
	return res.Preimage
}

// withMeta is explicit gating's _meta with more keys.
func withMeta(kv ...any) map[string]any {
	m := explicit()
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// creditToken returns the credit token of a top-up's answer ("" if none).
func creditToken(m rpcMessage) string {
	var r struct {
		Meta map[string]struct {
			Token string `json:"token"`
		} `json:"_meta"`
	}
	json.Unmarshal(m.Result, &r)
	return r.Meta["capvend/credit"].Token
}

// TestPreimageOfAnotherClientHTTP is hole 1 over MCP HTTP: client A
// (127.0.0.1) pays an explicit-gating call and a refill of its credit
// account with plain invoices; client B (127.0.0.2, its own session, and
// then without a session) presents A's preimages with the same calls. B
// gets a quote of its own, never A's result or A's credit token; A's own
// repeats still get them.
func TestPreimageOfAnotherClientHTTP(t *testing.T) {
	t.Parallel()
	needLoopback(t, "127.0.0.2")
	sh := startShop(t, shopOpts{lnd: plainInvoices, top: creditShop})
	a, b := newHTTPClientFrom(t, sh, "127.0.0.1"), newHTTPClientFrom(t, sh, "127.0.0.2")
	sa, sb := a.initialize(), b.initialize()
	call := func(c *httpClient, sess string, id any, tool string, args, meta map[string]any, hdr http.Header) rpcMessage {
		t.Helper()
		m, err := c.tryRPC(sess, id, "tools/call", callParams(tool, args, meta), hdr)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	p1 := map[string]any{"text": "p1"}
	pre := preimageOf(t, sh, gatedInvoice(t, call(a, sa, 1, "sha256", p1, explicit(), nil)))
	waitUntil(t, "A's grant paid", func() bool { return callState(t, sh, 1) == "paid" })

	m := call(b, sb, 1, "sha256", p1, withMeta("capvend/preimage", pre), nil)
	if strings.Contains(string(m.Result), sha256Hex("p1")) {
		t.Fatalf("B (another session) got A's paid result with A's preimage: %s", m)
	}
	gatedInvoice(t, m) // a quote of B's own
	if m, err := b.tryModernCall(2, "sha256", p1, withMeta("capvend/preimage", pre), nil); err != nil ||
		strings.Contains(string(m.Result), sha256Hex("p1")) {
		t.Fatalf("B (no session) with A's preimage: %s %v", m, err)
	}
	if m := call(a, sa, 2, "sha256", p1, withMeta("capvend/preimage", pre), nil); !strings.Contains(string(m.Result), sha256Hex("p1")) {
		t.Fatalf("A's own repeat: %s", m)
	}

	// A's credit account, and a refill of it paid by a plain invoice.
	topUp := map[string]any{"sats": 10}
	inv := gatedInvoice(t, call(a, sa, 3, "capvend_topup", topUp, explicit(), nil))
	preimageOf(t, sh, inv)
	token := creditToken(call(a, sa, 4, "capvend_topup", topUp, explicit(), nil))
	if !strings.HasPrefix(token, "cvc_") {
		t.Fatal("A's top-up answered no credit token")
	}
	hdr := http.Header{"Capvend-Credit": {token}}
	pre = preimageOf(t, sh, gatedInvoice(t, call(a, sa, 5, "capvend_topup", topUp, explicit(), hdr)))
	m = call(b, sb, 6, "capvend_topup", topUp, withMeta("capvend/preimage", pre), nil)
	if strings.Contains(m.String(), token) || strings.Contains(m.String(), "cvc_") {
		t.Fatalf("B got a credit token with A's refill preimage: %s", m)
	}
	m = call(a, sa, 7, "capvend_topup", topUp, withMeta("capvend/preimage", pre), hdr)
	if creditToken(m) != token || !strings.Contains(string(m.Result), `"balance":20`) {
		t.Fatalf("A's refill: %s", m)
	}
}

// TestPreimageOfAnotherKeyNostr is hole 1 over ContextVM: key A pays an
// explicit-gating call; key B presents A's preimage with the same call
// (both gift wrapped). B gets its own -32042, A's repeat the result.
func TestPreimageOfAnotherKeyNostr(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{nostr: true, lnd: plainInvoices})
	a, b := dialNostr(t, sh), dialNostr(t, sh)
	a.waitReady()
	args := map[string]any{"text": "p2"}
	gated := func(c *nostrClient, id any, meta map[string]any) nostrMsg {
		t.Helper()
		return c.untilResponse(c.send(ctxvmWrapped, id, "tools/call", callParams("sha256", args, meta), explicitTag()), nil)
	}
	payReq := func(m nostrMsg) string {
		t.Helper()
		var d struct {
			Options []struct {
				PayReq string `json:"pay_req"`
			} `json:"payment_options"`
		}
		if m.Error == nil || m.Error.Code != -32042 || json.Unmarshal(m.Error.Data, &d) != nil || len(d.Options) == 0 || d.Options[0].PayReq == "" {
			t.Fatalf("want -32042 with an invoice, got %s", m)
		}
		return d.Options[0].PayReq
	}
	pre := preimageOf(t, sh, payReq(gated(a, 1, nil)))
	waitUntil(t, "A's grant paid", func() bool { return callState(t, sh, 1) == "paid" })
	m := gated(b, 1, map[string]any{"capvend/preimage": pre})
	if strings.Contains(string(m.Result), sha256Hex("p2")) {
		t.Fatalf("key B got key A's paid result with A's preimage: %s", m)
	}
	payReq(m)
	if m := gated(a, 2, nil); !strings.Contains(string(m.Result), sha256Hex("p2")) {
		t.Fatalf("A's own repeat: %s", m)
	}
}

// authored collects every event the shop's server key signs on the
// stack's relay while the test runs (ephemeral kinds are not stored: a
// live subscription sees them).
type authored struct {
	mu     sync.Mutex
	events []*nostr.Event
}

func watchAuthored(t *testing.T, sh *shop) *authored {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r, err := nostr.RelayConnect(ctx, sh.s.RelayURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	sub, err := r.Subscribe(ctx, nostr.Filters{{Authors: []string{sh.serverPK}}})
	if err != nil {
		t.Fatal(err)
	}
	w := &authored{}
	go func() {
		for ev := range sub.Events {
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
		}
	}()
	return w
}

// secretsIn lists what in content is a bearer secret (a Cashu token, a
// credit or payment token) or one of the given preimages.
func secretsIn(content string, preimages []string) []string {
	var out []string
	for _, p := range []string{"cashuA", "cashuB", "cvc_", "cvp_"} {
		if strings.Contains(content, p) {
			out = append(out, p)
		}
	}
	for _, p := range preimages {
		if p != "" && strings.Contains(content, p) {
			out = append(out, "a preimage")
		}
	}
	return out
}

// TestNoSecretInPlaintextNostr is hole 2: plaintext (public) ContextVM
// and DVMCP requests carrying a Cashu token, a credit token or a preimage
// are refused before anything is spent, with an error naming encryption;
// a plaintext top-up of the key's own account and calls paid from it
// work, with no token; a plaintext failed call paid through a mint quote
// hands back no refund token. The same requests gift wrapped work. Every
// event capvend signed, read back from the relay, carries no secret in
// plaintext.
func TestNoSecretInPlaintextNostr(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{nostr: true, cashu: true, top: creditShop})
	seen := watchAuthored(t, sh)
	c := dialNostr(t, sh)
	c.waitReady()
	ctx := context.Background()
	mint := func(sats uint64) string {
		t.Helper()
		tok, err := sh.s.CashuMint(ctx, sats)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	var preimages []string
	pay := func(m nostrMsg) {
		if m.Method == notePaymentRequired && m.payReq != "" {
			preimages = append(preimages, preimageOf(t, sh, m.payReq))
		}
	}
	refused := func(d dialect, id any, tool string, args, meta map[string]any) {
		t.Helper()
		m := c.untilResponse(c.send(d, id, "tools/call", callParams(tool, args, meta)), nil)
		if m.Error == nil || m.Error.Code != -32600 || !strings.Contains(m.Error.Message, "encrypted") {
			t.Fatalf("plaintext %s %v with a secret: %s, want -32600 naming encryption", tool, meta, m)
		}
	}
	tok30, tok25 := mint(30), mint(25)
	refused(ctxvmPlain, 1, "capvend_topup", map[string]any{"sats": 21}, map[string]any{"capvend/credit": true, "capvend/cashu": tok30})
	refused(ctxvmPlain, 2, "sha256", map[string]any{"text": "s"}, map[string]any{"capvend/cashu": tok25})
	refused(dvmcpRev1, 3, "sha256", map[string]any{"text": "s"}, map[string]any{"capvend/cashu": tok25})
	refused(ctxvmPlain, 4, "sha256", map[string]any{"text": "s"}, map[string]any{"capvend/credit": "cvc_t000000000000000000000000_00"})
	refused(ctxvmPlain, 5, "sha256", map[string]any{"text": "s"}, map[string]any{"capvend/preimage": strings.Repeat("ab", 32)})
	refused(ctxvmPlain, 6, "capvend_topup", map[string]any{"sats": 21}, nil) // a new token account's answer is its token
	if n := redeem(t, sh.s, tok30); n < 29 {
		t.Fatalf("the refused 30-sat token redeemed %d sats: it was spent", n)
	}

	// The key's own account, in plaintext, paid over Lightning: no token.
	m := c.untilResponse(c.send(ctxvmPlain, 7, "tools/call", callParams("capvend_topup", map[string]any{"sats": 50},
		map[string]any{"capvend/credit": true})), pay)
	if m.Error != nil || !strings.Contains(string(m.Result), `"balance":50`) {
		t.Fatalf("plaintext top-up of the key's account: %s", m)
	}
	m = c.untilResponse(c.send(ctxvmPlain, 8, "tools/call", callParams("sha256", map[string]any{"text": "own"},
		map[string]any{"capvend/credit": true})), nil)
	if !strings.Contains(string(m.Result), sha256Hex("own")) {
		t.Fatalf("plaintext call paid from the key's account: %s", m)
	}
	// A failed call paid through the mint's invoice: its refund is owed
	// back, never a token in a public event.
	m = c.untilResponse(c.send(ctxvmPlain, 9, "tools/call", callParams("always_fails", map[string]any{"text": "x"},
		map[string]any{"capvend/invoice_from": "cashu"})), pay)
	if m.Error == nil && !strings.Contains(string(m.Result), `"isError":true`) {
		t.Fatalf("always_fails: %s", m)
	}
	// Encrypted, the Cashu token pays, and its change comes back.
	var change []string
	m = c.untilResponse(c.send(ctxvmWrapped, 10, "tools/call", callParams("sha256", map[string]any{"text": "wrapped"},
		map[string]any{"capvend/cashu": tok25})), func(n nostrMsg) {
		raw, _ := json.Marshal(n.rpcMessage)
		change = append(change, findTokens(raw)...)
	})
	if !strings.Contains(string(m.Result), sha256Hex("wrapped")) || len(change) == 0 {
		t.Fatalf("the wrapped call paid with a 25-sat token: %s (change %d)", m, len(change))
	}

	sh.stop() // every answer is published before capvend exits
	seen.mu.Lock()
	defer seen.mu.Unlock()
	plain := 0
	for _, ev := range seen.events {
		if ev.Kind == kindGiftWrap || ev.Kind == kindEphemeralGW {
			continue
		}
		plain++
		if s := secretsIn(ev.Content+fmt.Sprint(ev.Tags), preimages); len(s) > 0 {
			t.Errorf("a plaintext event capvend signed (kind %d) carries %v: %.300s", ev.Kind, s, ev.Content)
		}
	}
	if plain < 8 {
		t.Fatalf("read back only %d plaintext events capvend signed", plain)
	}
}

// TestCaseVariantOfPricedArgument is hole 3: byte_count is priced per KB
// of its optional text, and reads its arguments as a Go struct (keys
// without regard to case); its schema allows other properties. A call
// with {"TEXT": 40 KB} is refused before any quote, not sold for the base
// price.
func TestCaseVariantOfPricedArgument(t *testing.T) {
	t.Parallel()
	p := issuePrices()
	p.tools["byte_count"] = price{sats: 2, extra: "per_kb: {arg: text, sats: 1}, max_sats: 1000"}
	sh := startShop(t, shopOpts{prices: &p, toolFlags: []string{"--byte-count"}})
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	big := strings.Repeat("x", 40*1024)
	for i, key := range []string{"TEXT", "Text", "tEXT"} {
		m, err := c.tryRPC(sess, i+1, "tools/call", callParams("byte_count", map[string]any{key: big}, explicit()), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Error == nil || m.Error.Code != -32602 || !strings.Contains(m.Error.Message, "case variant") {
			t.Fatalf("byte_count {%q: 40 KB}: %s, want -32602 before any quote", key, m)
		}
	}
	nothingCharged(t, sh)
	m, err := c.tryRPC(sess, 9, "tools/call", callParams("byte_count", map[string]any{"text": big}, explicit()), nil)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		StructuredContent struct {
			Amount int64 `json:"amount"`
		} `json:"structuredContent"`
	}
	if json.Unmarshal(m.Result, &r); r.StructuredContent.Amount != 42 {
		t.Fatalf("byte_count {text: 40 KB} quoted %d sats, want 42: %s", r.StructuredContent.Amount, m)
	}
}
