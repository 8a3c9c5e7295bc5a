package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

var _ reconcile.Store = (*Ledger)(nil)

// CashuAssets implements reconcile.Store: the balance of every
// assets:cashu:<mint> account, by account name.
func (l *Ledger) CashuAssets(ctx context.Context) (map[string]vend.Msat, error) {
	out := map[string]vend.Msat{}
	err := l.read(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT a.name, coalesce(sum(p.amount_msat), 0)
			FROM accounts a JOIN postings p ON p.account_id = a.id JOIN entries e ON e.id = p.entry_id
			WHERE a.name LIKE 'assets:cashu:%' AND e.sealed = 1 GROUP BY a.name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var bal vend.Msat
			if err := rows.Scan(&name, &bal); err != nil {
				return err
			}
			out[name] = bal
		}
		return rows.Err()
	})
	return out, err
}

// ReconcileCursor implements reconcile.Store.
func (l *Ledger) ReconcileCursor(ctx context.Context, source string) (uint64, error) {
	var n uint64
	err := l.rdb.QueryRowContext(ctx, "SELECT add_index FROM reconcile_cursors WHERE source = ?", source).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reconcile cursor %s: %w", source, err)
	}
	return n, nil
}

// SaveReconcileCursor implements reconcile.Store: the cursor only moves
// forward.
func (l *Ledger) SaveReconcileCursor(ctx context.Context, source string, addIndex uint64) error {
	return l.write(ctx, func(tx *wtx, now time.Time) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO reconcile_cursors (source, add_index, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (source) DO UPDATE SET add_index = max(reconcile_cursors.add_index, excluded.add_index), updated_at = excluded.updated_at`,
			source, addIndex, ms(now))
		return err
	})
}

// StartReconcile implements reconcile.Store.
func (l *Ledger) StartReconcile(ctx context.Context) (int64, error) {
	var id int64
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		return tx.QueryRowContext(ctx, "INSERT INTO reconcile_runs (started_at) VALUES (?) RETURNING id", ms(now)).Scan(&id)
	})
	return id, err
}

// FinishReconcile implements reconcile.Store.
func (l *Ledger) FinishReconcile(ctx context.Context, s reconcile.Summary) error {
	var msg string
	if s.Err != nil {
		msg = s.Err.Error()
	}
	return l.write(ctx, func(tx *wtx, now time.Time) error {
		res, err := tx.ExecContext(ctx, `UPDATE reconcile_runs SET finished_at = ?, differences = ?, repaired = ?, error = ?
			WHERE id = ? AND finished_at IS NULL`, ms(now), len(s.Differences), s.Repaired, msg, s.Run)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("reconcile run %d: not found or finished already", s.Run)
		}
		return nil
	})
}

// RecordDifference implements reconcile.Store.
func (l *Ledger) RecordDifference(ctx context.Context, d reconcile.Difference) (reconcile.Difference, error) {
	err := l.write(ctx, func(tx *wtx, now time.Time) error { return insertDifference(ctx, tx, &d, now) })
	return d, err
}

// insertDifference writes d inside tx and sets its id.
func insertDifference(ctx context.Context, tx *wtx, d *reconcile.Difference, now time.Time) error {
	if d.FoundAt.IsZero() {
		d.FoundAt = now
	}
	err := tx.QueryRowContext(ctx, `INSERT INTO reconcile_differences
		(run_id, kind, backend, ref, call_id, mint_url, ledger, remote, detail, repair, found_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		d.Run, string(d.Kind), string(d.Backend), d.Ref, nullID(int64(d.CallID)), d.MintURL, d.Ledger, d.Remote,
		d.Detail, d.Repair, ms(d.FoundAt)).Scan(&d.ID)
	if err != nil {
		return fmt.Errorf("record difference: %w", err)
	}
	return nil
}

// RepairSettlement implements reconcile.Store: the settlement is booked
// through SettlePayment's claim (its entry's description ends with
// d.Repair), and d is written, in one transaction. Like SettlePayment,
// a hold invoice settled while its call is paid (never started: the
// books lost its run, restored from a backup) refunds the call; d's
// detail then says so.
func (l *Ledger) RepairSettlement(ctx context.Context, d reconcile.Difference, s vend.Settlement) (vend.Payment, error) {
	if !strings.HasPrefix(d.Repair, reconcile.RepairPrefix) {
		return vend.Payment{}, fmt.Errorf("repair settlement %s: the repair must say it is a reconcile repair", s.Ref)
	}
	if s.Amount <= 0 || s.Fee < 0 || s.Fee > s.Amount {
		return vend.Payment{}, fmt.Errorf("repair settlement %s: amount must be positive and fee within it", s.Ref)
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		lost, err := lostHoldRun(ctx, tx, s.Ref)
		if err != nil {
			return err
		}
		if p, err = settlePaymentNote(ctx, tx, s, now, d.Repair); err != nil {
			return err
		}
		if lost {
			d.Detail += "; its call had no run in the ledger: refunded, not run again"
		}
		return insertDifference(ctx, tx, &d, now)
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("repair settlement: %w", err)
	}
	return p, nil
}

// lostHoldRun reports whether the payment ref is a hold invoice whose
// call is paid, not started: settling it means the books lost the run.
func lostHoldRun(ctx context.Context, tx *wtx, ref string) (bool, error) {
	p, err := getPayment(ctx, tx, ref)
	if err != nil || p.Kind != vend.KindHoldInvoice {
		return false, err
	}
	c, err := getCall(ctx, tx, p.CallID)
	if err != nil {
		return false, err
	}
	return c.State == vend.CallPaid, nil
}

// RepairCanceled implements reconcile.Store: an open or accepted payment
// is ended canceled with the reason d.Repair (a call waiting for it too),
// a paid call that never started is refunded (no money was booked for a
// hold invoice that was only accepted), and d is written, in one
// transaction.
func (l *Ledger) RepairCanceled(ctx context.Context, d reconcile.Difference) (vend.Payment, error) {
	if !strings.HasPrefix(d.Repair, reconcile.RepairPrefix) {
		return vend.Payment{}, fmt.Errorf("repair cancel %s: the repair must say it is a reconcile repair", d.Ref)
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = getPayment(ctx, tx, d.Ref); err != nil {
			return err
		}
		switch p.State {
		case vend.PaymentSettled:
			return &vend.TransitionError{What: "payment " + p.Ref, From: string(p.State), To: string(vend.PaymentCanceled)}
		case vend.PaymentOpen, vend.PaymentAccepted:
			if err := endPayment(ctx, tx, &p, vend.PaymentCanceled, d.Repair, now); err != nil {
				return err
			}
		}
		if err := refundUnstarted(ctx, tx, p.CallID, d.Repair, now); err != nil {
			return err
		}
		return insertDifference(ctx, tx, &d, now)
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("repair cancel: %w", err)
	}
	return p, nil
}

// refundUnstarted refunds call id if it is paid (never started) or
// failed, and no payment covers it any more: its hold invoice is canceled,
// so the money went back by Lightning and nothing is owed. A call that is
// executing is left to the run that holds it: it cannot settle the
// canceled invoice, and refunds the call itself.
func refundUnstarted(ctx context.Context, tx *wtx, id vend.CallID, reason string, now time.Time) error {
	c, err := getCall(ctx, tx, id)
	if err != nil || (c.State != vend.CallPaid && c.State != vend.CallFailed) {
		return err
	}
	var covering int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM payments
		WHERE call_id = ? AND state IN ('settled', 'accepted')`, id).Scan(&covering); err != nil {
		return err
	}
	if covering > 0 {
		return nil
	}
	return setCallState(ctx, tx, &c, vend.CallRefunded, reason, now)
}

// ReconcileRun is one recorded reconciliation run and its differences.
type ReconcileRun struct {
	ID          int64
	Started     time.Time
	Finished    time.Time // zero while it runs (or if it was interrupted)
	Differences []reconcile.Difference
	// Found is how many differences the run found (it may list fewer:
	// ReconcileRuns lists them all, Dashboard a bounded number).
	Found    int
	Repaired int
	Error    string
}

// ReconcileRuns returns the newest n runs, newest first, with their
// differences. Read only.
func (l *Ledger) ReconcileRuns(ctx context.Context, n int) ([]ReconcileRun, error) {
	var out []ReconcileRun
	err := l.read(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = reconcileRuns(ctx, tx, n, -1)
		return err
	})
	return out, err
}

// reconcileRuns reads the newest n runs, newest first, with at most
// maxDiffs differences each (all if negative).
func reconcileRuns(ctx context.Context, tx *sql.Tx, n, maxDiffs int) ([]ReconcileRun, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, started_at, coalesce(finished_at, 0), differences, repaired, error
		FROM reconcile_runs ORDER BY id DESC LIMIT ?`, n)
	if err != nil {
		return nil, err
	}
	var out []ReconcileRun
	for rows.Next() {
		var r ReconcileRun
		var start, end int64
		if err := rows.Scan(&r.ID, &start, &end, &r.Found, &r.Repaired, &r.Error); err != nil {
			rows.Close()
			return nil, err
		}
		r.Started = time.UnixMilli(start).UTC()
		if end != 0 {
			r.Finished = time.UnixMilli(end).UTC()
		}
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		// No LIMIT for all: PostgreSQL refuses a negative one (SQLite
		// reads it as none).
		where, args := "run_id = ? ORDER BY id", []any{out[i].ID}
		if maxDiffs >= 0 {
			where, args = where+" LIMIT ?", append(args, maxDiffs)
		}
		if out[i].Differences, err = differences(ctx, tx, where, args...); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// differences reads the differences matching where (SQL after WHERE).
func differences(ctx context.Context, tx *sql.Tx, where string, args ...any) ([]reconcile.Difference, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, run_id, kind, backend, ref, coalesce(call_id, 0), mint_url, ledger, remote,
		detail, repair, found_at FROM reconcile_differences WHERE `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []reconcile.Difference
	for rows.Next() {
		var d reconcile.Difference
		var kind, backend string
		var found int64
		if err := rows.Scan(&d.ID, &d.Run, &kind, &backend, &d.Ref, &d.CallID, &d.MintURL, &d.Ledger, &d.Remote,
			&d.Detail, &d.Repair, &found); err != nil {
			return nil, err
		}
		d.Kind, d.Backend, d.FoundAt = reconcile.Kind(kind), vend.Backend(backend), time.UnixMilli(found).UTC()
		out = append(out, d)
	}
	return out, rows.Err()
}

// SchemaVersion returns the newest migration applied to the ledger, and
// the newest this capvend knows.
func (l *Ledger) SchemaVersion(ctx context.Context) (applied, known int, err error) {
	if err := l.rdb.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&applied); err != nil {
		return 0, 0, fmt.Errorf("schema version: %w", err)
	}
	files, err := migrationFiles()
	if err != nil {
		return 0, 0, err
	}
	if len(files) > 0 {
		known = files[len(files)-1].version
	}
	return applied, known, nil
}

// paymentsChunk is how many refs one query of PaymentsByRef names: well
// within SQLite's and PostgreSQL's limits on parameters.
const paymentsChunk = 500

// PaymentsByRef implements reconcile.Store: one query per paymentsChunk
// refs.
func (l *Ledger) PaymentsByRef(ctx context.Context, refs []string, skip vend.PaymentState) (map[string]vend.Payment, error) {
	out := map[string]vend.Payment{}
	err := inChunks(refs, func(in string, args []any) error {
		where := "ref " + in
		if skip != "" {
			where += " AND state <> ?"
			args = append(args, string(skip))
		}
		ps, err := l.payments(ctx, where, args...)
		for _, p := range ps {
			out[p.Ref] = p
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// inChunks calls fn for each paymentsChunk of refs with its "IN (?, ...)"
// clause and the refs as arguments (room left for one more).
func inChunks(refs []string, fn func(in string, args []any) error) error {
	for len(refs) > 0 {
		n := min(len(refs), paymentsChunk)
		args := make([]any, n, n+1)
		for i := range args {
			args[i] = refs[i]
		}
		if err := fn("IN (?"+strings.Repeat(", ?", n-1)+")", args); err != nil {
			return err
		}
		refs = refs[n:]
	}
	return nil
}
