package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// dashboardMatchesBalance fails t unless the dashboard's revenue (read
// from account_days) equals the journal's (Balance sums the postings).
func dashboardMatchesBalance(t *testing.T, l *ledger.Ledger) *ledger.Dashboard {
	t.Helper()
	ctx := context.Background()
	b, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Dashboard(ctx, 3650)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Tools, b.Tools) {
		t.Errorf("dashboard revenue per tool %+v, balance %+v", d.Tools, b.Tools)
	}
	if !reflect.DeepEqual(d.Days, b.Days) {
		t.Errorf("dashboard revenue per day %+v, balance %+v", d.Days, b.Days)
	}
	if d.Pending != b.Pending {
		t.Errorf("dashboard pending %+v, balance %+v", d.Pending, b.Pending)
	}
	return d
}

// The dashboard's revenue per tool and per day, and its pending sums,
// equal `capvend ledger balance`'s; it lists the newest calls with their
// backend, the open payments and the refunds owed.
func TestDashboardAgreesWithBalance(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "") // its clock crosses midnight: two days of revenue
	for i := 1; i <= 40; i++ {
		deliverPaid(t, l, i)
	}
	refunded, _ := failRefunded(t, l, 41, "", 0)
	_, open := quote(t, l, 42)
	unpaid, _, err := l.RecordCall(ctx, newCall(43))
	if err != nil {
		t.Fatal(err)
	}
	d := dashboardMatchesBalance(t, l)
	if len(d.Days) != 2 || d.Tools[0].Calls != 41 || d.Tools[0].Revenue != 40*21_000 {
		t.Fatalf("revenue %+v per day %+v", d.Tools, d.Days)
	}
	if len(d.Calls) != 43 || d.Calls[0].ID != unpaid.ID || d.Calls[0].Backend != "" || d.Calls[1].Backend != vend.BackendLND ||
		d.Calls[1].State != vend.CallAwaitingPayment || d.Calls[42].Duration <= 0 {
		t.Fatalf("calls %+v", d.Calls[:2])
	}
	if len(d.Open) != 1 || d.Open[0].Ref != open.Ref || len(d.Held) != 0 {
		t.Fatalf("open %+v held %+v", d.Open, d.Held)
	}
	if len(d.Owed) != 1 || d.Owed[0].CallID != refunded.ID || d.Owed[0].Amount != 21_000 {
		t.Fatalf("owed %+v", d.Owed)
	}
	// Bounded: the newest DashboardCalls calls only.
	for i := 44; i < 44+ledger.DashboardCalls; i++ {
		if _, _, err := l.RecordCall(ctx, newCall(i)); err != nil {
			t.Fatal(err)
		}
	}
	if d, err = l.Dashboard(ctx, 1); err != nil || len(d.Calls) != ledger.DashboardCalls || len(d.Days) != 1 {
		t.Fatalf("%v: %d calls, %d days", err, len(d.Calls), len(d.Days))
	}
	mustVerify(t, l)
}

// A call's history has its quote, payment and settlement, execution,
// answer, refund, every journal entry with its postings, and what
// reconciliation found about it.
func TestCallHistory(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, p := failRefunded(t, l, 1, "", 0)
	run, err := l.StartReconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.RecordDifference(ctx, reconcile.Difference{Run: run, Kind: reconcile.BookedUnsettled, Backend: vend.BackendLND,
		Ref: p.Ref, CallID: c.ID, Ledger: "settled", Remote: "canceled"}); err != nil {
		t.Fatal(err)
	}
	if err := l.FinishReconcile(ctx, reconcile.Summary{Run: run, Differences: make([]reconcile.Difference, 1)}); err != nil {
		t.Fatal(err)
	}
	h, err := l.CallHistory(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if h.Call.ID != c.ID || h.Call.State != vend.CallRefunded || len(h.Payments) != 1 || h.Payments[0].State != vend.PaymentSettled ||
		h.Payments[0].Settled != 21_000 || len(h.Executions) != 1 || h.Result == nil || !h.Result.IsError ||
		h.Refund == nil || h.Refund.State != vend.RefundOwed {
		t.Fatalf("history %+v", h)
	}
	var kinds []string
	for _, e := range h.Entries {
		var sum vend.Msat
		for _, p := range e.Postings {
			sum += p.Amount
		}
		if !e.Sealed || len(e.Postings) < 2 || sum != 0 {
			t.Errorf("entry %+v", e)
		}
		kinds = append(kinds, e.Kind)
	}
	if strings.Join(kinds, ",") != "settlement,refund" {
		t.Errorf("entries %v", kinds)
	}
	if len(h.Differences) != 1 || h.Differences[0].Kind != reconcile.BookedUnsettled || h.Differences[0].Run != run {
		t.Errorf("differences %+v", h.Differences)
	}
	d, err := l.Dashboard(ctx, 1)
	if err != nil || len(d.Reconcile) != 1 || d.Reconcile[0].Found != 1 || len(d.Reconcile[0].Differences) != 1 {
		t.Fatalf("dashboard reconcile: %v %+v", err, d.Reconcile)
	}
	if _, err := l.CallHistory(ctx, 999); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("a call that does not exist: %v", err)
	}
}

// Schema 16 adds up the journal written before it, and ledger verify
// finds account_days changed behind the journal's back.
func TestAccountDaysMigrationAndVerify(t *testing.T) {
	ledger.SkipOnPostgres(t, "it writes a schema-14 SQLite file by hand; a PostgreSQL ledger is created at the newest schema")
	path := filepath.Join(t.TempDir(), "old.db")
	db := legacyLedger(t, path, 14)
	day := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	for _, q := range []string{
		`INSERT INTO accounts (id, name, type, created_at) VALUES (1, 'assets:lightning:lnd', 'assets', 0),
			(2, 'income:tools:demo:echo', 'income', 0), (3, 'liabilities:refunds', 'liabilities', 0)`,
		fmt.Sprintf(`INSERT INTO entries (id, ts, kind, description) VALUES (1, %d, 'settlement', 'a'), (2, %d, 'settlement', 'b'),
			(3, %d, 'adjustment', 'c')`, day, day+1, day+86_400_000),
		`INSERT INTO postings (entry_id, account_id, amount_msat) VALUES (1, 1, 5000), (1, 2, -5000), (2, 1, 7000), (2, 2, -7000),
			(3, 2, 5000), (3, 1, -5000)`,
		`UPDATE entries SET sealed = 1`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	l := openLedger(t, path) // applies schema 15
	d := dashboardMatchesBalance(t, l)
	if len(d.Tools) != 1 || d.Tools[0].Revenue != 7_000 || d.Tools[0].Calls != 2 || len(d.Days) != 2 {
		t.Fatalf("after the migration: %+v %+v", d.Tools, d.Days)
	}
	mustVerify(t, l)
	if _, err := db.Exec("UPDATE account_days SET amount_msat = amount_msat + 1 WHERE account_id = 2 AND day = '2026-03-02'"); err != nil {
		t.Fatal(err)
	}
	r, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.WriteTo(&b)
	if r.OK() || !strings.Contains(b.String(), "2026-03-02 income:tools:demo:echo: the journal has 5000 msat in 0 settlements, account_days 5001 msat in 0") {
		t.Fatalf("verify after account_days was changed:\n%s", b.String())
	}
}
