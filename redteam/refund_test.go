package redteam

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"
	"github.com/lightningnetwork/lnd/lnrpc"

	"github.com/capvend/capvend/testnet"
)

// Issue 11, "A refund is money, not only a journal line".

// findTokens returns every Cashu token (a string starting cashuA or
// cashuB) anywhere in raw.
func findTokens(raw json.RawMessage) []string {
	var v any
	json.Unmarshal(raw, &v)
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case string:
			if strings.HasPrefix(t, "cashuA") || strings.HasPrefix(t, "cashuB") {
				out = append(out, t)
			}
		case []any:
			for _, e := range t {
				walk(e)
			}
		case map[string]any:
			for _, e := range t {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

// redeem receives token into a fresh wallet at the stack's mint (a swap:
// the mint accepts only unspent proofs) and returns the sats received.
func redeem(t *testing.T, s *testnet.Stack, token string) uint64 {
	t.Helper()
	tok, err := cashu.DecodeToken(token)
	if err != nil {
		t.Fatalf("refund token: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "wallet")
	w, err := wallet.LoadWallet(wallet.Config{WalletPath: dir, CurrentMintURL: s.MintURL})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Shutdown()
	n, err := w.Receive(tok, false)
	if err != nil {
		t.Fatalf("redeeming the refund token at the mint: %v", err)
	}
	return n
}

// TestRefundCashuTokenAsMoney pays always_fails (5 sats) with a Cashu
// token: the tool fails after payment, and the answer must carry a Cashu
// token for the price that the customer can redeem at the mint.
func TestRefundCashuTokenAsMoney(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{cashu: true})
	ctx := context.Background()
	token, err := sh.s.CashuMint(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	st, err := c.postRaw(sess, request(1, "tools/call", callParams("always_fails", map[string]any{"text": "x"},
		map[string]any{"capvend/cashu": token})), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := untilResponse(t, st, nil)
	st.close()
	if m.Error == nil && !strings.Contains(string(m.Result), `"isError":true`) {
		t.Fatalf("always_fails: %s, want a failure", m)
	}
	raw, _ := json.Marshal(m)
	refunds := findTokens(raw)
	if len(refunds) == 0 {
		t.Fatalf("the failed call paid with a Cashu token got no refund token back: %s", m)
	}
	var got uint64
	for _, r := range refunds {
		got += redeem(t, sh.s, r)
	}
	if got < 5 {
		t.Fatalf("redeemed %d sats of refund for a 5-sat call", got)
	}
}

// TestRefundPlainInvoiceOwed pays always_fails with a plain (non-hold)
// LND invoice, giving a refund invoice in _meta["capvend/refund_invoice"].
// The refund stays owed (liabilities:refunds), `capvend refunds` lists
// it, and `capvend refunds pay ID` pays the client's invoice from
// capvend's Cashu wallet (funded first by a call paid with a token).
func TestRefundPlainInvoiceOwed(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{lnd: plainInvoices, cashu: true})
	ctx := context.Background()
	c := newHTTPClient(t, sh)
	sess := c.initialize()

	token, err := sh.s.CashuMint(ctx, 21)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.tryRPC(sess, 1, "tools/call", callParams("sha256", map[string]any{"text": "fund the wallet"},
		map[string]any{"capvend/cashu": token}), nil)
	if err != nil || !strings.Contains(string(m.Result), sha256Hex("fund the wallet")) {
		t.Fatalf("sha256 paid with a token: %s %v", m, err)
	}

	inv, err := sh.s.InvoiceOn(ctx, testnet.Customer, 5, "capvend refund")
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.postRaw(sess, request(2, "tools/call", callParams("always_fails", map[string]any{"text": "x"},
		map[string]any{"capvend/refund_invoice": inv.PaymentRequest})), nil)
	if err != nil {
		t.Fatal(err)
	}
	var paid <-chan error
	m, _ = untilResponse(t, st, func(b string) { paid = payAsync(sh.s, b) })
	st.close()
	if paid == nil {
		t.Fatalf("always_fails was not asked to pay: %s", m)
	}
	if err := <-paid; err != nil {
		t.Fatalf("paying always_fails: %v", err)
	}
	if m.Error == nil && !strings.Contains(string(m.Result), `"isError":true`) {
		t.Fatalf("always_fails: %s, want a failure", m)
	}
	out, code := runCapvend(t, "refunds", "--config", sh.config)
	if code != 0 {
		t.Fatalf("capvend refunds: exit %d\n%s", code, out)
	}
	id := ""
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] != "ID" && strings.Contains(line, "5.000") {
			id = f[0]
		}
	}
	if id == "" {
		t.Fatalf("capvend refunds does not list the 5-sat refund owed:\n%s", out)
	}
	sh.stop() // refunds pay opens the wallet
	out, code = runCapvend(t, "refunds", "pay", id, "--config", sh.config)
	if code != 0 {
		t.Fatalf("capvend refunds pay %s: exit %d\n%s", id, code, out)
	}
	conn, err := sh.s.Conn(testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the customer's refund invoice settled", func() bool {
		i, err := lnrpc.NewLightningClient(conn).LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: inv.RHash})
		return err == nil && i.State == lnrpc.Invoice_SETTLED
	})
}
