package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// RestoreSummary says what SettleRestored did, call by call.
type RestoreSummary struct {
	// Canceled are the calls that waited for their quote or payment:
	// canceled, their payment requests left as they are, so that money
	// paid for one after the restore point is booked when the backend
	// reports it, and owed back (a late payment of a canceled call).
	Canceled []vend.CallID
	// Refunded are the paid calls that had not run: refunded (a settled
	// payment owed back, credit given back), never run.
	Refunded []vend.CallID
	// Failed are the calls that were running: failed, to be refunded by
	// serve's recovery (a locked-in hold invoice is canceled then), never
	// run again.
	Failed []vend.CallID
	// Held are the paid calls whose hold invoice was locked in: left to
	// serve, which cancels the invoice (the money goes back) or, if LND
	// settled it after the restore point (the call ran then), books the
	// settlement and owes it back (SettlePayment, reconcile's
	// RepairSettlement: a hold invoice settled while its call is paid
	// means the books lost its run).
	Held []vend.CallID
}

// Count is how many calls SettleRestored changed or left to serve.
func (s RestoreSummary) Count() int {
	return len(s.Canceled) + len(s.Refunded) + len(s.Failed) + len(s.Held)
}

// restoredResult is the stored answer of a call that was running at the
// restore point: the client who repeats the request gets it.
var restoredResult = func() []byte {
	b, _ := json.Marshal(map[string]any{"isError": true, "content": []map[string]string{{"type": "text",
		"text": "The server's records of this call were lost and restored from a backup; the call is not run again and your payment is refunded."}}})
	return b
}()

// SettleRestored ends the calls of a ledger just restored from a backup
// that were not final when the backup was taken. What happened to them
// after that point is not in the books (they may have been paid, run and
// answered), so none of them is ever run (again); the money is settled
// the safe way for the client, in one transaction:
//
//   - quoted or awaiting payment: canceled with reason; their payment
//     requests stay as they are, so a payment made for one (before or
//     after the restore) is booked when LND or the mint reports it, and
//     owed back;
//   - paid, not run: refunded (a settled payment is owed back, credit
//     given back), unless a hold invoice is locked in (Held: serve's
//     recovery cancels it, or books its settlement and owes it back);
//   - executing: failed, with a stored answer saying so; serve's
//     recovery refunds them (cancels a locked-in hold invoice).
//
// Final calls (delivered, refunded, expired, canceled) and failed ones
// (serve refunds those anyway) are left as they are. Idempotent: a second
// call finds nothing to do. reason is recorded with every change. A
// restored ledger must go through SettleRestored before serve opens it:
// serve would otherwise run a paid call that may have run already.
func (l *Ledger) SettleRestored(ctx context.Context, reason string) (RestoreSummary, error) {
	var sum RestoreSummary
	if reason == "" {
		return sum, errors.New("settle restored calls: a reason is required")
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		sum = RestoreSummary{}
		rows, err := tx.QueryContext(ctx, `SELECT id FROM calls
			WHERE state IN ('quoted', 'awaiting_payment', 'paid', 'executing') ORDER BY id`)
		if err != nil {
			return err
		}
		var ids []vend.CallID
		for rows.Next() {
			var id vend.CallID
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			c, err := getCall(ctx, tx, id)
			if err != nil {
				return err
			}
			switch c.State {
			case vend.CallQuoted, vend.CallAwaitingPayment:
				if err := setCallState(ctx, tx, &c, vend.CallCanceled, reason, now); err != nil {
					return err
				}
				sum.Canceled = append(sum.Canceled, id)
			case vend.CallPaid:
				var held int
				if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM payments
					WHERE call_id = ? AND state = 'accepted'`, id).Scan(&held); err != nil {
					return err
				}
				if held > 0 {
					sum.Held = append(sum.Held, id)
					continue
				}
				if err := refundCall(ctx, tx, c, reason, now); err != nil {
					return err
				}
				sum.Refunded = append(sum.Refunded, id)
			case vend.CallExecuting:
				if err := setCallState(ctx, tx, &c, vend.CallFailed, reason, now); err != nil {
					return err
				}
				if err := storeResult(ctx, tx, id, vend.Result{Body: restoredResult, IsError: true}, now); err != nil {
					return err
				}
				sum.Failed = append(sum.Failed, id)
			}
		}
		return nil
	})
	if err != nil {
		return RestoreSummary{}, fmt.Errorf("settle restored calls: %w", err)
	}
	return sum, nil
}

// LastChange returns when the books last changed: the newest time any
// call, payment, journal entry, Cashu proof, stored answer, refund or
// credit move was written (unix ms precision; the zero time for an empty
// ledger). capvend doctor compares it with the replica's newest file: the
// replica lags when the books changed after it.
func (l *Ledger) LastChange(ctx context.Context) (time.Time, error) {
	var last sql.NullInt64
	err := l.reader(ctx).QueryRowContext(ctx, `SELECT max(t) FROM (
		SELECT max(updated_at) AS t FROM calls
		UNION ALL SELECT max(updated_at) FROM payments
		UNION ALL SELECT max(ts) FROM entries
		UNION ALL SELECT max(updated_at) FROM cashu_proofs
		UNION ALL SELECT max(stored_at) FROM results
		UNION ALL SELECT max(coalesce(paid_at, created_at)) FROM refunds
		UNION ALL SELECT max(created_at) FROM credit_moves) AS changes`).Scan(&last)
	if err != nil {
		return time.Time{}, l.fileError(err)
	}
	if !last.Valid {
		return time.Time{}, nil
	}
	return time.UnixMilli(last.Int64), nil
}

// VerifyFile runs Verify on the SQLite ledger file at path, opened
// read-only (nothing is written to it, not even a migration): the check
// of a copy or a restored file before it is put in place. It returns
// ErrNotLedger for a file that is not a capvend ledger.
func VerifyFile(ctx context.Context, path string) (*Report, error) {
	rep, err := verifyCopy(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	return rep, nil
}
