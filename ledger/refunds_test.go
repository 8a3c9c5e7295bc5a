package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// failRefunded runs call i through a settled payment (settled, with an
// overpayment of over msat) and a failed execution to its refund.
func failRefunded(t *testing.T, l *ledger.Ledger, i int, invoice string, over vend.Msat) (vend.Call, vend.Payment) {
	t.Helper()
	ctx := context.Background()
	nc := newCall(i)
	nc.RefundInvoice = invoice
	c, _, err := l.RecordCall(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.RecordPayment(ctx, c.ID, newPayment(i))
	if err != nil {
		t.Fatal(err)
	}
	if p, err = l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount + over}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte("{}")}, "tool failed"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, c.ID, "tool failed"); err != nil {
		t.Fatal(err)
	}
	return c, p
}

// accountBalance sums the sealed postings of any account (Balance lists
// only the non-income ones).
func accountBalance(t *testing.T, l *ledger.Ledger, name string) vend.Msat {
	t.Helper()
	db, err := ledger.OpenRawForTest(t, l.Path()+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sum vend.Msat
	if err := db.QueryRow(`SELECT coalesce(sum(p.amount_msat), 0) FROM postings p JOIN accounts a ON a.id = p.account_id
		JOIN entries e ON e.id = p.entry_id WHERE a.name = ? AND e.sealed = 1`, name).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestRefundIsOwedToTheClientThenPaidOnce: a refunded call's money is a
// refund owed to its client (with the refund invoice it gave), listed,
// counted by `ledger balance`, and paid out exactly once, however many
// payers race.
func TestRefundIsOwedToTheClientThenPaidOnce(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	const mint = "http://127.0.0.1:3338"
	c, p := failRefunded(t, l, 1, "lnbcrt210n1pclientrefund", 500)

	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != vend.RefundOwed || r.Amount != 21_500 || r.Transport != "mcp-http" || r.Client != "client-1" ||
		r.Invoice != "lnbcrt210n1pclientrefund" || r.PaymentID != p.ID || r.Backend != vend.BackendLND {
		t.Fatalf("refund %+v", r)
	}
	owed, err := l.Refunds(ctx, false)
	if err != nil || len(owed) != 1 || owed[0].ID != r.ID {
		t.Fatalf("owed %+v %v", owed, err)
	}
	b, _ := l.Balance(ctx)
	if b.Pending.RefundsOwed != 21_500 || b.Pending.RefundsOwedCount != 1 || b.Tools[0].Revenue != 0 {
		t.Fatalf("balance pending %+v revenue %+v", b.Pending, b.Tools)
	}
	if got := accountBalance(t, l, ledger.AccountOverpayment); got != 0 {
		t.Fatalf("the overpayment stayed income: %d", got)
	}
	mustVerify(t, l)

	// More than owed is refused, nothing booked.
	if _, err := l.PayRefund(ctx, r.ID, vend.RefundPayout{Method: vend.RefundBolt11, MintURL: mint, Paid: 21_501, Ref: "q"}); err == nil {
		t.Fatal("a payout above the owed amount was booked")
	}
	// 20 payers race: one books the payout, the others get ErrRefundPaid.
	var wins, paid atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.PayRefund(ctx, r.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: mint, Paid: 22_000, Fee: 1_000,
				Token: fmt.Sprint("cashuBtoken", g)})
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, vend.ErrRefundPaid):
				paid.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || paid.Load() != 19 {
		t.Fatalf("wins=%d already-paid=%d", wins.Load(), paid.Load())
	}
	r, _ = l.CallRefund(ctx, c.ID)
	if r.State != vend.RefundPaid || r.Method != vend.RefundCashu || r.Paid != 22_000 || r.Fee != 1_000 || !strings.HasPrefix(r.Token, "cashuBtoken") {
		t.Fatalf("paid refund %+v", r)
	}
	if owed, _ := l.Refunds(ctx, false); len(owed) != 0 {
		t.Fatalf("still owed: %+v", owed)
	}
	if all, _ := l.Refunds(ctx, true); len(all) != 1 {
		t.Fatalf("all refunds: %+v", all)
	}
	for acct, want := range map[string]vend.Msat{
		ledger.AccountRefunds:          0,
		ledger.CashuAccount(mint):      -23_000, // the token and its fee left the wallet
		ledger.CashuFeeAccount(mint):   1_000,
		ledger.AccountRefundRounding:   500, // 21.5 sat owed, a 22 sat token
		ledger.AccountLND:              21_500,
		"expenses:fees:lightning":      0,
		"liabilities:refunds:whatever": 0,
	} {
		if got := accountBalance(t, l, acct); got != want {
			t.Errorf("%s: %d msat, want %d", acct, got, want)
		}
	}
	if b, _ := l.Balance(ctx); b.Pending.RefundsOwed != 0 || b.Pending.RefundsOwedCount != 0 {
		t.Fatalf("owed after payout %+v", b.Pending)
	}
	mustVerify(t, l)

	// A bolt11 for less than owed: the rest stays income (the client asked
	// for less).
	c2, _ := failRefunded(t, l, 2, "", 0)
	r2, _ := l.CallRefund(ctx, c2.ID)
	if _, err := l.PayRefund(ctx, r2.ID, vend.RefundPayout{Method: vend.RefundBolt11, MintURL: mint, Paid: 20_000, Fee: 2_000, Ref: "melt-1"}); err != nil {
		t.Fatal(err)
	}
	if got := accountBalance(t, l, ledger.AccountOverpayment); got != -1_000 {
		t.Fatalf("income:overpayments %d, want -1000", got)
	}
	mustVerify(t, l)
}

// TestRefundRulesAreSchemaRules: whatever the Go code does, a refund is
// paid once and never edited, deleted or paid without its payout entry.
func TestRefundRulesAreSchemaRules(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c1, _ := failRefunded(t, l, 1, "", 0)
	c2, _ := failRefunded(t, l, 2, "", 0)
	r1, _ := l.CallRefund(ctx, c1.ID)
	if _, err := l.PayRefund(ctx, r1.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: "http://m", Paid: 21_000, Token: "cashuBx"}); err != nil {
		t.Fatal(err)
	}
	r2, _ := l.CallRefund(ctx, c2.ID)
	db, err := ledger.OpenRawForTest(t, l.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		fmt.Sprintf("UPDATE refunds SET state = 'owed', paid_at = NULL, method = NULL, paid_msat = NULL, fee_msat = NULL, mint_url = NULL, token = NULL, entry_id = NULL WHERE id = %d", r1.ID),
		fmt.Sprintf("UPDATE refunds SET token = 'cashuBother' WHERE id = %d", r1.ID),
		fmt.Sprintf("UPDATE refunds SET amount_msat = 1 WHERE id = %d", r2.ID),
		fmt.Sprintf("UPDATE refunds SET client = 'mallory' WHERE id = %d", r2.ID),
		fmt.Sprintf("DELETE FROM refunds WHERE id = %d", r2.ID),
		// Paid with another refund's payout entry, or with none.
		fmt.Sprintf("UPDATE refunds SET state = 'paid', paid_at = 1, method = 'cashu', paid_msat = 21000, fee_msat = 0, mint_url = 'x', token = 't', entry_id = (SELECT entry_id FROM refunds WHERE id = %d) WHERE id = %d", r1.ID, r2.ID),
		fmt.Sprintf("UPDATE refunds SET state = 'paid', paid_at = 1, method = 'cashu', paid_msat = 21000, fee_msat = 0, mint_url = 'x', token = 't', entry_id = 1 WHERE id = %d", r2.ID),
		// A second refund for a call.
		fmt.Sprintf("INSERT INTO refunds (call_id, payment_id, transport, client, amount_msat, state, created_at) SELECT call_id, payment_id, transport, client, amount_msat, 'owed', 1 FROM refunds WHERE id = %d", r2.ID),
		// A refund without its call's refund entry.
		"INSERT INTO refunds (call_id, payment_id, transport, client, amount_msat, state, created_at) VALUES (99, 99, 't', 'c', 1, 'owed', 1)",
	} {
		if _, err := db.Exec(q); err == nil {
			t.Errorf("the schema allowed: %s", q)
		}
	}
	if _, err := l.PayRefund(ctx, r1.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: "http://m", Paid: 21_000, Token: "cashuBy"}); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("second payout: %v", err)
	}
	mustVerify(t, l)
}

// TestVerifyChecksRefunds: a refund record that disagrees with the journal
// is reported.
func TestVerifyChecksRefunds(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c1, _ := failRefunded(t, l, 1, "", 0)
	failRefunded(t, l, 2, "", 0)
	r1, _ := l.CallRefund(ctx, c1.ID)
	if _, err := l.PayRefund(ctx, r1.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: "http://m", Paid: 21_000, Token: "cashuBx"}); err != nil {
		t.Fatal(err)
	}
	db, _ := ledger.OpenRawForTest(t, l.Path())
	defer db.Close()
	for _, q := range []string{
		ledger.DropTriggerSQL("refunds_paid_once"),
		ledger.DropTriggerSQL("refunds_payout_entry"),
		"UPDATE refunds SET amount_msat = 5000 WHERE call_id = 2",
		fmt.Sprintf("UPDATE refunds SET entry_id = NULL, state = 'owed', paid_at = NULL, method = NULL, paid_msat = NULL, fee_msat = NULL, mint_url = NULL, token = NULL WHERE id = %d", r1.ID),
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r, err := l.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.WriteTo(&b)
	out := b.String()
	for _, want := range []string{
		"FAIL  refunds owed equal the balance of liabilities:refunds",
		"FAIL  each paid refund has exactly one payout entry",
		"is a payout of no refund",
		"FAIL  the schema's refund rules are in place",
		"trigger refunds_paid_once is missing",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestLatePaymentIsARefundOwed: money that arrives after capvend gave up
// on the call (a mint quote paid late) is a refund owed to the client.
func TestLatePaymentIsARefundOwed(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, _, _ := l.RecordCall(ctx, newCall(1))
	np := newPayment(1)
	np.Backend, np.Kind, np.Ref, np.MintURL = vend.BackendCashu, vend.KindMintQuote, "quote-1", "http://127.0.0.1:3338"
	p, _ := l.RecordPayment(ctx, c.ID, np)
	l.EndPayment(ctx, p.Ref, vend.PaymentExpired, "expired")
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil || r.State != vend.RefundOwed || r.Amount != p.Amount || r.Backend != vend.BackendCashu || r.MintURL != np.MintURL {
		t.Fatalf("refund %+v %v", r, err)
	}
	mustVerify(t, l)
}

// TestMigrationKeepsProofsAndOwesOldRefunds: a ledger written before
// schema 8 keeps its Cashu proofs (now unique among unreleased ones) and
// its refund entries become refunds owed.
func TestMigrationKeepsProofsAndOwesOldRefunds(t *testing.T) {
	ledger.SkipOnPostgres(t, "it writes a schema-7 SQLite file by hand; a PostgreSQL ledger is created at the newest schema")
	path := filepath.Join(t.TempDir(), "old.db")
	db := legacyLedger(t, path, 7)
	// A refunded call as schema 6 booked it, and a received proof.
	for _, q := range []string{
		`INSERT INTO calls (id, transport, client, request_id, server, tool, args_hash, price_msat, state, reason, created_at, updated_at)
			VALUES (1, 'nostr', 'npub1client', 'ev1', 'demo', 'echo', '` + hash("a") + `', 21000, 'awaiting_payment', '', 1, 1)`,
		`INSERT INTO payments (id, backend, kind, ref, call_id, amount_msat, mint_url, state, expires_at, created_at, updated_at)
			VALUES (1, 'cashu', 'token', 'tok1', 1, 21000, 'http://mint', 'open', 9, 1, 1)`,
		`UPDATE payments SET state = 'settled', settled_at = 2, settled_msat = 21000 WHERE id = 1`,
		`UPDATE calls SET state = 'paid' WHERE id = 1`,
		`UPDATE calls SET state = 'refunded', reason = 'interrupted' WHERE id = 1`,
		`INSERT INTO accounts (id, name, type, created_at) VALUES (1, 'income:tools:demo:echo', 'income', 1),
			(2, 'liabilities:refunds', 'liabilities', 1), (3, 'assets:cashu:mint', 'assets', 1)`,
		`INSERT INTO entries (id, ts, kind, description, call_id, payment_id) VALUES (1, 2, 'settlement', 's', 1, 1), (2, 3, 'refund', 'r', 1, 1)`,
		`INSERT INTO postings (entry_id, account_id, amount_msat) VALUES (1, 3, 21000), (1, 1, -21000), (2, 1, 21000), (2, 2, -21000)`,
		`UPDATE entries SET sealed = 1`,
		`INSERT INTO cashu_proofs (secret_hash, amount_sat, keyset_id, mint_url, payment_id, state, created_at, updated_at)
			VALUES ('` + hash("secret") + `', 16, '00ab', 'http://mint', 1, 'received', 1, 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	l := openLedger(t, path)
	ctx := context.Background()
	r, err := l.CallRefund(ctx, 1)
	if err != nil || r.State != vend.RefundOwed || r.Amount != 21_000 || r.Client != "npub1client" {
		t.Fatalf("old refund: %+v %v", r, err)
	}
	if n, err := l.ProofsReceived(ctx, []string{hash("secret")}); err != nil || n != 1 {
		t.Fatalf("old proof: %d %v", n, err)
	}
	mustVerify(t, l)
}

// TestTokenSwapIsRecordedBeforeAndEndsOnce: a token's proofs are claimed
// swapping with their payment in one transaction; a swap that did not
// happen releases them (the same token may pay again), one that did is
// settled late with the refund owed, and each end is recorded once.
func TestTokenSwapIsRecordedBeforeAndEndsOnce(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	const mint = "http://127.0.0.1:3338"
	proofs := func(names ...string) []vend.Proof {
		var ps []vend.Proof
		for _, n := range names {
			ps = append(ps, vend.Proof{SecretHash: hash(n), Y: "02" + hash("y"+n), AmountSat: 16, KeysetID: "00ad268c4d1f5826", MintURL: mint})
		}
		return ps
	}
	token := func(i int, ref string, ps []vend.Proof) (vend.Call, vend.Payment, error) {
		c, _, _ := l.RecordCall(ctx, newCall(i))
		np := vend.NewPayment{Backend: vend.BackendCashu, Kind: vend.KindToken, Ref: ref, MintURL: mint, Amount: 21_000,
			ExpiresAt: newPayment(i).ExpiresAt}
		p, err := l.ClaimToken(ctx, c.ID, np, ps)
		return c, p, err
	}
	c1, p1, err := token(1, "tok-1", proofs("a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if s := callState(t, l, c1.ID); s != vend.CallAwaitingPayment || p1.State != vend.PaymentOpen {
		t.Fatalf("call %s payment %s", s, p1.State)
	}
	sw, err := l.SwappingTokens(ctx, []string{hash("b")})
	if err != nil || len(sw) != 1 || sw[0].Payment.Ref != "tok-1" || len(sw[0].Proofs) != 2 || sw[0].Proofs[0].Y == "" {
		t.Fatalf("swapping %+v %v", sw, err)
	}
	// A second claim of a swapping proof is refused whole: its call stays quoted.
	c2, _, err := token(2, "tok-2", proofs("c", "a"))
	if !errors.Is(err, vend.ErrProofSpent) {
		t.Fatalf("claim of a swapping proof: %v", err)
	}
	if s := callState(t, l, c2.ID); s != vend.CallQuoted {
		t.Fatalf("refused claim moved its call to %s", s)
	}
	// The mint says unspent: released, the call canceled; the same proofs
	// pay another call.
	if err := l.EndSwap(ctx, "tok-1", ledger.SwapReleased, "mint unreachable"); err != nil {
		t.Fatal(err)
	}
	if err := l.EndSwap(ctx, "tok-1", ledger.SwapReleased, "again"); !errors.Is(err, vend.ErrIllegalTransition) {
		t.Fatalf("second end: %v", err)
	}
	if s := callState(t, l, c1.ID); s != vend.CallCanceled {
		t.Fatalf("call %s after release", s)
	}
	if n, _ := l.ProofsReceived(ctx, []string{hash("a"), hash("b")}); n != 0 {
		t.Fatalf("released proofs still count as received: %d", n)
	}
	c3, p3, err := token(3, "tok-1.3", proofs("a", "b"))
	if err != nil {
		t.Fatalf("released proofs refused: %v", err)
	}
	// That swap happened but was never recorded: settled late, the call
	// never runs, its money is owed back.
	sp, err := l.SettleSwap(ctx, vend.Settlement{Ref: p3.Ref, Amount: 32_000, Fee: 1_000}, "interrupted")
	if err != nil || sp.State != vend.PaymentSettled {
		t.Fatalf("settle swap: %+v %v", sp, err)
	}
	if _, err := l.SettleSwap(ctx, vend.Settlement{Ref: p3.Ref, Amount: 32_000}, "again"); !errors.Is(err, vend.ErrAlreadySettled) {
		t.Fatalf("second settle: %v", err)
	}
	if s := callState(t, l, c3.ID); s != vend.CallCanceled {
		t.Fatalf("call %s after a late swap settlement", s)
	}
	if r, err := l.CallRefund(ctx, c3.ID); err != nil || r.State != vend.RefundOwed || r.Amount != 32_000 {
		t.Fatalf("refund %+v %v", r, err)
	}
	if sw, _ := l.SwappingTokens(ctx, nil); len(sw) != 0 {
		t.Fatalf("still swapping: %+v", sw)
	}
	if err := l.EndSwap(ctx, p3.Ref, ledger.SwapSpent, "x"); !errors.Is(err, vend.ErrIllegalTransition) {
		t.Fatalf("end of a settled swap: %v", err)
	}
	// Swapped proofs are never claimed again.
	if _, _, err := token(4, "tok-4", proofs("b")); !errors.Is(err, vend.ErrProofSpent) {
		t.Fatalf("swapped proof claimed again: %v", err)
	}
	mustVerify(t, l)
}
