package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// The bounds of one dashboard read: every list it returns is at most this
// long, so a page costs the same on a ledger of any size.
const (
	DashboardCalls         = 100 // the newest calls
	DashboardPending       = 100 // open and held payments, owed refunds, a run's differences
	DashboardReconcileRuns = 5   // the newest reconciliation runs
)

// Dashboard is what the operator's dashboard shows, read from one
// consistent snapshot.
type Dashboard struct {
	Now time.Time
	// Tools is the net revenue of every item income account, ever
	// (what `capvend ledger balance` prints), by account name.
	Tools []ToolRevenue
	// Days is the net revenue per account on each of the last Days UTC
	// days that had any, oldest first.
	Days []DayRevenue
	// Pending sums what is on its way (as Balance does).
	Pending Pending
	// Open are the newest open payment requests not expired yet, Held the
	// hold invoices locked in, Owed the refunds owed: newest first, at
	// most DashboardPending each.
	Open, Held []vend.Payment
	Owed       []vend.Refund
	// Calls are the newest calls, newest first.
	Calls []CallSummary
	// Reconcile are the newest reconciliation runs, newest first.
	Reconcile []ReconcileRun
}

// CallSummary is one call as the dashboard lists it.
type CallSummary struct {
	vend.Call
	// Backend is the backend of its newest payment request, "" if none.
	Backend vend.Backend
	// Duration is from its quote to its last state change.
	Duration time.Duration
}

// Dashboard reads the dashboard of the last days UTC days (at least 1).
// Every query is bounded: revenue comes from account_days (schema 15),
// lists from indexes, with limits. Read only.
func (l *Ledger) Dashboard(ctx context.Context, days int) (*Dashboard, error) {
	days = max(days, 1)
	d := &Dashboard{Now: l.now().UTC()}
	now := ms(d.Now)
	since := d.Now.AddDate(0, 0, 1-days).Format(time.DateOnly)
	err := l.read(ctx, func(tx *sql.Tx) error {
		if err := d.readRevenue(ctx, tx, since); err != nil {
			return err
		}
		if err := d.readPending(ctx, tx, now); err != nil {
			return err
		}
		if err := d.readCalls(ctx, tx); err != nil {
			return err
		}
		return d.readReconcile(ctx, tx)
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	return d, nil
}

// readRevenue reads the revenue per tool (ever) and per day (since).
func (d *Dashboard) readRevenue(ctx context.Context, tx *sql.Tx, since string) (err error) {
	d.Tools, err = queryRows(ctx, tx, scanToolRevenue, `SELECT a.name, -sum(d.amount_msat), sum(d.settlements)
		FROM account_days d JOIN accounts a ON a.id = d.account_id
		WHERE `+incomeAccountsWhere+` GROUP BY a.name ORDER BY a.name`)
	if err != nil {
		return err
	}
	d.Days, err = queryRows(ctx, tx, scanDayRevenue, `SELECT d.day, a.name, -sum(d.amount_msat)
		FROM account_days d JOIN accounts a ON a.id = d.account_id
		WHERE d.day >= ? AND `+incomeAccountsWhere+` GROUP BY d.day, a.name ORDER BY d.day, a.name`, since)
	return err
}

// readPending reads the pending sums and lists (each by an index on
// state).
func (d *Dashboard) readPending(ctx context.Context, tx *sql.Tx, now int64) error {
	p := &d.Pending
	if err := tx.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM payments WHERE state = 'open' AND expires_at > ?1),
		(SELECT coalesce(sum(amount_msat), 0) FROM payments WHERE state = 'open' AND expires_at > ?1),
		(SELECT count(*) FROM payments WHERE state = 'accepted'),
		(SELECT coalesce(sum(amount_msat), 0) FROM payments WHERE state = 'accepted'),
		(SELECT count(*) FROM calls WHERE state = 'awaiting_payment'),
		(SELECT count(*) FROM refunds WHERE state = 'owed'),
		(SELECT coalesce(sum(amount_msat), 0) FROM refunds WHERE state = 'owed')`, now).
		Scan(&p.OpenPayments, &p.OpenAmount, &p.HeldPayments, &p.HeldAmount, &p.AwaitingCalls,
			&p.RefundsOwedCount, &p.RefundsOwed); err != nil {
		return err
	}
	var err error
	if d.Open, err = queryPayments(ctx, tx, `state = 'open' AND expires_at > ? ORDER BY id DESC LIMIT ?`, now, DashboardPending); err != nil {
		return err
	}
	if d.Held, err = queryPayments(ctx, tx, `state = 'accepted' ORDER BY id DESC LIMIT ?`, DashboardPending); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.state = 'owed' ORDER BY r.id DESC LIMIT ?", DashboardPending)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRefund(rows)
		if err != nil {
			return err
		}
		r.Token = "" // bearer: never shown
		d.Owed = append(d.Owed, r)
	}
	return rows.Err()
}

// queryPayments reads the payments matching where (SQL after WHERE).
func queryPayments(ctx context.Context, tx *sql.Tx, where string, args ...any) ([]vend.Payment, error) {
	rows, err := tx.QueryContext(ctx, "SELECT "+paymentColumns+" FROM payments WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []vend.Payment
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// readCalls reads the newest calls, each with its newest payment's
// backend.
func (d *Dashboard) readCalls(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, "SELECT "+callColumns+`,
		coalesce((SELECT p.backend FROM payments p WHERE p.call_id = calls.id ORDER BY p.id DESC LIMIT 1), '')
		FROM calls ORDER BY id DESC LIMIT ?`, DashboardCalls)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c CallSummary
		var backend string
		var err error
		if c.Call, err = scanCall(callAnd{rows, &backend}); err != nil {
			return err
		}
		c.Backend = vend.Backend(backend)
		c.Duration = c.UpdatedAt.Sub(c.CreatedAt)
		d.Calls = append(d.Calls, c)
	}
	return rows.Err()
}

// callAnd scans a call's columns followed by more.
type callAnd struct {
	r    rowScanner
	more *string
}

func (c callAnd) Scan(dest ...any) error { return c.r.Scan(append(dest, c.more)...) }

// readReconcile reads the newest reconciliation runs.
func (d *Dashboard) readReconcile(ctx context.Context, tx *sql.Tx) error {
	var err error
	d.Reconcile, err = reconcileRuns(ctx, tx, DashboardReconcileRuns, DashboardPending)
	return err
}

// CallHistory is everything the ledger holds about one call, for the
// dashboard's call page.
type CallHistory struct {
	Call vend.Call
	// Payments are its payment requests (their settlement included),
	// oldest first.
	Payments []vend.Payment
	// Executions are the times it was sent upstream, first first.
	Executions []Execution
	// Result is its stored answer's outcome, nil if none is stored.
	Result *ResultInfo
	// Refund is what is owed or was paid back for it, nil if nothing.
	Refund *vend.Refund
	// Entries are the journal entries about it or its payments (its
	// refund's payout too), oldest first, with their postings.
	Entries []JournalEntry
	// Differences are what reconciliation found about it.
	Differences []reconcile.Difference
}

// Execution is one recorded start of a call's execution.
type Execution struct {
	Seq          int
	Kind         vend.ItemKind
	Server, Tool string
	Started      time.Time
	// Backfilled: recorded by schema 7 for a call that ran before
	// executions were recorded (its values are the call's).
	Backfilled bool
}

// ResultInfo is a stored answer's outcome (not its body: it may hold the
// client's data).
type ResultInfo struct {
	IsError bool
	Stored  time.Time
	Bytes   int // the body's size, also once it is pruned
	// Pruned is when the body was replaced by its hash record after the
	// retention period; zero while it is kept.
	Pruned time.Time
}

// JournalEntry is one sealed or open journal entry and its postings.
type JournalEntry struct {
	ID          int64
	Time        time.Time
	Kind        string
	Description string
	PaymentID   vend.PaymentID
	Sealed      bool
	Postings    []Posting
}

// CallHistory reads call id's history from one snapshot; vend.ErrNotFound
// if there is no such call. Every query is by an index on the call. Read
// only.
func (l *Ledger) CallHistory(ctx context.Context, id vend.CallID) (*CallHistory, error) {
	h := &CallHistory{}
	err := l.read(ctx, func(tx *sql.Tx) error {
		var err error
		if h.Call, err = getCall(ctx, tx, id); err != nil {
			return err
		}
		if h.Payments, err = queryPayments(ctx, tx, "call_id = ? ORDER BY id", id); err != nil {
			return err
		}
		if err := h.readExecutions(ctx, tx); err != nil {
			return err
		}
		if err := h.readRefund(ctx, tx); err != nil {
			return err
		}
		if err := h.readEntries(ctx, tx); err != nil {
			return err
		}
		h.Differences, err = differences(ctx, tx, "call_id = ? ORDER BY id", id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("call history: %w", err)
	}
	return h, nil
}

// readExecutions reads the call's executions and its result's outcome.
func (h *CallHistory) readExecutions(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT seq, kind, server, tool, started_at, backfilled FROM executions
		WHERE call_id = ? ORDER BY seq`, h.Call.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var e Execution
		var kind string
		var started int64
		if err := rows.Scan(&e.Seq, &kind, &e.Server, &e.Tool, &started, &e.Backfilled); err != nil {
			return err
		}
		e.Kind, e.Started = vend.ItemKind(kind), fromMS(started)
		h.Executions = append(h.Executions, e)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var r ResultInfo
	var stored int64
	var pruned sql.NullInt64
	err = tx.QueryRowContext(ctx, "SELECT is_error, stored_at, coalesce(body_size, length(body)), pruned_at FROM results WHERE call_id = ?", h.Call.ID).
		Scan(&r.IsError, &stored, &r.Bytes, &pruned)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	r.Stored = fromMS(stored)
	if pruned.Valid {
		r.Pruned = fromMS(pruned.Int64)
	}
	h.Result = &r
	return nil
}

// readRefund reads the call's refund, if any.
func (h *CallHistory) readRefund(ctx context.Context, tx *sql.Tx) error {
	r, err := scanRefund(tx.QueryRowContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.call_id = ?", h.Call.ID))
	if errors.Is(err, vend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	r.Token = "" // bearer: never shown
	h.Refund = &r
	return nil
}

// readEntries reads the entries about the call, its payments and its
// refund's payout, with their postings.
func (h *CallHistory) readEntries(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT id, ts, kind, description, coalesce(payment_id, 0), sealed FROM entries
		WHERE call_id = ?1 OR payment_id IN (SELECT id FROM payments WHERE call_id = ?1)
			OR id IN (SELECT entry_id FROM refunds WHERE call_id = ?1 AND entry_id IS NOT NULL)
		ORDER BY id`, h.Call.ID)
	if err != nil {
		return err
	}
	for rows.Next() {
		var e JournalEntry
		var ts int64
		if err := rows.Scan(&e.ID, &ts, &e.Kind, &e.Description, &e.PaymentID, &e.Sealed); err != nil {
			rows.Close()
			return err
		}
		e.Time = fromMS(ts)
		h.Entries = append(h.Entries, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range h.Entries {
		if err := readPostings(ctx, tx, &h.Entries[i]); err != nil {
			return err
		}
	}
	return nil
}

// readPostings reads e's postings, in the order they were written.
func readPostings(ctx context.Context, tx *sql.Tx, e *JournalEntry) error {
	rows, err := tx.QueryContext(ctx, `SELECT a.name, p.amount_msat FROM postings p JOIN accounts a ON a.id = p.account_id
		WHERE p.entry_id = ? ORDER BY p.id`, e.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var p Posting
		if err := rows.Scan(&p.Account, &p.Amount); err != nil {
			return err
		}
		e.Postings = append(e.Postings, p)
	}
	return rows.Err()
}
