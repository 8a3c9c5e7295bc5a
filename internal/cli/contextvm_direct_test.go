package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/testnet"
)

// TestContextVMDirectPayment: the stock @contextvm/sdk client, its
// transport patched to send a CEP-8 direct_payment tag (the SDK has the
// types only; testdata/contextvm/direct.mjs), pays t_sha256 (21 sats)
// with a Cashu token of the stack's mint. In plaintext the token is
// refused naming encryption, unspent; the same token gift wrapped pays at
// once: no invoice, payment_accepted names bitcoin-cashu-v4-direct, its
// change tag holds a token that redeems at the mint; a token too small
// is rejected (the SDK turns payment_rejected into its error). The
// ledger verifies with one 21-sat sale.
func TestContextVMDirectPayment(t *testing.T) {
	s := needStack(t)
	needNPM(t, "contextvm")
	server, nsec := capvendtest.ServerKey(t)
	path, _ := writeServeConfig(t, s, serveOpts{nsecFile: nsec, cashu: true})
	db := filepath.Join(filepath.Dir(path), "capvend.db")
	startCapvend(t, path)
	c := dialContextVM(t, s.RelayURL, server)
	c.waitReady()
	ctx := context.Background()
	mint := func(sats uint64) string {
		t.Helper()
		tok, err := s.CashuMint(ctx, sats)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tok := mint(30)
	run := func(encryption, token string) map[string]string {
		t.Helper()
		lines := runNode[any](t, needNPM(t, "contextvm"), nil, "direct.mjs", s.RelayURL, server, encryption, token)
		t.Logf("stock client (encryption %s) saw: %v", encryption, lines)
		if lines["DONE"] != "true" || !strings.Contains(lines["SENT"], `["direct_payment","`+ctxvm.PMICashuDirect+`","<token>"]`) {
			t.Fatalf("the patched stock client did not send its direct payment: %v", lines)
		}
		if _, ok := lines["PAY"]; ok {
			t.Fatalf("an invoice for a call paid directly: %v", lines)
		}
		return lines
	}

	t.Run("plaintext: refused, the token unspent", func(t *testing.T) {
		lines := run("disabled", tok)
		if !strings.Contains(lines["ERROR"], "Encryption required: a Cashu token (the direct_payment tag)") || lines["ACCEPTED"] != "" || lines["CHANGE"] != "" {
			t.Fatalf("plaintext direct payment: %v", lines)
		}
	})
	t.Run("encrypted: paid, change in a tag", func(t *testing.T) {
		lines := run("optional", tok) // the token refused in plaintext pays: it was not spent
		sum := sha256.Sum256([]byte("direct"))
		if !strings.Contains(lines["RESULT"], hex.EncodeToString(sum[:])) || !strings.Contains(lines["ACCEPTED"], `"pmi":"`+ctxvm.PMICashuDirect+`"`) ||
			!strings.Contains(lines["ACCEPTED"], `"amount":21`) {
			t.Fatalf("encrypted direct payment: %v", lines)
		}
		var change []string
		if err := json.Unmarshal([]byte(lines["CHANGE"]), &change); err != nil || len(change) != 3 || change[1] != ctxvm.PMICashuDirect {
			t.Fatalf("change tag %q: %v", lines["CHANGE"], err)
		}
		if n := redeemToken(t, s, change[2]); n == 0 || n > 9 {
			t.Fatalf("the change of 30 sats for 21 redeemed %d sats", n)
		}
	})
	t.Run("encrypted: too small, rejected", func(t *testing.T) {
		lines := run("optional", mint(5))
		if !strings.Contains(lines["ERROR"], "Payment rejected") || !strings.Contains(lines["REJECTED"], ctxvm.PMICashuDirect) || lines["ACCEPTED"] != "" {
			t.Fatalf("underpaying direct payment: %v", lines)
		}
	})

	l := ledgerkit.OpenVerified(t, db)
	b, _ := l.Balance(ctx)
	var revenue int64
	for _, tr := range b.Tools {
		revenue += int64(tr.Revenue)
	}
	if revenue != 21_000 {
		t.Fatalf("revenue %d msat, want 21000: %+v", revenue, b.Tools)
	}
}

// redeemToken receives token into a fresh wallet at the stack's mint (a
// swap: it fails for a spent or forged token) and returns its sats.
func redeemToken(t *testing.T, s *testnet.Stack, token string) uint64 {
	t.Helper()
	tok, err := cashu.DecodeToken(token)
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	w, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(t.TempDir(), "wallet"), CurrentMintURL: s.MintURL})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Shutdown()
	n, err := w.Receive(tok, false)
	if err != nil {
		t.Fatalf("redeeming the token at the mint: %v", err)
	}
	return n
}
