package ledger_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// TestSettleRestoredNeverRunsAnUnfinishedCall is a ledger restored from a
// backup with calls in every unfinished state: none of them may run
// (again), since the books lost what happened to them after the backup,
// and every payment made for them, before or after, ends booked and owed
// back, or returned (a hold invoice).
func TestSettleRestoredNeverRunsAnUnfinishedCall(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)

	delivered := deliverPaid(t, l, 1)
	quoted, _, err := l.RecordCall(ctx, newCall(2))
	if err != nil {
		t.Fatal(err)
	}
	awaiting, awaitingPay := quote(t, l, 3) // paid after the backup, below
	paid, paidPay := quote(t, l, 4)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: paidPay.Ref, Amount: paidPay.Amount}); err != nil {
		t.Fatal(err)
	}
	running, runningPay := quote(t, l, 5)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: runningPay.Ref, Amount: runningPay.Amount}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, running.ID, running.Binding(), running.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	// Two paid calls with a locked-in hold invoice: LND settles one after
	// the backup (its call ran then), the other stays locked in.
	hold := func(i int) (vend.Call, vend.Payment) {
		c, _, err := l.RecordCall(ctx, newCall(i))
		if err != nil {
			t.Fatal(err)
		}
		np := newPayment(i)
		np.Kind = vend.KindHoldInvoice
		np.HoldPreimage = []byte(fmt.Sprintf("%032d", i))
		p, err := l.RecordPayment(ctx, c.ID, np)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.AcceptPayment(ctx, p.Ref); err != nil {
			t.Fatal(err)
		}
		return c, p
	}
	ranLater, ranLaterPay := hold(6)
	locked, lockedPay := hold(7)

	const reason = "restored from the replica"
	sum, err := l.SettleRestored(ctx, reason)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(s []vend.CallID) string { return fmt.Sprint(s) }
	if ids(sum.Canceled) != ids([]vend.CallID{quoted.ID, awaiting.ID}) || ids(sum.Refunded) != ids([]vend.CallID{paid.ID}) ||
		ids(sum.Failed) != ids([]vend.CallID{running.ID}) || ids(sum.Held) != ids([]vend.CallID{ranLater.ID, locked.ID}) {
		t.Fatalf("summary %+v", sum)
	}
	for id, want := range map[vend.CallID]vend.CallState{delivered.ID: vend.CallDelivered, quoted.ID: vend.CallCanceled,
		awaiting.ID: vend.CallCanceled, paid.ID: vend.CallRefunded, running.ID: vend.CallFailed,
		ranLater.ID: vend.CallPaid, locked.ID: vend.CallPaid} {
		if got := callState(t, l, id); got != want {
			t.Errorf("call %d is %s, want %s", id, got, want)
		}
	}
	if again, err := l.SettleRestored(ctx, reason); err != nil || again.Count() != len(sum.Held) {
		t.Fatalf("a second settle changed %+v (%v)", again, err)
	}
	mustVerify(t, l)

	// The client pays the canceled call's invoice after the restore: the
	// money is booked and owed back; the call stays canceled.
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: awaitingPay.Ref, Amount: awaitingPay.Amount}); err != nil {
		t.Fatal(err)
	}
	if got := callState(t, l, awaiting.ID); got != vend.CallCanceled {
		t.Fatalf("a late payment moved the canceled call to %s", got)
	}
	// LND settled the hold invoice after the backup: reconcile books it,
	// and the call, paid in the books, is refunded, never run.
	run, err := l.StartReconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := reconcile.Difference{Run: run, Kind: reconcile.SettledUnbooked, Backend: vend.BackendLND, Ref: ranLaterPay.Ref,
		CallID: ranLater.ID, Repair: reconcile.RepairPrefix + ": booked the late settlement"}
	if _, err := l.RepairSettlement(ctx, d, vend.Settlement{Ref: ranLaterPay.Ref, Amount: ranLaterPay.Amount}); err != nil {
		t.Fatal(err)
	}
	c, err := l.Call(ctx, ranLater.ID)
	if err != nil || c.State != vend.CallRefunded || c.Executions != 0 || !strings.Contains(c.Reason, "not run again") {
		t.Fatalf("the hold call settled after the backup: %+v %v", c, err)
	}
	runs, err := l.ReconcileRuns(ctx, 1)
	if err != nil || len(runs) != 1 || len(runs[0].Differences) != 1 || !strings.Contains(runs[0].Differences[0].Detail, "refunded, not run again") {
		t.Fatalf("the repair's difference does not say the call was refunded: %+v %v", runs, err)
	}
	// The same through the backend's watcher, which books what LND
	// settled while capvend was down.
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: lockedPay.Ref, Amount: lockedPay.Amount}); err != nil {
		t.Fatal(err)
	}
	if got := callState(t, l, locked.ID); got != vend.CallRefunded {
		t.Fatalf("the held call settled by the watcher is %s, want refunded", got)
	}
	b, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Owed back: the paid call (4), the late payment (3) and the hold
	// invoices LND settled (6, 7); the executing one (5) once serve
	// refunds it (it is failed).
	if b.Pending.RefundsOwed != 4*21_000 {
		t.Fatalf("refunds owed %d msat, want %d: %+v", b.Pending.RefundsOwed, 4*21_000, b.Pending)
	}
	mustVerify(t, l)
	if !ledger.OnPostgres() { // VerifyFile reads an SQLite file
		if rep, err := ledger.VerifyFile(ctx, path); err != nil || !rep.OK() {
			t.Fatalf("VerifyFile: %v %v", rep, err)
		}
	}
}

// TestLastChangeIsTheNewestWrite: the time doctor compares the replica
// with.
func TestLastChangeIsTheNewestWrite(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	if last, err := l.LastChange(ctx); err != nil || !last.IsZero() {
		t.Fatalf("empty ledger: %v %v", last, err)
	}
	deliverPaid(t, l, 1)
	first, err := l.LastChange(ctx)
	if err != nil || first.IsZero() {
		t.Fatalf("after a call: %v %v", first, err)
	}
	quote(t, l, 2)
	if next, err := l.LastChange(ctx); err != nil || !next.After(first) {
		t.Fatalf("after a quote: %v (before %v) %v", next, first, err)
	}
}
