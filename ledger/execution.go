package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// checkBinding refuses an execution that would send anything but what c
// sold.
func checkBinding(c vend.Call, b vend.Binding) error {
	if want := c.Binding(); b != want {
		return fmt.Errorf("%w: call %d sold %s %s/%s (args %.12s…), the execution would send %s %s/%s (args %.12s…)",
			vend.ErrExecutionMismatch, c.ID, want.Kind, want.Server, want.Name, want.ArgsHash, b.Kind, b.Server, b.Name, b.ArgsHash)
	}
	return nil
}

// recordExecution writes the record of one more execution of c, which
// sends b and was released by by, and counts it (the schema checks both
// against the call). A release the table of ways to pay refuses for c (an
// unknown scheme, a bound one of another client) is an error and nothing
// is written: the ledger keeps no execution its own verify would flag.
func recordExecution(ctx context.Context, tx *wtx, c *vend.Call, b vend.Binding, by vend.Release, now time.Time) error {
	if err := by.Check(c.NewCall); err != nil {
		return fmt.Errorf("call %d: %w", c.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO executions (call_id, seq, kind, server, tool, args_hash, started_at,
		released_by, released_transport, released_client) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.ID, c.Executions+1, string(b.Kind), b.Server, b.Name, b.ArgsHash, ms(now), string(by.Scheme), by.Transport, by.Client); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE calls SET executions = executions + 1 WHERE id = ?", c.ID); err != nil {
		return err
	}
	c.Executions++
	return nil
}

// StartExecution implements vend.Ledger.
func (l *Ledger) StartExecution(ctx context.Context, id vend.CallID, b vend.Binding, by vend.Release) (vend.Call, error) {
	var c vend.Call
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if c, err = getCall(ctx, tx, id); err != nil {
			return err
		}
		if c.State != vend.CallPaid {
			return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(vend.CallExecuting)}
		}
		if err := checkBinding(c, b); err != nil {
			return err
		}
		p, err := coveringPayment(ctx, tx, c)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO payment_claims (payment_id, call_id, claimed_at) VALUES (?, ?, ?)
			ON CONFLICT DO NOTHING`, p.ID, c.ID, ms(now))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("%w: payment %s", vend.ErrAlreadyClaimed, p.Ref)
		}
		if err := setCallState(ctx, tx, &c, vend.CallExecuting, "", now); err != nil {
			return err
		}
		return recordExecution(ctx, tx, &c, b, by, now)
	})
	if err != nil {
		return vend.Call{}, fmt.Errorf("start execution: %w", err)
	}
	return c, nil
}

// ResumeExecution implements vend.Ledger.
func (l *Ledger) ResumeExecution(ctx context.Context, id vend.CallID, b vend.Binding, by vend.Release) (vend.Call, error) {
	var c vend.Call
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if c, err = getCall(ctx, tx, id); err != nil {
			return err
		}
		if c.State != vend.CallExecuting || !c.Idempotent {
			return &vend.TransitionError{What: fmt.Sprintf("call %d (resume)", c.ID), From: string(c.State), To: string(vend.CallExecuting)}
		}
		if err := checkBinding(c, b); err != nil {
			return err
		}
		if err := recordExecution(ctx, tx, &c, b, by, now); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "UPDATE calls SET updated_at = ? WHERE id = ?", ms(now), c.ID)
		return err
	})
	if err != nil {
		return vend.Call{}, fmt.Errorf("resume execution: %w", err)
	}
	return c, nil
}

func storeResult(ctx context.Context, tx *wtx, id vend.CallID, r vend.Result, now time.Time) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO results (call_id, is_error, body, stored_at) VALUES (?, ?, ?, ?)",
		id, r.IsError, r.Body, ms(now))
	if isUnique(err) {
		return fmt.Errorf("call %d: a result is stored already", id)
	}
	return err
}

// Deliver implements vend.Ledger.
func (l *Ledger) Deliver(ctx context.Context, id vend.CallID, r vend.Result) error {
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		c, err := getCall(ctx, tx, id)
		if err != nil {
			return err
		}
		if !c.State.CanTransition(vend.CallDelivered) {
			return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(vend.CallDelivered)}
		}
		drawn, _, err := creditOfCall(ctx, tx, c.ID)
		if err != nil {
			return err
		}
		if drawn == "" { // paid by a payment, not from credit
			p, err := coveringPayment(ctx, tx, c)
			if err != nil {
				return err
			}
			if p.State != vend.PaymentSettled {
				return fmt.Errorf("call %d: payment %s is %s, not settled: settle the hold invoice before delivering: %w", c.ID, p.Ref, p.State, vend.ErrUnpaid)
			}
		}
		if err := storeResult(ctx, tx, id, r, now); err != nil {
			return err
		}
		if err := setCallState(ctx, tx, &c, vend.CallDelivered, "", now); err != nil {
			return err
		}
		return deliverCredit(ctx, tx, c, now)
	})
	if err != nil {
		return fmt.Errorf("deliver: %w", err)
	}
	return nil
}

// Fail implements vend.Ledger.
func (l *Ledger) Fail(ctx context.Context, id vend.CallID, r vend.Result, reason string) error {
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		c, err := getCall(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := setCallState(ctx, tx, &c, vend.CallFailed, reason, now); err != nil {
			return err
		}
		return storeResult(ctx, tx, id, r, now)
	})
	if err != nil {
		return fmt.Errorf("fail: %w", err)
	}
	return nil
}

// Refund implements vend.Ledger.
func (l *Ledger) Refund(ctx context.Context, id vend.CallID, reason string) error {
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		c, err := getCall(ctx, tx, id)
		if err != nil {
			return err
		}
		return refundCall(ctx, tx, c, reason, now)
	})
	if err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	return nil
}

// refundCall is Refund of call c inside tx.
func refundCall(ctx context.Context, tx *wtx, c vend.Call, reason string, now time.Time) error {
	if !c.State.CanTransition(vend.CallRefunded) {
		return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(vend.CallRefunded)}
	}
	// Which money comes back: a settled payment is owed back (a
	// refund entry); a hold invoice must have been canceled, which
	// returned the money by itself.
	var settled, accepted int
	var settledRef string
	if err := tx.QueryRowContext(ctx, `SELECT
		count(*) FILTER (WHERE state = 'settled'), count(*) FILTER (WHERE state = 'accepted'),
		coalesce(max(ref) FILTER (WHERE state = 'settled'), '')
		FROM payments WHERE call_id = ?`, c.ID).Scan(&settled, &accepted, &settledRef); err != nil {
		return err
	}
	if accepted > 0 {
		return fmt.Errorf("call %d: its hold invoice is still accepted: cancel it (EndPayment) before marking the refund: %w", c.ID, vend.ErrIllegalTransition)
	}
	if err := setCallState(ctx, tx, &c, vend.CallRefunded, reason, now); err != nil {
		return err
	}
	if settled > 0 {
		p, err := getPayment(ctx, tx, settledRef)
		if err != nil {
			return err
		}
		return postRefund(ctx, tx, p, c, reason, now)
	}
	_, err := giveBackCredit(ctx, tx, c, reason, now)
	return err
}

// Result implements vend.Ledger: a result pruned after the retention
// period (retention.go) is vend.ErrResultExpired, never an empty body.
func (l *Ledger) Result(ctx context.Context, id vend.CallID) (vend.Result, error) {
	var r vend.Result
	var stored int64
	var pruned sql.NullInt64
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT is_error, body, stored_at, pruned_at FROM results WHERE call_id = ?", id).
		Scan(&r.IsError, &r.Body, &stored, &pruned)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("result of call %d: %w", id, vend.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("result of call %d: %w", id, err)
	}
	r.StoredAt = fromMS(stored)
	if pruned.Valid {
		r.Body = nil
		return r, fmt.Errorf("result of call %d, pruned %s: %w", id, fromMS(pruned.Int64).Format(time.RFC3339), vend.ErrResultExpired)
	}
	return r, nil
}
