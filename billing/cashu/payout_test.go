package cashu_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// payoutCrash is the crash child's payout (see crashChild): op pays
// refund id, and kill runs at FailAfterPayout, after the money left and
// before it is booked.
func payoutCrash(ctx context.Context, b *cashu.Backend, l *ledger.Ledger, op, dir, mint string, id vend.RefundID, kill func()) error {
	cashu.SetCLIFailpoint(func(step string) {
		if step == cashu.FailAfterPayout {
			kill()
		}
	})
	mints := []string{mint}
	switch op {
	case "refund-invoice":
		_, _, err := cashu.PayRefundInvoice(ctx, dir, mints, "", id, "", l)
		return err
	case "refund-token":
		_, err := cashu.PayRefundToken(ctx, dir, mints, "", id, l)
		return err
	case "serve-token":
		r, err := l.RefundByID(ctx, id)
		if err != nil {
			return err
		}
		_, err = b.PayRefund(ctx, r)
		return err
	}
	return fmt.Errorf("unknown payout %q", op)
}

// crashLedger opens a ledger file for a crash test, and a wallet holding
// sats of ecash booked in it; it returns the ledger, its path and the
// wallet directory (free: its backend is closed).
func crashLedger(t *testing.T, sats int64) (*ledger.Ledger, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l, err := ledger.Open(context.Background(), path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	b, wdir := holdingEcash(t, l, sats)
	b.Close()
	return l, path, wdir
}

// inFlight returns the one payout in flight.
func inFlight(t *testing.T, l *ledger.Ledger) vend.Payout {
	t.Helper()
	ps, err := l.Payouts(context.Background(), false)
	if err != nil || len(ps) != 1 {
		t.Fatalf("payouts in flight: %+v %v; want one", ps, err)
	}
	return ps[0]
}

// runUntil runs a backend on the wallet in wdir until done reports true
// (a hang guard of 60 s), then stops it.
func runUntil(t *testing.T, l *ledger.Ledger, wdir string, done func() bool) *cashu.Backend {
	t.Helper()
	b := newBackend(t, l, stack.MintURL, filepath.Dir(wdir))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- b.Run(ctx, nil) }()
	defer func() { cancel(); <-ran }()
	deadline := time.Now().Add(60 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("the backend did not resolve the payout left in flight")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return b
}

// TestCrashBetweenMeltAndBookIsBooked: `capvend refunds pay` is killed
// after the mint paid the client's invoice and before the payout was
// booked. The payout stays reserved with its melt quote (the refund owed
// but in flight: no other payer may pay it); when capvend serve next
// opens the wallet, the mint says the quote is PAID and the payout is
// booked, once: the client got the refund once, the wallet and the books
// agree.
func TestCrashBetweenMeltAndBookIsBooked(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l, path, wdir := crashLedger(t, 40)
	inv, err := stack.InvoiceOn(ctx, testnet.Customer, 5, "refund")
	if err != nil {
		t.Fatal(err)
	}
	r := owedLND(t, l, 5, inv.PaymentRequest)
	before, err := customerBalance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crash(t, cashu.FailAfterPayout, map[string]any{"Op": "refund-invoice", "Ledger": path, "Dir": wdir, "Mint": stack.MintURL, "Refund": r.ID})

	po := inFlight(t, l)
	if po.Kind != vend.PayoutRefund || po.Refund != r.ID || po.Method != vend.RefundBolt11 || po.Quote == "" || po.Amount != 5_000 {
		t.Fatalf("the payout in flight: %+v", po)
	}
	if got, _ := l.RefundByID(ctx, r.ID); got.State != vend.RefundOwed {
		t.Fatalf("before the restart the refund is %s", got.State)
	}
	if _, err := l.PayRefund(ctx, r.ID, vend.RefundPayout{Method: vend.RefundBolt11, MintURL: stack.MintURL, Paid: 5_000, Ref: "other"}); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("another payer of the refund in flight: %v", err)
	}
	verifyLedger(t, l)

	b := runUntil(t, l, wdir, func() bool {
		got, _ := l.RefundByID(ctx, r.ID)
		return got.State == vend.RefundPaid
	})
	paid, _ := l.RefundByID(ctx, r.ID)
	if paid.Method != vend.RefundBolt11 || paid.Ref != po.Quote || paid.Paid != 5_000 {
		t.Fatalf("refund %+v", paid)
	}
	if after, _ := customerBalance(ctx); after-before != 5_000 {
		t.Fatalf("the customer got %d msat, want 5000 once", after-before)
	}
	if ps, _ := l.Payouts(ctx, false); len(ps) != 0 {
		t.Fatalf("still in flight: %+v", ps)
	}
	reconciled(t, b, l, wdir, stack.MintURL)
	// The operator's next attempt finds it paid.
	if _, _, err := cashu.PayRefundInvoice(ctx, wdir, []string{stack.MintURL}, "", r.ID, "", l); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("paying it again: %v", err)
	}
}

// TestCrashBetweenTokenAndBookIsTakenBack: `capvend refunds pay --cashu`
// is killed after the token was made and recorded and before it was
// booked (so before it was handed over). The next attempt finds the
// token unspent: the payout is released and the token taken back into
// the wallet, then the refund is paid with a new token, once. The first
// token is worth nothing now, the second is good ecash, and the wallet
// and the books agree.
func TestCrashBetweenTokenAndBookIsTakenBack(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l, path, wdir := crashLedger(t, 40)
	r := owedLND(t, l, 3, "")
	crash(t, cashu.FailAfterPayout, map[string]any{"Op": "refund-token", "Ledger": path, "Dir": wdir, "Mint": stack.MintURL, "Refund": r.ID})
	left := inFlight(t, l)
	if left.Method != vend.RefundCashu || left.Token == "" || left.Refund != r.ID {
		t.Fatalf("the payout in flight: %+v", left)
	}
	verifyLedger(t, l)

	paid, err := cashu.PayRefundToken(ctx, wdir, []string{stack.MintURL}, "", r.ID, l)
	if err != nil || paid.State != vend.RefundPaid || paid.Token == "" || paid.Token == left.Token {
		t.Fatalf("the next attempt: %+v %v", paid, err)
	}
	all, _ := l.Payouts(ctx, true)
	if len(all) != 2 || all[0].State != vend.PayoutReleased || all[1].State != vend.PayoutBooked {
		t.Fatalf("payouts %+v", all)
	}
	bals, err := cashu.Balances(ctx, wdir, []string{stack.MintURL}, l)
	if err != nil || bals[0].Difference() != 0 || bals[0].Ledger != 37_000 {
		t.Fatalf("balances %+v %v", bals, err)
	}
	verifyLedger(t, l)

	lo := openLedger(t)
	bo := newBackend(t, lo, stack.MintURL, t.TempDir())
	defer bo.Close()
	if _, err := bo.AcceptToken(ctx, priced(t, lo, 3).ID, 3_000, left.Token); !errors.Is(err, vend.ErrProofSpent) {
		t.Fatalf("the token taken back still pays: %v", err)
	}
	if _, err := bo.AcceptToken(ctx, priced(t, lo, 3).ID, 3_000, paid.Token); err != nil {
		t.Fatalf("the refund token is not spendable: %v", err)
	}
}

// TestCrashAfterTokenRedeemedIsBooked: capvend serve is killed paying a
// refund as a token after the token was recorded and before it was
// booked, and the token was redeemed all the same. At the next start the
// mint says its proofs are spent: the payout is booked, the refund paid
// with that token, and the wallet and the books agree.
func TestCrashAfterTokenRedeemedIsBooked(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l, path, wdir := crashLedger(t, 40)
	r := owedLND(t, l, 4, "")
	crash(t, cashu.FailAfterPayout, map[string]any{"Op": "serve-token", "Ledger": path, "Dir": wdir, "Mint": stack.MintURL, "Refund": r.ID})
	left := inFlight(t, l)
	lo := openLedger(t)
	bo := newBackend(t, lo, stack.MintURL, t.TempDir())
	defer bo.Close()
	if _, err := bo.AcceptToken(ctx, priced(t, lo, 4).ID, 4_000, left.Token); err != nil {
		t.Fatalf("redeeming the recorded token: %v", err)
	}

	b := runUntil(t, l, wdir, func() bool {
		got, _ := l.RefundByID(ctx, r.ID)
		return got.State == vend.RefundPaid
	})
	paid, _ := l.RefundByID(ctx, r.ID)
	if paid.Token != left.Token || paid.Method != vend.RefundCashu {
		t.Fatalf("refund %+v", paid)
	}
	if bal := reconciled(t, b, l, wdir, stack.MintURL); bal.Ledger != 36_000 {
		t.Fatalf("balance %+v", bal)
	}
}
