package cashu_test

import (
	"context"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// unattributed waits until l books want msat to liabilities:unattributed.
func unattributed(t *testing.T, l *ledger.Ledger, want vend.Msat) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		bal, err := l.AccountBalances(ctx, ledger.AccountUnattributed)
		if err != nil {
			t.Fatal(err)
		}
		got := -bal[ledger.AccountUnattributed]
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("liabilities:unattributed holds %d msat, want %d", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLostQuoteMintedAndBooked: the ledger is lost after a mint quote was
// requested (restored from a replica that ends before it); the customer
// pays it. The wallet, in its own folder, still has the quote in its
// store: the backend on the restored ledger mints it and books its amount
// once to liabilities:unattributed (no payment names it, no call runs).
// A quote minted before the ledger was lost is found issued in the wallet
// and booked the same way. On main the first was never minted (the money
// stayed at the mint) and the second was ecash the books never showed.
func TestLostQuoteMintedAndBooked(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	dir := t.TempDir()
	before := openLedger(t)
	b := newBackend(t, before, stack.MintURL, dir)
	stop := running(t, b, nil)
	minted := priced(t, before, 13)
	pm, err := b.Request(ctx, vend.PaymentRequest{CallID: minted.ID, Amount: minted.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(ctx, pm.Bolt11); err != nil {
		t.Fatal(err)
	}
	until(t, 60*time.Second, "the first quote settled", func() bool {
		p, err := before.Payment(ctx, pm.Ref)
		return err == nil && p.State == vend.PaymentSettled
	})
	lost := priced(t, before, 21)
	pl, err := b.Request(ctx, vend.PaymentRequest{CallID: lost.ID, Amount: lost.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := pay(ctx, pl.Bolt11); err != nil {
		t.Fatal(err)
	}

	// The restored ledger knows neither quote.
	restored := openLedger(t)
	for range 2 { // a second start books nothing again
		r := newBackend(t, restored, stack.MintURL, dir)
		stop := running(t, r, nil)
		unattributed(t, restored, minted.Price+lost.Price)
		stop()
	}
	assets, err := restored.AccountBalances(ctx, "assets:cashu:")
	if err != nil {
		t.Fatal(err)
	}
	var sum vend.Msat
	for _, v := range assets {
		sum += v
	}
	if sum != minted.Price+lost.Price {
		t.Fatalf("the restored ledger's ecash: %v, want %d msat", assets, minted.Price+lost.Price)
	}
	if rep, err := restored.Verify(ctx); err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
}
