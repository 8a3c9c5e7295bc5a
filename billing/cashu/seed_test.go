package cashu_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gonutscashu "github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/billing/cashu"
)

// TestWalletRestoredFromItsSeed is issue 30's wallet drill on the real
// mint: the wallet earns ecash (one token paid exactly, one with change
// handed back), its seed is exported, the wallet folder is deleted and
// rebuilt from the seed. Its balance equals what it held (and the
// ledger's books) to the msat; the change handed out is set aside as the
// client's, and the client can still redeem it; nothing is booked twice.
func TestWalletRestoredFromItsSeed(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l := openLedger(t)
	b, wdir := holdingEcash(t, l, 21)
	c := priced(t, l, 21)
	receipt, err := b.AcceptToken(ctx, c.ID, c.Price, customerToken(t, 30))
	if err != nil || receipt.Change == "" {
		t.Fatalf("a 30-sat token for 21 sats: %+v %v", receipt, err)
	}
	before := reconciled(t, b, l, wdir, stack.MintURL) // closes b
	if before.Wallet != 42_000 {
		t.Fatalf("the wallet holds %s, want 42 sats", before.Wallet)
	}
	seed := filepath.Join(t.TempDir(), "seed.txt")
	if !cashu.SeedExported(wdir).IsZero() {
		t.Fatal("a new wallet's seed counts as exported")
	}
	if err := cashu.ExportSeed(wdir, seed, false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(seed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("seed file: %v %v", fi, err)
	}
	if err := cashu.ExportSeed(wdir, seed+"2", false); !errors.Is(err, cashu.ErrSeedExported) {
		t.Fatalf("a second export: %v", err)
	}
	mnemonic, _ := os.ReadFile(seed)
	if len(strings.Fields(string(mnemonic))) != 12 {
		t.Fatalf("the seed is not 12 words")
	}

	if err := os.RemoveAll(wdir); err != nil { // the disaster
		t.Fatal(err)
	}
	r, err := cashu.Restore(ctx, wdir, string(mnemonic), []string{stack.MintURL}, l)
	if err != nil {
		t.Fatal(err)
	}
	if r.Own != 42_000 || r.Clients != 9_000 {
		t.Fatalf("restored %s own and %s of clients', want 42 and 9 sats", r.Own, r.Clients)
	}
	bals, err := cashu.Balances(ctx, wdir, []string{stack.MintURL}, l)
	if err != nil {
		t.Fatal(err)
	}
	if bals[0].Difference() != 0 || bals[0].Wallet != before.Wallet {
		t.Fatalf("after the restore: %+v, before %+v", bals[0], before)
	}
	if _, err := cashu.Restore(ctx, wdir, string(mnemonic), []string{stack.MintURL}, l); err == nil {
		t.Fatal("a restore over a wallet was done")
	}
	if n := redeemAt(t, receipt.Change); n != 9 {
		t.Fatalf("the client's change redeemed %d sats after the restore, want 9", n)
	}
	verifyLedger(t, l)
}

// redeemAt receives token into a fresh wallet at the stack's mint (a swap:
// only unspent proofs pass) and returns the sats received.
func redeemAt(t *testing.T, token string) uint64 {
	t.Helper()
	tok, err := gonutscashu.DecodeToken(token)
	if err != nil {
		t.Fatal(err)
	}
	w, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(t.TempDir(), "client"), CurrentMintURL: stack.MintURL})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Shutdown()
	n, err := w.Receive(tok, false)
	if err != nil {
		t.Fatalf("redeeming: %v", err)
	}
	return n
}
