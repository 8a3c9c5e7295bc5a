package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

const (
	acctA = "t0123456789abcdef01234567"
	acctB = "t89abcdef0123456789abcdef"
)

// topUp runs a top-up call of sats for account through the whole paid
// path (recorded, bound, paid, executed, delivered), as vend does.
func topUp(t testing.TB, l *ledger.Ledger, account string, i int, sats int64) vend.Call {
	t.Helper()
	ctx := context.Background()
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "buyer", RequestID: fmt.Sprint("topup-", i),
		Server: vend.CreditServer, Name: "topup", ArgsHash: hash(fmt.Sprint("topup", i)), Price: vend.Msat(sats * 1000), Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.BindTopUp(ctx, c.ID, account); err != nil {
		t.Fatal(err)
	}
	np := newPayment(1000 + i)
	np.Amount = c.Price
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[]}`)}); err != nil {
		t.Fatal(err)
	}
	return c
}

// creditCall records priced call i (21 sats) in state quoted.
func creditCall(t testing.TB, l *ledger.Ledger, i int) vend.Call {
	t.Helper()
	c, created, err := l.RecordCall(context.Background(), newCall(i))
	if err != nil || !created {
		t.Fatalf("record call %d: created=%v err=%v", i, created, err)
	}
	return c
}

func balance(t testing.TB, l *ledger.Ledger, account string) vend.Msat {
	t.Helper()
	b, err := l.CreditBalance(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var okBody = vend.Result{Body: []byte(`{"content":[{"type":"text","text":"ok"}]}`)}

// TestCreditBuyDrawDeliverGiveBack: 100 sats bought, five calls at 21
// sats: four draw (three delivered, one failed and given back), the fifth
// is refused as exhausted and changes nothing; the books agree.
func TestCreditBuyDrawDeliverGiveBack(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	if got := balance(t, l, acctA); got != 100_000 {
		t.Fatalf("balance after top-up %d msat, want 100000", got)
	}
	var calls []vend.Call
	for i := range 4 {
		c := creditCall(t, l, i)
		got, bal, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken))
		if err != nil {
			t.Fatalf("draw %d: %v", i, err)
		}
		if got.State != vend.CallExecuting || got.Executions != 1 || bal != vend.Msat(100_000-21_000*(i+1)) {
			t.Fatalf("draw %d: state %s executions %d balance %d", i, got.State, got.Executions, bal)
		}
		calls = append(calls, got)
	}
	fifth := creditCall(t, l, 4)
	_, _, err := l.DrawCredit(ctx, fifth.ID, acctA, fifth.Binding(), fifth.Released(vend.SchemeCreditToken))
	var ex *vend.CreditExhaustedError
	if !errors.As(err, &ex) || ex.Balance != 16_000 || ex.Price != 21_000 || ex.TopUpSats() != 5 {
		t.Fatalf("fifth draw: %v (%+v), want credit exhausted at 16000 msat", err, ex)
	}
	if s := callState(t, l, fifth.ID); s != vend.CallQuoted {
		t.Fatalf("refused draw left the call %s", s)
	}
	for _, c := range calls[:3] {
		must(t, l.Deliver(ctx, c.ID, okBody))
	}
	must(t, l.Fail(ctx, calls[3].ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "boom"))
	if got := balance(t, l, acctA); got != 16_000 {
		t.Fatalf("balance of a failed, not yet refunded call %d, want 16000 (drawn until refunded)", got)
	}
	must(t, l.Refund(ctx, calls[3].ID, "boom"))
	if got := balance(t, l, acctA); got != 37_000 {
		t.Fatalf("balance after give-back %d, want 37000", got)
	}
	// A draw closes once: no second delivery or give-back.
	if err := l.Refund(ctx, calls[3].ID, "again"); err == nil {
		t.Fatal("a second refund of a given-back call was booked")
	}
	mustVerify(t, l)
	accts, err := l.CreditAccounts(ctx, acctA)
	if err != nil {
		t.Fatal(err)
	}
	a := accts[0]
	if a.TopUps != 100_000 || a.Draws != 84_000 || a.GiveBacks != 21_000 || a.Balance != 37_000 || a.Calls != 4 {
		t.Fatalf("account %+v", a)
	}
	bal, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	bal.WriteTo(&b)
	for _, want := range []string{"liabilities:credit:" + acctA, "income:tools:demo:echo"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("balance report lacks %s:\n%s", want, b.String())
		}
	}
}

// TestConcurrentDrawsOnTheLastSats: eight calls draw on 21 sats at once:
// exactly one runs, the others are refused as exhausted.
func TestConcurrentDrawsOnTheLastSats(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 21)
	const n = 8
	var calls []vend.Call
	for i := range n {
		calls = append(calls, creditCall(t, l, i))
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, c := range calls {
		wg.Go(func() {
			_, _, errs[i] = l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken))
		})
	}
	wg.Wait()
	ran := 0
	for i, err := range errs {
		var ex *vend.CreditExhaustedError
		switch {
		case err == nil:
			ran++
		case errors.As(err, &ex):
		default:
			t.Fatalf("draw %d: %v", i, err)
		}
	}
	if ran != 1 || balance(t, l, acctA) != 0 {
		t.Fatalf("%d draws ran, balance %d; want 1 and 0", ran, balance(t, l, acctA))
	}
	mustVerify(t, l)
}

// TestCreditDrawSurvivesRestart: a draw open at a crash is still drawn
// after reopening, and the refund Recover books gives it back.
func TestCreditDrawSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	topUp(t, l, acctA, 1, 50)
	c := creditCall(t, l, 1)
	if _, _, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openLedger(t, path)
	if got := balance(t, l, acctA); got != 29_000 {
		t.Fatalf("balance after reopen %d", got)
	}
	mustVerify(t, l) // an open draw of an executing call is consistent
	if _, _, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken)); err == nil {
		t.Fatal("a call was drawn twice")
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err == nil {
		t.Fatal("a drawn call was claimed again")
	}
	must(t, l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "crashed"))
	must(t, l.Refund(ctx, c.ID, "crashed"))
	if got := balance(t, l, acctA); got != 50_000 {
		t.Fatalf("balance after give-back %d", got)
	}
	mustVerify(t, l)
}

// TestCreditRulesAreSchemaRules: the schema refuses what the API would
// never do: a negative balance, a second top-up or draw of a call, a
// top-up of the wrong account or amount, a changed or deleted move.
func TestCreditRulesAreSchemaRules(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	tu := topUp(t, l, acctA, 1, 10)
	c := creditCall(t, l, 1)
	if _, _, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken)); err == nil {
		t.Fatal("21 sats drawn on 10")
	}
	for _, tc := range []struct{ name, q string }{
		{"negative balance", "UPDATE credit_accounts SET balance_msat = -1 WHERE id = '" + acctA + "'"},
		{"changed move", "UPDATE credit_moves SET amount_msat = 99000000"},
		{"deleted move", "DELETE FROM credit_moves"},
		{"deleted account", "DELETE FROM credit_accounts"},
		{"second top-up", fmt.Sprintf(`INSERT INTO credit_moves (account_id, kind, amount_msat, call_id, entry_id, created_at)
			VALUES ('%s', 'topup', 10000, %d, (SELECT max(id) FROM entries), 0)`, acctA, tu.ID)},
		{"top-up of another account", fmt.Sprintf(`INSERT INTO credit_accounts (id, created_at) VALUES ('%s', 0);
			INSERT INTO credit_moves (account_id, kind, amount_msat, call_id, entry_id, created_at)
			VALUES ('%s', 'topup', 10000, %d, (SELECT max(id) FROM entries), 0)`, acctB, acctB, tu.ID)},
		{"draw beyond the balance", fmt.Sprintf(`INSERT INTO credit_moves (account_id, kind, amount_msat, call_id, entry_id, created_at)
			VALUES ('%s', 'draw', -21000, %d, (SELECT max(id) FROM entries), 0)`, acctA, c.ID)},
		{"give-back without a draw", fmt.Sprintf(`INSERT INTO credit_moves (account_id, kind, amount_msat, call_id, entry_id, created_at)
			VALUES ('%s', 'giveback', 21000, %d, (SELECT max(id) FROM entries), 0)`, acctA, c.ID)},
	} {
		if err := l.ExecForTest(ctx, tc.q); err == nil {
			t.Errorf("%s: the schema allowed it", tc.name)
		}
	}
	mustVerify(t, l)
}

// TestVerifyCatchesTamperedCredit: each way of breaking the credit books
// around the schema is caught by its check.
func TestVerifyCatchesTamperedCredit(t *testing.T) {
	const (
		sumMoves = "every credit account's balance equals its top-ups minus draws plus give-backs minus refunds and expiries"
		journal  = "every credit account's balance equals its journal account, and none is negative"
		moveBook = "every credit move is booked by its own entry on its account, and every credit entry is a move"
		drawn    = "drawn credit equals the draws of calls still running"
		drawEnd  = "a credit draw ends as its call: delivered to income, given back if refunded"
		topups   = "every delivered top-up credited its account once, with its price"
		covered  = "no delivered priced call without a settled payment"
		claimed  = "no call executed without payment"
		paid     = "paid calls have a settled or locked-in payment"
		unsealed = "no entry is left unsealed"
	)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, l *ledger.Ledger, delivered, running vend.Call)
		want   []string
	}{
		{"a balance was raised", func(t *testing.T, l *ledger.Ledger, _, _ vend.Call) {
			must(t, l.ExecForTest(ctx, "UPDATE credit_accounts SET balance_msat = balance_msat + 1000"))
		}, []string{sumMoves, journal}},
		{"a draw was deleted", func(t *testing.T, l *ledger.Ledger, _, running vend.Call) {
			must(t, l.BypassForTest(ctx, []string{"credit_moves_no_delete"}, "DELETE FROM credit_moves WHERE call_id = ? AND kind = 'draw'", running.ID))
		}, []string{claimed, paid, sumMoves, moveBook, drawn}},
		{"a delivery's move was deleted", func(t *testing.T, l *ledger.Ledger, delivered, _ vend.Call) {
			must(t, l.BypassForTest(ctx, []string{"credit_moves_no_delete"}, "DELETE FROM credit_moves WHERE call_id = ? AND kind = 'deliver'", delivered.ID))
		}, []string{moveBook, drawn, drawEnd}},
		{"a draw's amount was changed", func(t *testing.T, l *ledger.Ledger, delivered, _ vend.Call) {
			must(t, l.BypassForTest(ctx, []string{"credit_moves_immutable"}, "UPDATE credit_moves SET amount_msat = -1000 WHERE call_id = ? AND kind = 'draw'", delivered.ID))
		}, []string{covered, paid, sumMoves, moveBook}},
		{"a top-up was not credited", func(t *testing.T, l *ledger.Ledger, _, _ vend.Call) {
			must(t, l.BypassForTest(ctx, []string{"credit_moves_no_delete"}, "DELETE FROM credit_moves WHERE kind = 'topup'"))
		}, []string{sumMoves, moveBook, topups}},
		{"a running call's draw was closed", func(t *testing.T, l *ledger.Ledger, _, running vend.Call) {
			must(t, l.ExecForTest(ctx, `INSERT INTO entries (ts, kind, description) VALUES (0, 'adjustment', 'x')`))
			must(t, l.ExecForTest(ctx, fmt.Sprintf(`INSERT INTO credit_moves (account_id, kind, amount_msat, call_id, entry_id, created_at)
				VALUES ('%s', 'deliver', 0, %d, (SELECT max(id) FROM entries), 0)`, acctA, running.ID)))
		}, []string{unsealed, moveBook, drawn, drawEnd}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(t, "")
			topUp(t, l, acctA, 1, 100)
			topUp(t, l, acctB, 2, 5)
			d := creditCall(t, l, 1)
			if _, _, err := l.DrawCredit(ctx, d.ID, acctA, d.Binding(), d.Released(vend.SchemeCreditToken)); err != nil {
				t.Fatal(err)
			}
			must(t, l.Deliver(ctx, d.ID, okBody))
			r := creditCall(t, l, 2)
			if _, _, err := l.DrawCredit(ctx, r.ID, acctA, r.Binding(), r.Released(vend.SchemeCreditToken)); err != nil {
				t.Fatal(err)
			}
			deliverPaid(t, l, 3) // a neighbour paid per call
			mustVerify(t, l)
			tc.break_(t, l, d, r)
			rep, err := l.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := failedChecks(rep); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				var b strings.Builder
				rep.WriteTo(&b)
				t.Fatalf("failed checks %q, want %q\n%s", got, tc.want, b.String())
			}
		})
	}
}

// stepClock is a clock a test moves.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestCreditExpiresToIncomeWithAReason: a balance left past the expiry is
// booked to income, with its reason in the journal; a fresher one stays.
func TestCreditExpiresToIncomeWithAReason(t *testing.T) {
	ctx := context.Background()
	clk := &stepClock{t: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)}
	l, err := ledger.OpenForTest(t, ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	topUp(t, l, acctA, 1, 30)
	clk.add(20 * time.Hour)
	topUp(t, l, acctB, 2, 40)
	clk.add(5 * time.Hour)
	n, err := l.ExpireCredit(ctx, 24*time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("expired %d accounts (%v), want 1", n, err)
	}
	if a, b := balance(t, l, acctA), balance(t, l, acctB); a != 0 || b != 40_000 {
		t.Fatalf("balances %d, %d; want 0, 40000", a, b)
	}
	if n, err := l.ExpireCredit(ctx, 24*time.Hour); err != nil || n != 0 {
		t.Fatalf("second sweep expired %d (%v)", n, err)
	}
	var income int64
	must(t, l.QueryRowForTest(ctx, `SELECT -sum(p.amount_msat) FROM postings p JOIN accounts a ON a.id = p.account_id
		WHERE a.name = '`+ledger.AccountCreditExpired+`'`, &income))
	if income != 30_000 {
		t.Fatalf("expired credit income %d msat, want 30000", income)
	}
	var reason string
	must(t, l.QueryRowForTest(ctx, "SELECT reason FROM credit_moves WHERE kind = 'expiry'", &reason))
	if !strings.Contains(reason, "expired") || !strings.Contains(reason, acctA) {
		t.Fatalf("expiry reason %q", reason)
	}
	mustVerify(t, l)
}

// TestRefundCreditPaysWhatIsLeft: a refund takes what is left, never more.
func TestRefundCreditPaysWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	c := creditCall(t, l, 1)
	if _, _, err := l.DrawCredit(ctx, c.ID, acctA, c.Binding(), c.Released(vend.SchemeCreditToken)); err != nil {
		t.Fatal(err)
	}
	must(t, l.Deliver(ctx, c.ID, okBody))
	p := vend.CreditPayout{Method: vend.RefundCashu, MintURL: "http://127.0.0.1:3338", Paid: 80_000}
	if err := l.RefundCredit(ctx, acctA, p); err == nil {
		t.Fatal("refunded more than the balance")
	}
	p.Paid, p.Fee = 79_000, 1_000
	must(t, l.RefundCredit(ctx, acctA, p))
	if got := balance(t, l, acctA); got != 0 {
		t.Fatalf("balance after refund %d", got)
	}
	mustVerify(t, l)
}

// TestRecordCreditCallIsOneTransaction: RecordCreditCall records a new
// call and draws its price at once (executing, one execution, balance
// down); a replay of its request key draws nothing; a draw the balance
// does not cover, or a binding that is not the call's, records nothing
// (the request key stays free); concurrent calls on the last sats: one
// runs. The books verify.
func TestRecordCreditCallIsOneTransaction(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 42)

	nc := newCall(1)
	c, created, bal, err := l.RecordCreditCall(ctx, nc, acctA, nc.Binding(), nc.Released(vend.SchemeCreditToken))
	if err != nil || !created || bal != 21_000 || c.State != vend.CallExecuting || c.Executions != 1 {
		t.Fatalf("first: %+v created=%v balance=%d err=%v", c, created, bal, err)
	}
	again, created, _, err := l.RecordCreditCall(ctx, nc, acctA, nc.Binding(), nc.Released(vend.SchemeCreditToken))
	if err != nil || created || again.ID != c.ID || balance(t, l, acctA) != 21_000 {
		t.Fatalf("replay: %+v created=%v err=%v balance %d", again, created, err, balance(t, l, acctA))
	}
	if err := l.Deliver(ctx, c.ID, okBody); err != nil {
		t.Fatal(err)
	}

	bad := newCall(2)
	other := bad.Binding()
	other.ArgsHash = hash("something else")
	if _, _, _, err := l.RecordCreditCall(ctx, bad, acctA, other, bad.Released(vend.SchemeCreditToken)); !errors.Is(err, vend.ErrExecutionMismatch) {
		t.Fatalf("wrong binding: %v", err)
	}
	short := newCall(3)
	short.Price = 22_000
	var ex *vend.CreditExhaustedError
	if _, _, _, err := l.RecordCreditCall(ctx, short, acctA, short.Binding(), short.Released(vend.SchemeCreditToken)); !errors.As(err, &ex) || ex.Balance != 21_000 {
		t.Fatalf("short: %v", err)
	}
	for _, nc := range []vend.NewCall{bad, short} {
		if _, err := l.CallByRequest(ctx, nc.Transport, nc.Client, nc.RequestID); !errors.Is(err, vend.ErrNotFound) {
			t.Fatalf("a refused credit call was recorded (%s): %v", nc.RequestID, err)
		}
	}

	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		nc := newCall(10 + i)
		wg.Go(func() {
			_, _, _, errs[i] = l.RecordCreditCall(ctx, nc, acctA, nc.Binding(), nc.Released(vend.SchemeCreditToken))
		})
	}
	wg.Wait()
	ran := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ran++
		case errors.As(err, &ex):
		default:
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if ran != 1 || balance(t, l, acctA) != 0 {
		t.Fatalf("%d ran, balance %d; want 1 and 0", ran, balance(t, l, acctA))
	}
	mustVerify(t, l)
}
