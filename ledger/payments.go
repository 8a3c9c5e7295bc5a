package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

const paymentColumns = `id, backend, kind, ref, call_id, bolt11, mint_url, amount_msat, state,
	expires_at, created_at, updated_at, settled_at, settled_msat, fee_msat, add_index, settle_index`

func scanPayment(r rowScanner) (vend.Payment, error) {
	var p vend.Payment
	var backend, kind, state string
	var expires, created, updated int64
	var settledAt, settled sql.NullInt64
	err := r.Scan(&p.ID, &backend, &kind, &p.Ref, &p.CallID, &p.Bolt11, &p.MintURL, &p.Amount, &state,
		&expires, &created, &updated, &settledAt, &settled, &p.Fee, &p.AddIndex, &p.SettleIndex)
	if errors.Is(err, sql.ErrNoRows) {
		return p, vend.ErrNotFound
	}
	p.Backend, p.Kind, p.State = vend.Backend(backend), vend.PaymentKind(kind), vend.PaymentState(state)
	p.ExpiresAt, p.CreatedAt, p.UpdatedAt = fromMS(expires), fromMS(created), fromMS(updated)
	if settledAt.Valid {
		p.SettledAt = fromMS(settledAt.Int64)
	}
	p.Settled = vend.Msat(settled.Int64)
	return p, err
}

func getPayment(ctx context.Context, q querier, ref string) (vend.Payment, error) {
	p, err := scanPayment(q.QueryRowContext(ctx, "SELECT "+paymentColumns+" FROM payments WHERE ref = ?", ref))
	if err != nil {
		return p, fmt.Errorf("payment %s: %w", ref, err)
	}
	return p, nil
}

func setPaymentState(ctx context.Context, tx *wtx, p *vend.Payment, to vend.PaymentState, now time.Time) error {
	if !p.State.CanTransition(to) {
		return &vend.TransitionError{What: "payment " + p.Ref, From: string(p.State), To: string(to)}
	}
	res, err := tx.ExecContext(ctx, `UPDATE payments SET state = ?, updated_at = ? WHERE id = ? AND state = ?`,
		string(to), ms(now), p.ID, string(p.State))
	if err != nil {
		if isConstraint(err) {
			return &vend.TransitionError{What: "payment " + p.Ref, From: string(p.State), To: string(to)}
		}
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return &vend.TransitionError{What: "payment " + p.Ref, From: string(p.State), To: string(to)}
	}
	tx.changed(paymentChange(p, to, p.Amount, now))
	p.State, p.UpdatedAt = to, now
	return nil
}

// paymentChange is the Change of p moving to state to at now, amount
// being what it asks (or, settled, what it brought).
func paymentChange(p *vend.Payment, to vend.PaymentState, amount vend.Msat, now time.Time) vend.Change {
	return vend.Change{What: vend.ChangePayment, Call: p.CallID, Backend: p.Backend, Payment: p.Kind,
		PayFrom: p.State, PayTo: to, Amount: amount, Since: now.Sub(p.UpdatedAt)}
}

// Payment implements vend.Ledger.
func (l *Ledger) Payment(ctx context.Context, ref string) (vend.Payment, error) {
	return getPayment(ctx, l.reader(ctx), ref)
}

// RecordPayment implements vend.Ledger.
func (l *Ledger) RecordPayment(ctx context.Context, id vend.CallID, np vend.NewPayment) (vend.Payment, error) {
	if np.Ref == "" || np.Amount <= 0 || np.ExpiresAt.IsZero() {
		return vend.Payment{}, errors.New("record payment: ref, a positive amount and an expiry are required")
	}
	if np.Backend != vend.BackendLND && np.Backend != vend.BackendCashu && !np.Backend.IsNWC() {
		return vend.Payment{}, fmt.Errorf("record payment: unknown backend %q", np.Backend)
	}
	if (np.Kind == vend.KindHoldInvoice) != (len(np.HoldPreimage) == 32) {
		return vend.Payment{}, errors.New("record payment: a hold invoice needs its 32-byte preimage, and only a hold invoice has one")
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		p, err = recordPayment(ctx, tx, id, np, now)
		return err
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("record payment: %w", err)
	}
	p.HoldPreimage = nil
	return p, nil
}

// recordPayment is RecordPayment inside tx.
func recordPayment(ctx context.Context, tx *wtx, id vend.CallID, np vend.NewPayment, now time.Time) (vend.Payment, error) {
	c, err := getCall(ctx, tx, id)
	if err != nil {
		return vend.Payment{}, err
	}
	if np.Amount < c.Price {
		return vend.Payment{}, fmt.Errorf("payment amount %d msat is below the call's price %d msat", np.Amount, c.Price)
	}
	if err := setCallState(ctx, tx, &c, vend.CallAwaitingPayment, "", now); err != nil {
		return vend.Payment{}, err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO payments (backend, kind, ref, call_id, bolt11, mint_url, amount_msat,
		state, expires_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'open', ?, ?, ?)`,
		string(np.Backend), string(np.Kind), np.Ref, id, np.Bolt11, np.MintURL, np.Amount, ms(np.ExpiresAt), ms(now), ms(now))
	if isUnique(err) {
		return vend.Payment{}, fmt.Errorf("%w: %s", vend.ErrDuplicatePayment, np.Ref)
	}
	if err != nil {
		return vend.Payment{}, err
	}
	p, err := getPayment(ctx, tx, np.Ref)
	if err != nil {
		return p, err
	}
	tx.changed(vend.Change{What: vend.ChangePayment, Call: id, Backend: p.Backend, Payment: p.Kind, PayTo: p.State, Amount: p.Amount})
	if np.Kind == vend.KindHoldInvoice {
		_, err = tx.ExecContext(ctx, "INSERT INTO hold_preimages (payment_id, preimage) VALUES (?, ?)", p.ID, np.HoldPreimage)
	}
	return p, err
}

// CallPayments implements vend.Ledger.
func (l *Ledger) CallPayments(ctx context.Context, id vend.CallID) ([]vend.Payment, error) {
	return l.payments(ctx, "call_id = ?", id)
}

// payments lists payments matching where (with args), oldest first.
func (l *Ledger) payments(ctx context.Context, where string, args ...any) ([]vend.Payment, error) {
	rows, err := l.reader(ctx).QueryContext(ctx, "SELECT "+paymentColumns+" FROM payments WHERE "+where+" ORDER BY id", args...)
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	defer rows.Close()
	var out []vend.Payment
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			return nil, fmt.Errorf("payments: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// UnsettledPayments implements vend.Ledger.
func (l *Ledger) UnsettledPayments(ctx context.Context, backend vend.Backend) ([]vend.Payment, error) {
	return l.payments(ctx, "backend = ? AND state IN ('open', 'accepted')", string(backend))
}

// HoldPreimage implements vend.Ledger.
func (l *Ledger) HoldPreimage(ctx context.Context, ref string) ([]byte, error) {
	var pre []byte
	err := l.reader(ctx).QueryRowContext(ctx, `SELECT h.preimage FROM hold_preimages h JOIN payments p ON p.id = h.payment_id
		WHERE p.ref = ?`, ref).Scan(&pre)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("hold preimage of %s: %w", ref, vend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("hold preimage of %s: %w", ref, err)
	}
	return pre, nil
}

// AcceptPayment implements vend.Ledger.
func (l *Ledger) AcceptPayment(ctx context.Context, ref string) (vend.Payment, error) {
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = getPayment(ctx, tx, ref); err != nil {
			return err
		}
		if p.State == vend.PaymentAccepted {
			return nil // idempotent: the subscription may report it twice
		}
		if err := setPaymentState(ctx, tx, &p, vend.PaymentAccepted, now); err != nil {
			return err
		}
		return markCallPaid(ctx, tx, p.CallID, now)
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("accept payment: %w", err)
	}
	return p, nil
}

// markCallPaid moves a call waiting for its payment to paid. A call that
// moved on already (a hold invoice settled after execution) is left alone.
func markCallPaid(ctx context.Context, tx *wtx, id vend.CallID, now time.Time) error {
	c, err := getCall(ctx, tx, id)
	if err != nil {
		return err
	}
	if c.State != vend.CallAwaitingPayment {
		return nil
	}
	return setCallState(ctx, tx, &c, vend.CallPaid, "", now)
}

// SettlePayment implements vend.Ledger. A hold invoice settled while its
// call is paid, never started, refunds the call in the same transaction
// (the settlement owed back): LND settles one only after its call ran, so
// the books lost that run (a ledger restored from a backup), and the call
// must never run again.
func (l *Ledger) SettlePayment(ctx context.Context, s vend.Settlement) (vend.Payment, error) {
	if s.Amount <= 0 || s.Fee < 0 || s.Fee > s.Amount {
		return vend.Payment{}, fmt.Errorf("settle payment %s: amount must be positive and fee within it (amount %d, fee %d msat)", s.Ref, s.Amount, s.Fee)
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		p, err = settlePayment(ctx, tx, s, now)
		return err
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("settle payment: %w", err)
	}
	return p, nil
}

// settlePayment is SettlePayment inside tx. A token payment's proofs
// recorded swapping become swapped.
func settlePayment(ctx context.Context, tx *wtx, s vend.Settlement, now time.Time) (vend.Payment, error) {
	return settlePaymentNote(ctx, tx, s, now, "")
}

// settlePaymentNote is settlePayment, noting in the settlement entry's
// description who booked it when it was not the backend (a reconcile
// repair).
func settlePaymentNote(ctx context.Context, tx *wtx, s vend.Settlement, now time.Time, note string) (vend.Payment, error) {
	p, err := getPayment(ctx, tx, s.Ref)
	if err != nil {
		return p, err
	}
	if p.State == vend.PaymentSettled {
		return p, fmt.Errorf("%w: %s", vend.ErrAlreadySettled, s.Ref)
	}
	if s.Amount < p.Amount {
		return p, fmt.Errorf("%w: %d msat received, %d msat asked", vend.ErrUnderpaid, s.Amount, p.Amount)
	}
	late := p.State == vend.PaymentExpired || p.State == vend.PaymentCanceled
	if !p.State.CanTransition(vend.PaymentSettled) || (late && !vend.LatePayable(p.Kind)) {
		return p, &vend.TransitionError{What: "payment " + p.Ref, From: string(p.State), To: string(vend.PaymentSettled)}
	}
	// The state condition in the WHERE clause is the exactly-once
	// claim: of concurrent settlements only one sees a row to update.
	res, err := tx.ExecContext(ctx, `UPDATE payments SET state = 'settled', settled_at = ?, settled_msat = ?,
		fee_msat = ?, add_index = max(add_index, ?), settle_index = max(settle_index, ?), updated_at = ?
		WHERE id = ? AND state IN ('open', 'accepted', 'expired', 'canceled')`,
		ms(now), s.Amount, s.Fee, s.AddIndex, s.SettleIndex, ms(now), p.ID)
	if err != nil {
		return p, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return p, fmt.Errorf("%w: %s", vend.ErrAlreadySettled, s.Ref)
	}
	tx.changed(paymentChange(&p, vend.PaymentSettled, s.Amount, now))
	if p.Kind == vend.KindToken {
		if _, err := tx.ExecContext(ctx, `UPDATE cashu_proofs SET state = 'swapped', updated_at = ?
			WHERE payment_id = ? AND state = 'swapping'`, ms(now), p.ID); err != nil {
			return p, err
		}
	}
	c, err := getCall(ctx, tx, p.CallID)
	if err != nil {
		return p, err
	}
	if err := postSettlement(ctx, tx, p, c, s, now, note); err != nil {
		return p, err
	}
	if c.State == vend.CallExpired || c.State == vend.CallCanceled {
		// Paid after capvend gave up: the call never runs and the
		// money is owed back.
		if err := postRefund(ctx, tx, p, c, "paid after the request "+string(c.State), now); err != nil {
			return p, err
		}
	}
	if p.Kind == vend.KindHoldInvoice && c.State == vend.CallPaid {
		// A hold invoice is settled only by its call's run (vend
		// settles it, then stores the answer): settled while its call
		// never started, the books lost that run, restored from a
		// backup taken before it (SettleRestored leaves such calls to
		// serve). It is never run again: the money is owed back.
		reason := "the hold invoice was settled, so the call ran, but the ledger has no run of it (restored from a backup): owed back, not run again"
		if note != "" {
			reason = note + "; " + reason
		}
		if err := refundCall(ctx, tx, c, reason, now); err != nil {
			return p, err
		}
	}
	if err := markCallPaid(ctx, tx, p.CallID, now); err != nil {
		return p, err
	}
	return getPayment(ctx, tx, s.Ref)
}

// EndPayment implements vend.Ledger.
func (l *Ledger) EndPayment(ctx context.Context, ref string, to vend.PaymentState, reason string) (vend.Payment, error) {
	if to != vend.PaymentCanceled && to != vend.PaymentExpired {
		return vend.Payment{}, fmt.Errorf("end payment %s: %q is not an end state (want canceled or expired)", ref, to)
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = getPayment(ctx, tx, ref); err != nil {
			return err
		}
		return endPayment(ctx, tx, &p, to, reason, now)
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("end payment: %w", err)
	}
	return p, nil
}

// endPayment is EndPayment of p inside tx.
func endPayment(ctx context.Context, tx *wtx, p *vend.Payment, to vend.PaymentState, reason string, now time.Time) error {
	if err := setPaymentState(ctx, tx, p, to, now); err != nil {
		return err
	}
	c, err := getCall(ctx, tx, p.CallID)
	if err != nil {
		return err
	}
	next := vend.CallCanceled
	if to == vend.PaymentExpired {
		next = vend.CallExpired
	}
	if c.State == vend.CallAwaitingPayment || c.State == vend.CallQuoted {
		return setCallState(ctx, tx, &c, next, reason, now)
	}
	return nil
}

// coveringPayment returns the call's payment that pays for it: settled, or
// accepted (a hold invoice, settled after the tool succeeded).
func coveringPayment(ctx context.Context, q querier, c vend.Call) (vend.Payment, error) {
	p, err := scanPayment(q.QueryRowContext(ctx, "SELECT "+paymentColumns+` FROM payments
		WHERE call_id = ? AND state IN ('settled', 'accepted') AND amount_msat >= ?
		ORDER BY state = 'settled' DESC, id LIMIT 1`, c.ID, c.Price))
	if errors.Is(err, vend.ErrNotFound) {
		return p, fmt.Errorf("call %d: %w", c.ID, vend.ErrUnpaid)
	}
	return p, err
}
