package cashu_test

import (
	"context"
	"path/filepath"
	"testing"

	gcashu "github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"
	"github.com/elnosh/gonuts/wallet/storage"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// TestReconcileFindsProofSpentElsewhere: capvend's wallet holds ecash the
// ledger booked; a proof of it is spent elsewhere (a copy of the wallet,
// here a second gonuts wallet receiving it at the real mint). The
// reconciler, reading the wallet file with capvend stopped and asking the
// mint about every proof, finds the wallet's unspent ecash short of
// assets:cashu:<mint> by exactly that proof; before the spend the two
// agree.
func TestReconcileFindsProofSpentElsewhere(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l := openLedger(t)
	b, wdir := holdingEcash(t, l, 8)
	b.Close() // capvend stops: the wallet file is free

	wf, err := cashu.OpenWalletFile(wdir, []string{stack.MintURL})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reconcile.New(reconcile.Config{Store: l, Wallet: wf})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := r.Once(ctx); err != nil || len(s.Differences) != 0 {
		t.Fatalf("before the spend: %v %+v", err, s.Differences)
	}

	spent := spendOneProof(t, wdir, stack.MintURL)
	s, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Differences) != 1 || s.Differences[0].Kind != reconcile.CashuBalance || s.Differences[0].Repair != "" {
		t.Fatalf("after the spend: %+v", s.Differences)
	}
	hs, err := wf.Holdings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].Spent != vend.Msat(spent*1000) || hs[0].Unspent != 8_000-vend.Msat(spent*1000) {
		t.Fatalf("holdings %+v, want %d sat spent of 8", hs, spent)
	}
}

// spendOneProof takes one proof out of the wallet file in wdir (as a copy
// of the wallet would) and spends it at the mint through another gonuts
// wallet; it returns the proof's amount in sats.
func spendOneProof(t *testing.T, wdir, mint string) uint64 {
	t.Helper()
	db, err := storage.InitBolt(wdir)
	if err != nil {
		t.Fatal(err)
	}
	var p gcashu.Proofs
	for _, kss := range db.GetKeysets() {
		for _, ks := range kss {
			if ps := db.GetProofsByKeysetId(ks.Id); len(ps) > 0 && p == nil {
				p = ps[:1]
			}
		}
	}
	db.Close()
	if p == nil {
		t.Fatal("the wallet holds no proof")
	}
	tok, err := gcashu.NewTokenV4(p, mint, gcashu.Sat, false)
	if err != nil {
		t.Fatal(err)
	}
	other, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(t.TempDir(), "elsewhere"), CurrentMintURL: mint})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Shutdown()
	if _, err := other.Receive(tok, false); err != nil {
		t.Fatalf("spending the proof elsewhere: %v", err)
	}
	return p[0].Amount
}
