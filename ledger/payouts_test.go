package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

const payoutMint = "http://127.0.0.1:3338"

func creditInfo(t *testing.T, l *ledger.Ledger, account string) ledger.CreditAccountInfo {
	t.Helper()
	as, err := l.CreditAccounts(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	return as[0]
}

// TestCreditPayoutReservesThenBooksOnce: a credit payout takes what is
// left out of the balance when it is reserved (the books verify while it
// is in flight), so no draw spends it and no second payout reserves it;
// its token is recorded once; it is booked once, and then neither booked
// nor released again.
func TestCreditPayoutReservesThenBooksOnce(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	c := creditCall(t, l, 1)
	if _, _, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken)); err != nil {
		t.Fatal(err)
	}
	must(t, l.Deliver(ctx, c.ID, okBody))

	p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundCashu,
		MintURL: payoutMint, Wallet: "w1"})
	if err != nil || p.Amount != 79_000 || p.State != vend.PayoutReserved {
		t.Fatalf("reserve what is left: %+v %v", p, err)
	}
	if got := balance(t, l, acctA); got != 0 {
		t.Fatalf("balance with the payout in flight %s, want 0", got)
	}
	if a := creditInfo(t, l, acctA); a.Reserved != 79_000 || a.Refunded != 0 {
		t.Fatalf("in flight: %+v", a)
	}
	mustVerify(t, l)
	d := creditCall(t, l, 2)
	var ex *vend.CreditExhaustedError
	if _, _, err := l.DrawCredit(ctx, d.ID, acctA, d.Binding(), d.Released(vend.SchemeCreditToken)); !errors.As(err, &ex) {
		t.Fatalf("a draw on reserved credit: %v", err)
	}
	if _, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundCashu,
		MintURL: payoutMint, Amount: 1_000}); !errors.Is(err, ledger.ErrCreditShort) {
		t.Fatalf("a second payout of reserved credit: %v", err)
	}

	if p, err = l.SetPayoutToken(ctx, p.ID, "cashuBtoken", 1_000); err != nil || p.Token != "cashuBtoken" || p.Fee != 1_000 {
		t.Fatalf("token: %+v %v", p, err)
	}
	if _, err := l.SetPayoutToken(ctx, p.ID, "cashuBother", 0); !errors.Is(err, vend.ErrPayoutEnded) {
		t.Fatalf("a second token: %v", err)
	}
	if p, err = l.BookPayout(ctx, p.ID, 1_000); err != nil || p.State != vend.PayoutBooked || p.EndedAt.IsZero() {
		t.Fatalf("book: %+v %v", p, err)
	}
	if _, err := l.BookPayout(ctx, p.ID, 1_000); !errors.Is(err, vend.ErrPayoutEnded) {
		t.Fatalf("booked twice: %v", err)
	}
	if _, err := l.ReleasePayout(ctx, p.ID, "late"); !errors.Is(err, vend.ErrPayoutEnded) {
		t.Fatalf("released after its booking: %v", err)
	}
	if a := creditInfo(t, l, acctA); a.Balance != 0 || a.Reserved != 0 || a.Refunded != 79_000 || a.TopUps != a.Draws+a.Refunded {
		t.Fatalf("booked: %+v", a)
	}
	if got := accountBalance(t, l, ledger.AccountCreditReserved); got != 0 {
		t.Fatalf("%s holds %s after the booking", ledger.AccountCreditReserved, got)
	}
	if got := accountBalance(t, l, ledger.CashuFeeAccount(payoutMint)); got != 1_000 {
		t.Fatalf("fee %s", got)
	}
	mustVerify(t, l)
}

// TestCreditPayoutReleaseRestoresTheBalance: a released reservation gives
// its amount back to the balance, once; draws spend it again.
func TestCreditPayoutReleaseRestoresTheBalance(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	if _, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundBolt11,
		MintURL: payoutMint, Amount: 60_000}); err == nil {
		t.Fatal("a bolt11 payout without its melt quote was reserved")
	}
	if _, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundBolt11,
		MintURL: payoutMint, Amount: 101_000, Invoice: "lnbcrt1", Quote: "q0"}); !errors.Is(err, ledger.ErrCreditShort) {
		t.Fatalf("more than the balance: %v", err)
	}
	p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundBolt11,
		MintURL: payoutMint, Amount: 60_000, Invoice: "lnbcrt1", Quote: "q1", FeeReserve: 1_000, Wallet: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := balance(t, l, acctA); got != 40_000 {
		t.Fatalf("balance %s, want 40 sats beside the payout", got)
	}
	mustVerify(t, l)
	if p, err = l.ReleasePayout(ctx, p.ID, "the mint did not pay"); err != nil || p.State != vend.PayoutReleased || p.Reason != "the mint did not pay" {
		t.Fatalf("release: %+v %v", p, err)
	}
	if got := balance(t, l, acctA); got != 100_000 {
		t.Fatalf("balance after the release %s", got)
	}
	if _, err := l.ReleasePayout(ctx, p.ID, "again"); !errors.Is(err, vend.ErrPayoutEnded) {
		t.Fatalf("released twice: %v", err)
	}
	if _, err := l.BookPayout(ctx, p.ID, 0); !errors.Is(err, vend.ErrPayoutEnded) {
		t.Fatalf("booked after its release: %v", err)
	}
	if _, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundBolt11,
		MintURL: payoutMint, Amount: 1_000, Invoice: "lnbcrt1", Quote: "q1"}); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("a melt quote paying two payouts: %v", err)
	}
	c := creditCall(t, l, 1)
	if _, _, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken)); err != nil {
		t.Fatalf("a draw after the release: %v", err)
	}
	if a := creditInfo(t, l, acctA); a.Refunded != 0 || a.Reserved != 0 || a.Balance != 79_000 {
		t.Fatalf("after the release: %+v", a)
	}
	mustVerify(t, l)
}

// TestCreditPayoutsAndDrawsAcrossHandles: two instances (two ledger
// handles on one database) draw and reserve payouts from one account at
// once: the balance never goes below zero, what was drawn and reserved
// never exceeds what was bought, and the books verify.
func TestCreditPayoutsAndDrawsAcrossHandles(t *testing.T) {
	ctx := context.Background()
	a, b := twoHandles(t, nil)
	topUp(t, a, acctA, 1, 100)
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	var drawn, reserved vend.Msat
	for i := range n {
		l := []*ledger.Ledger{a, b}[i%2]
		wg.Go(func() {
			nc := newCall(10 + i)
			_, _, _, err := l.RecordCreditCall(ctx, nc, acctA, nc.Binding(), nc.Released(vend.SchemeCreditToken))
			var ex *vend.CreditExhaustedError
			switch {
			case err == nil:
				mu.Lock()
				drawn += nc.Price
				mu.Unlock()
			case !errors.As(err, &ex):
				t.Error(err)
			}
		})
		wg.Go(func() {
			p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundCashu,
				MintURL: payoutMint, Amount: 30_000})
			switch {
			case err == nil:
				mu.Lock()
				reserved += p.Amount
				mu.Unlock()
			case !errors.Is(err, ledger.ErrCreditShort):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	left := balance(t, a, acctA)
	t.Logf("drawn %s, reserved %s, left %s", drawn, reserved, left)
	if left < 0 || drawn+reserved+left != 100_000 || left >= 21_000 {
		t.Fatalf("drawn %s + reserved %s + left %s; want 100 sats, less than a call left", drawn, reserved, left)
	}
	if info := creditInfo(t, b, acctA); info.Reserved != reserved {
		t.Fatalf("reserved %s, listed %s", reserved, info.Reserved)
	}
	mustVerify(t, a)
}

// TestRefundPayoutReservedOnce: of many payers of one owed refund, on two
// instances, one reserves it; the others are refused before they pay (and
// so is a payout booked at once); released, it may be reserved again;
// booked, it is paid and no payout reserves it again.
func TestRefundPayoutReservedOnce(t *testing.T) {
	ctx := context.Background()
	a, b := twoHandles(t, nil)
	c, _ := failRefunded(t, a, 1, "", 0)
	r, err := a.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	np := vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, Method: vend.RefundCashu, MintURL: payoutMint, Amount: 21_000, Wallet: "w1"}
	const payers = 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []vend.Payout
	for i := range payers {
		l := []*ledger.Ledger{a, b}[i%2]
		wg.Go(func() {
			p, err := l.ReservePayout(ctx, np)
			switch {
			case err == nil:
				mu.Lock()
				won = append(won, p)
				mu.Unlock()
			case !errors.Is(err, vend.ErrPayoutInFlight):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d payers reserved the refund, want 1", len(won))
	}
	if _, err := b.PayRefund(ctx, r.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: payoutMint, Paid: 21_000, Token: "cashuBx"}); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("a payout booked at once while one is in flight: %v", err)
	}
	if got, _ := a.CallRefund(ctx, c.ID); got.State != vend.RefundOwed {
		t.Fatalf("a reserved refund is %s", got.State)
	}
	mustVerify(t, a)
	if _, err := b.ReleasePayout(ctx, won[0].ID, "the token could not be made"); err != nil {
		t.Fatal(err)
	}
	p, err := b.ReservePayout(ctx, np)
	if err != nil {
		t.Fatalf("reserving a released refund again: %v", err)
	}
	if _, err := a.BookPayout(ctx, p.ID, 0); err == nil {
		t.Fatal("a Cashu refund payout was booked without its token")
	}
	if _, err := a.SetPayoutToken(ctx, p.ID, "cashuBtoken", 0); err != nil {
		t.Fatal(err)
	}
	if p, err = a.BookPayout(ctx, p.ID, 0); err != nil || p.State != vend.PayoutBooked {
		t.Fatalf("book: %+v %v", p, err)
	}
	if got, _ := b.CallRefund(ctx, c.ID); got.State != vend.RefundPaid || got.Token != "cashuBtoken" || got.Paid != 21_000 {
		t.Fatalf("the refund after its payout: %+v", got)
	}
	if _, err := b.ReservePayout(ctx, np); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("a paid refund reserved again: %v", err)
	}
	mustVerify(t, b)
}

// TestLeftoverPayoutsSurviveRestart: payouts left reserved by a process
// that died (a melt with its quote, a token recorded) are listed, with
// what identifies the money on its way, after a restart; the next
// process resolves them: one booked (the mint paid it), one released (it
// never left).
func TestLeftoverPayoutsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	topUp(t, l, acctA, 1, 100)
	c, _ := failRefunded(t, l, 2, "lnbcrt210n1client", 0)
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	melt, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, Method: vend.RefundBolt11, MintURL: payoutMint,
		Amount: 21_000, Invoice: r.Invoice, Quote: "melt-quote-1", FeeReserve: 1_000, Wallet: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundCashu, MintURL: payoutMint, Wallet: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetPayoutToken(ctx, tok.ID, "cashuBleft", 0); err != nil {
		t.Fatal(err)
	}
	l.Close()

	l = openLedger(t, path)
	left, err := l.Payouts(ctx, false)
	if err != nil || len(left) != 2 {
		t.Fatalf("payouts in flight after the restart: %+v %v", left, err)
	}
	if m := left[0]; m.ID != melt.ID || m.Quote != "melt-quote-1" || m.Wallet != "w1" || m.FeeReserve != 1_000 || m.Refund != r.ID {
		t.Fatalf("the melt in flight: %+v", m)
	}
	if k := left[1]; k.ID != tok.ID || k.Token != "cashuBleft" || k.Amount != 100_000 || k.Account != acctA {
		t.Fatalf("the token in flight: %+v", k)
	}
	mustVerify(t, l)
	if _, err := l.BookPayout(ctx, melt.ID, 1_000); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ReleasePayout(ctx, tok.ID, "token unspent: taken back"); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.CallRefund(ctx, c.ID); got.State != vend.RefundPaid || got.Ref != "melt-quote-1" || got.Method != vend.RefundBolt11 {
		t.Fatalf("refund %+v", got)
	}
	if got := balance(t, l, acctA); got != 100_000 {
		t.Fatalf("balance %s", got)
	}
	if left, _ := l.Payouts(ctx, false); len(left) != 0 {
		t.Fatalf("still in flight: %+v", left)
	}
	if all, _ := l.Payouts(ctx, true); len(all) != 2 || all[0].State != vend.PayoutBooked || all[1].State != vend.PayoutReleased {
		t.Fatalf("all payouts: %+v", all)
	}
	mustVerify(t, l)
}

// TestWithdrawalPayout: the operator's withdrawal is reserved with its
// melt quote, then booked to equity:withdrawals with its fee.
func TestWithdrawalPayout(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutWithdrawal, Method: vend.RefundBolt11, MintURL: payoutMint,
		Amount: 50_000, Invoice: "lnbcrt500n1", Quote: "wq", Wallet: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutWithdrawal, Method: vend.RefundCashu, MintURL: payoutMint,
		Amount: 50_000}); err == nil {
		t.Fatal("a withdrawal as a token")
	}
	if _, err := l.BookPayout(ctx, p.ID, 2_000); err != nil {
		t.Fatal(err)
	}
	if got := accountBalance(t, l, ledger.AccountWithdrawals); got != 50_000 {
		t.Fatalf("withdrawals %s", got)
	}
	if got := accountBalance(t, l, ledger.CashuAccount(payoutMint)); got != -52_000 {
		t.Fatalf("ecash %s", got)
	}
	mustVerify(t, l)
}

// TestPayoutRulesAreSchemaRules: the schema refuses what the API never
// does: a refund paid with no payout reserved, credit paid out with no
// reservation, a second reservation of a refund, a payout changed or
// booked without its entry, or deleted.
func TestPayoutRulesAreSchemaRules(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	c, _ := failRefunded(t, l, 2, "", 0)
	r, _ := l.CallRefund(ctx, c.ID)
	p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundCashu, MintURL: payoutMint, Amount: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	q, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, Method: vend.RefundCashu, MintURL: payoutMint, Amount: 21_000})
	if err != nil {
		t.Fatal(err)
	}
	must(t, l.ExecForTest(ctx, `INSERT INTO entries (ts, kind, description) VALUES (0, 'adjustment', 'x')`))
	for _, tc := range []struct{ name, q string }{
		{"a refund paid without its payout", fmt.Sprintf(`UPDATE refunds SET state = 'paid', paid_at = 0, method = 'bolt11', paid_msat = 20000,
			fee_msat = 0, mint_url = 'http://other', entry_id = (SELECT max(id) FROM entries) WHERE id = %d`, r.ID)},
		{"credit paid out as before, with no reservation", fmt.Sprintf(`INSERT INTO credit_moves (account_id, kind, amount_msat, entry_id, created_at, method)
			VALUES ('%s', 'refund', -1000, (SELECT max(id) FROM entries), 0, 'cashu')`, acctA)},
		{"a payout move of no payout", fmt.Sprintf(`INSERT INTO credit_moves (account_id, kind, amount_msat, entry_id, created_at, method, payout_id)
			VALUES ('%s', 'payout', -90000, (SELECT max(id) FROM entries), 0, 'cashu', %d)`, acctA, q.ID)},
		{"a second reservation of a refund", fmt.Sprintf(`INSERT INTO payouts (kind, refund_id, method, mint_url, amount_msat, created_at)
			VALUES ('refund', %d, 'cashu', 'http://m', 1000, 0)`, r.ID)},
		{"a reservation's amount changed", fmt.Sprintf(`UPDATE payouts SET amount_msat = 1000 WHERE id = %d`, p.ID)},
		{"a credit payout booked without its entry", fmt.Sprintf(`UPDATE payouts SET state = 'booked', fee_msat = 0, ended_at = 0,
			end_entry_id = (SELECT max(id) FROM entries) WHERE id = %d`, p.ID)},
		{"a refund payout booked with its refund owed", fmt.Sprintf(`UPDATE payouts SET state = 'booked', fee_msat = 0, ended_at = 0,
			end_entry_id = (SELECT max(id) FROM entries) WHERE id = %d`, q.ID)},
		{"a payout deleted", "DELETE FROM payouts"},
	} {
		if err := l.ExecForTest(ctx, tc.q); err == nil {
			t.Errorf("%s: the schema allowed it", tc.name)
		}
	}
	if _, err := l.ReleasePayout(ctx, q.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if err := l.ExecForTest(ctx, fmt.Sprintf(`UPDATE payouts SET state = 'reserved', ended_at = NULL WHERE id = %d`, q.ID)); err == nil {
		t.Error("a released payout reserved again")
	}
	// The entry inserted above is unsealed: verify says so, and only that.
	rep, err := l.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := failedChecks(rep); strings.Join(got, "\n") != "no entry is left unsealed" {
		t.Fatalf("failed checks %q", got)
	}
}

// TestVerifyCatchesTamperedPayouts: a credit reservation edited or undone
// around the schema is caught by the payout checks.
func TestVerifyCatchesTamperedPayouts(t *testing.T) {
	const (
		held    = "credit reserved by payouts in flight equals liabilities:credit_reserved"
		once    = "each credit payout took its amount from its account once, and gave it back once if released"
		sum     = "every credit account's balance equals its top-ups minus draws plus give-backs minus refunds and expiries"
		journal = "every credit account's balance equals its journal account, and none is negative"
		book    = "every credit move is booked by its own entry on its account, and every credit entry is a move"
	)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, l *ledger.Ledger, p vend.Payout)
		want   []string
	}{
		{"a reservation's amount was raised", func(t *testing.T, l *ledger.Ledger, p vend.Payout) {
			must(t, l.BypassForTest(ctx, []string{"payouts_state_machine"}, "UPDATE payouts SET amount_msat = 50000 WHERE id = ?", p.ID))
		}, []string{held, once}},
		{"a reservation's move was deleted", func(t *testing.T, l *ledger.Ledger, p vend.Payout) {
			must(t, l.BypassForTest(ctx, []string{"credit_moves_no_delete"}, "DELETE FROM credit_moves WHERE payout_id = ?", p.ID))
		}, []string{sum, book, once}},
		{"a reservation was released without giving the credit back", func(t *testing.T, l *ledger.Ledger, p vend.Payout) {
			must(t, l.BypassForTest(ctx, []string{"payouts_end"}, "UPDATE payouts SET state = 'released', ended_at = 0, end_entry_id = reserve_entry_id WHERE id = ?", p.ID))
		}, []string{held, once}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(t, "")
			topUp(t, l, acctA, 1, 100)
			p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: acctA, Method: vend.RefundCashu, MintURL: payoutMint, Amount: 40_000})
			if err != nil {
				t.Fatal(err)
			}
			mustVerify(t, l)
			tc.break_(t, l, p)
			rep, err := l.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = journal
			if got := failedChecks(rep); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				var b strings.Builder
				rep.WriteTo(&b)
				t.Fatalf("failed checks %q, want %q\n%s", got, tc.want, b.String())
			}
		})
	}
}
