package ledger_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// failedChecks returns the names of the checks r reports failing.
func failedChecks(r *ledger.Report) []string {
	var out []string
	for _, c := range r.Checks {
		if c.Count > 0 {
			out = append(out, c.Name)
		}
	}
	return out
}

// holdPaid records call i paid with a hold invoice whose HTLC is locked
// in: the call is paid.
func holdPaid(t *testing.T, l *ledger.Ledger, i int) (vend.Call, vend.Payment) {
	t.Helper()
	ctx := context.Background()
	c, _, err := l.RecordCall(ctx, newCall(i))
	if err != nil {
		t.Fatal(err)
	}
	np := newPayment(i)
	np.Kind, np.HoldPreimage = vend.KindHoldInvoice, []byte(strings.Repeat("p", 32))
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = l.AcceptPayment(ctx, p.Ref); err != nil {
		t.Fatal(err)
	}
	return c, p
}

// TestVerifyCatchesEachBrokenRule breaks a healthy ledger in one way per
// case (through the API where a bug above the schema could, else around
// the schema's triggers the way a hand edit would) and expects exactly
// the matching check to fail.
func TestVerifyCatchesEachBrokenRule(t *testing.T) {
	const (
		execMatch  = "every execution sent exactly what its call sold (kind, server, tool, args hash)"
		execCount  = "each call's execution count equals its execution records"
		covered    = "paid calls have a settled or locked-in payment"
		claimed    = "no call executed without payment"
		hasResult  = "every call that ran keeps its stored result"
		schemaRule = "the schema's money rules are in place"
		released   = "every execution was released by a way to pay the table allows (bound ones only to the call's own client)"
	)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, l *ledger.Ledger)
		want   []string
	}{
		{"an execution sent other arguments", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"executions_immutable"}, "UPDATE executions SET args_hash = ? WHERE call_id = ?", hash("EXPENSIVE"), c.ID))
		}, []string{execMatch}},
		{"an execution ran another tool", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"executions_immutable"}, "UPDATE executions SET tool = 'sha256' WHERE call_id = ?", c.ID))
		}, []string{execMatch}},
		{"an execution record is gone", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"executions_no_delete"}, "DELETE FROM executions WHERE call_id = ?", c.ID))
		}, []string{execCount}},
		{"an execution was not recorded", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"calls_executions_recorded"}, "UPDATE calls SET executions = 2 WHERE id = ?", c.ID))
		}, []string{execCount}},
		{"a paid call's only payment was canceled", func(t *testing.T, l *ledger.Ledger) {
			_, p := holdPaid(t, l, 1)
			if _, err := l.EndPayment(ctx, p.Ref, vend.PaymentCanceled, "canceled"); err != nil {
				t.Fatal(err)
			}
		}, []string{covered}},
		{"an executing call's only payment was canceled", func(t *testing.T, l *ledger.Ledger) {
			c, p := holdPaid(t, l, 1)
			if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
				t.Fatal(err)
			}
			if _, err := l.EndPayment(ctx, p.Ref, vend.PaymentCanceled, "canceled"); err != nil {
				t.Fatal(err)
			}
		}, []string{claimed, covered}},
		{"a stored result was deleted", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"results_no_delete"}, "DELETE FROM results WHERE call_id = ?", c.ID))
		}, []string{hasResult}},
		{"a bound scheme released another client's call", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"executions_immutable"}, "UPDATE executions SET released_by = 'preimage', released_client = 'thief' WHERE call_id = ?", c.ID))
		}, []string{released}},
		{"a release by a scheme the table does not know", func(t *testing.T, l *ledger.Ledger) {
			c := deliverPaid(t, l, 1)
			must(t, l.BypassForTest(ctx, []string{"executions_immutable"}, "UPDATE executions SET released_by = 'made-up' WHERE call_id = ?", c.ID))
		}, []string{released}},
		{"a trigger was dropped", func(t *testing.T, l *ledger.Ledger) {
			deliverPaid(t, l, 1)
			must(t, l.ExecForTest(ctx, ledger.DropTriggerSQL("results_no_delete")))
		}, []string{schemaRule}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(t, "")
			// Legitimate neighbours: a failed call whose hold invoice was
			// canceled and refunded, and one in between (failed, canceled).
			for i, refund := range []bool{true, false} {
				c, p := holdPaid(t, l, 100+i)
				if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
					t.Fatal(err)
				}
				must(t, l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "boom"))
				if _, err := l.EndPayment(ctx, p.Ref, vend.PaymentCanceled, "canceled"); err != nil {
					t.Fatal(err)
				}
				if refund {
					must(t, l.Refund(ctx, c.ID, "boom"))
				}
			}
			mustVerify(t, l)
			tc.break_(t, l)
			r, err := l.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := failedChecks(r); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				var b strings.Builder
				r.WriteTo(&b)
				t.Fatalf("failed checks %q, want %q\n%s", got, tc.want, b.String())
			}
		})
	}
}

// TestExecutionsRecordTheirRelease: an execution records who released
// its call; a bound scheme's release to another client (or to a client
// without an identity), or one by a scheme the table does not know, is
// refused and nothing is recorded; a bearer scheme's release to another
// client is recorded; the schema refuses an execution without a release.
func TestExecutionsRecordTheirRelease(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	for i, tc := range []struct {
		by vend.Release
		ok bool
	}{
		{vend.Release{Scheme: vend.SchemePreimage, Transport: "t", Client: "thief"}, false},
		{vend.Release{Scheme: vend.SchemeGrant, Transport: "t", Client: ""}, false},
		{vend.Release{Scheme: "made-up", Transport: "t", Client: "x"}, false},
		{vend.Release{Scheme: vend.SchemePaymentToken, Transport: "t", Client: ""}, true},
	} {
		c, _ := holdPaid(t, l, 10+i)
		_, err := l.StartExecution(ctx, c.ID, c.Binding(), tc.by)
		if (err == nil) != tc.ok {
			t.Fatalf("%+v: %v", tc.by, err)
		}
		got, _ := l.Call(ctx, c.ID)
		if want := map[bool]int{true: 1, false: 0}[tc.ok]; got.Executions != want {
			t.Fatalf("%+v: %d executions", tc.by, got.Executions)
		}
	}
	c, _ := holdPaid(t, l, 20)
	if err := l.BypassForTest(ctx, []string{"executions_match_call"}, `INSERT INTO executions (call_id, seq, kind, server, tool, args_hash, started_at)
		VALUES (?, 1, 'tool', ?, ?, ?, 0)`, c.ID, c.Server, c.Name, c.ArgsHash); err == nil {
		t.Fatal("an execution without its release was recorded")
	}
	mustVerify(t, l)
}

// TestResultsAreNeverDeleted: the schema refuses to delete a stored
// result.
func TestResultsAreNeverDeleted(t *testing.T) {
	l := openLedger(t, "")
	c := deliverPaid(t, l, 1)
	if err := l.ExecForTest(context.Background(), "DELETE FROM results WHERE call_id = ?", c.ID); err == nil {
		t.Fatal("a stored result was deleted")
	}
}

// TestVerifyFullRunsIntegrityCheck: an index that no longer matches its
// table passes SQLite's quick_check but not integrity_check, which
// VerifyFull runs.
func TestVerifyFullRunsIntegrityCheck(t *testing.T) {
	ledger.SkipOnPostgres(t, "SQLite's integrity_check of a damaged schema")
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	deliverPaid(t, l, 1)
	deliverPaid(t, l, 2)
	l.Close()
	db, err := ledger.OpenRawForTest(t, path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"PRAGMA writable_schema = ON",
		"UPDATE sqlite_master SET sql = 'CREATE INDEX payments_call ON payments (amount_msat)' WHERE name = 'payments_call'"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	l = openLedger(t, path)
	if r, err := l.Verify(ctx); err != nil || !r.OK() {
		t.Fatalf("quick verify: %v %+v", err, r)
	}
	r, err := l.VerifyFull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := failedChecks(r); len(got) != 1 || !strings.Contains(got[0], "integrity_check") {
		var b strings.Builder
		r.WriteTo(&b)
		t.Fatalf("full verify of a damaged index: %q\n%s", got, b.String())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
