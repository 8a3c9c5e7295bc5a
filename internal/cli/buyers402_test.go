package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// TestStockClientsBuyWithEvery402Scheme (issue 29): the official MCP
// TypeScript SDK client over Streamable HTTP, its fetch wrapped by
// @getalby/lightning-tools 9.0.1, once with each of fetchWithL402,
// fetchWithMpp, fetchWithX402 and fetch402, buys t_sha256 (21 sats) from
// `capvend serve` (payments.http_402, the challenges in the order
// mpp, l402, x402) paying from the customer LND, with no capvend-specific
// code. Each call runs once, released by the scheme its wrapper speaks
// (fetch402 takes the first challenge: MPP); the customer's node paid
// exactly 21 sats for each invoice. The credential the library hands
// back, presented again for the same call, for other arguments and for
// another tool, is refused with HTTP 401 and runs nothing. `ledger
// verify` passes.
func TestStockClientsBuyWithEvery402Scheme(t *testing.T) {
	needNPM(t, "l402")
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{http402: true, http402Schemes: "[mpp, l402, x402, cashu]"})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	customer, _ := s.Node(testnet.Customer)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	for _, tc := range []struct {
		wrapper, header string
		scheme          vend.SchemeName
	}{
		{"l402", "Authorization", vend.SchemeL402},
		{"mpp", "Authorization", vend.SchemeMPP},
		{"x402", "payment-signature", vend.SchemeX402},
		{"402", "Authorization", vend.SchemeMPP},
	} {
		text := "bought with " + tc.wrapper
		lines := runNodeClient(t, customer, "buy402.mjs", tc.wrapper, url, "t_sha256", fmt.Sprintf(`{"text":%q}`, text), "w_sha256",
			customer.RESTHost, customer.AdminMacaroon)
		want := fmt.Sprintf("%x", sha256.Sum256([]byte(text)))
		if len(lines["RESULT"]) != 1 || !strings.Contains(lines["RESULT"][0], want) || len(lines["PREIMAGE"]) != 1 ||
			len(lines["CREDENTIAL"]) != 1 || lines["CREDENTIAL"][0] != tc.header {
			t.Fatalf("%s: client output %q", tc.wrapper, lines)
		}
		if len(lines["RAN"]) != 0 || len(lines["REFUSED"]) != 3 {
			t.Fatalf("%s: the credential presented again: %q", tc.wrapper, lines)
		}
		for _, r := range lines["REFUSED"] {
			if !strings.Contains(r, "HTTP 401") {
				t.Fatalf("%s: refused %q, want HTTP 401", tc.wrapper, r)
			}
		}
		pre, err := hex.DecodeString(lines["PREIMAGE"][0])
		if err != nil || len(pre) != 32 {
			t.Fatalf("%s: preimage %q", tc.wrapper, lines["PREIMAGE"][0])
		}
		sum := sha256.Sum256(pre)
		hash := hex.EncodeToString(sum[:])
		if sent := capvendtest.CustomerPayment(t, s, hash); sent.Status != lnrpc.Payment_SUCCEEDED || sent.ValueMsat != 21_000 {
			t.Fatalf("%s: the customer node paid %d msat (%s) for %s, want 21000", tc.wrapper, sent.ValueMsat, sent.Status, hash)
		}
		l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := l.Payment(ctx, hash)
		if err != nil {
			t.Fatalf("%s: the ledger has no payment %s: %v", tc.wrapper, hash, err)
		}
		c, err := l.Call(ctx, p.CallID)
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		if p.State != vend.PaymentSettled || p.Settled != 21_000 || c.Price != 21_000 || c.State != vend.CallDelivered || c.Executions != 1 {
			t.Fatalf("%s: payment %s settled %d, call %s price %d, %d executions", tc.wrapper, p.State, p.Settled, c.State, c.Price, c.Executions)
		}
		if by := capvendtest.ReleasedBy(t, db, c.ID); by != string(tc.scheme) {
			t.Fatalf("%s: the call was released by %q, want %q", tc.wrapper, by, tc.scheme)
		}
	}
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	calls, err := l.CallsIn(ctx, vend.CallStates()...)
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range calls {
		ran += c.Executions
	}
	if ran != 4 {
		t.Fatalf("%d executions in the ledger, want 4", ran)
	}
	if stdout, stderr, code := run(t, nil, "ledger", "verify", "--config", filepath.Join(filepath.Dir(db), "capvend.yaml")); code != 0 {
		t.Fatalf("ledger verify: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestURLElicitationPaysWithoutRetry (issue 29): the MCP TypeScript SDK
// client (1.32.2) declaring URL-mode elicitation calls t_sha256 once. The
// server sends it elicitation/create (mode url) pointing at the call's
// pay page while the call waits; the client opens the page, pays the
// invoice shown there from the customer LND, and the call's answer
// arrives on the same request: one tools/call, no retry. The server says
// the elicitation completed; the customer paid exactly 21 sats; the call
// ran once, released to the waiting request (scheme invoice); `ledger
// verify` passes.
func TestURLElicitationPaysWithoutRetry(t *testing.T) {
	needNPM(t, "l402")
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	customer, _ := s.Node(testnet.Customer)
	text := "bought through the pay page"
	lines := runNodeClient(t, customer, "elicit.mjs", url, "t_sha256", fmt.Sprintf(`{"text":%q}`, text), customer.RESTHost,
		customer.AdminMacaroon)
	want := fmt.Sprintf("%x", sha256.Sum256([]byte(text)))
	if len(lines["ELICIT"]) != 1 || !strings.HasPrefix(lines["ELICIT"][0], "url http://") || !strings.Contains(lines["ELICIT"][0], "/pay/cvv_") ||
		len(lines["RESULT"]) != 1 || !strings.Contains(lines["RESULT"][0], want) || strings.Contains(lines["RESULT"][0], `"isError":true`) ||
		len(lines["CALLS"]) != 1 || lines["CALLS"][0] != "1" || len(lines["PREIMAGE"]) != 1 || len(lines["COMPLETE"]) != 1 {
		t.Fatalf("client output: %q", lines)
	}
	pre, _ := hex.DecodeString(lines["PREIMAGE"][0])
	sum := sha256.Sum256(pre)
	hash := hex.EncodeToString(sum[:])
	if sent := capvendtest.CustomerPayment(t, s, hash); sent.Status != lnrpc.Payment_SUCCEEDED || sent.ValueMsat != 21_000 {
		t.Fatalf("the customer node paid %d msat (%s), want 21000", sent.ValueMsat, sent.Status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Payment(ctx, hash)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	c, err := l.Call(ctx, p.CallID)
	l.Close()
	if err != nil || c.State != vend.CallDelivered || c.Executions != 1 || p.Settled != 21_000 {
		t.Fatalf("call %+v payment %+v: %v", c, p, err)
	}
	if by := capvendtest.ReleasedBy(t, db, c.ID); by != string(vend.SchemeInvoice) {
		t.Fatalf("released by %q", by)
	}
	if stdout, stderr, code := run(t, nil, "ledger", "verify", "--config", filepath.Join(filepath.Dir(db), "capvend.yaml")); code != 0 {
		t.Fatalf("ledger verify: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestBuyersConfig: payments.http_402_schemes takes l402, mpp, x402 and
// cashu, each once; http.public_url an http(s) URL; pay page links go
// under public_url, else http://<listen> when listen names a host.
func TestBuyersConfig(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		mod         func(*Config)
	}{
		{"unknown scheme", "payments.http_402_schemes[1]", func(c *Config) { c.Payments.HTTP402Schemes = []string{"mpp", "lsat"} }},
		{"twice", "payments.http_402_schemes[1]", func(c *Config) { c.Payments.HTTP402Schemes = []string{"mpp", "mpp"} }},
		{"public url", "http.public_url", func(c *Config) { c.HTTP.PublicURL = "shop.example" }},
	} {
		c := defaultConfig()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	c := defaultConfig()
	c.Payments.HTTP402Schemes = []string{"mpp", "l402", "x402", "cashu"}
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "http_402_schemes") {
		t.Errorf("every scheme once: %v", err)
	}
	for listen, want := range map[string]string{"127.0.0.1:8402": "http://127.0.0.1:8402", "0.0.0.0:8402": "", ":8402": "", "": ""} {
		if got := (HTTPConfig{Listen: listen}).payBaseURL(); got != want {
			t.Errorf("listen %q: %q, want %q", listen, got, want)
		}
	}
	if got := (HTTPConfig{Listen: ":8402", PublicURL: "https://shop.example/"}).payBaseURL(); got != "https://shop.example" {
		t.Errorf("public_url: %q", got)
	}
}
