package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capvend/capvend/vend"
)

const callColumns = `id, transport, client, request_id, server, tool, args_hash, price_msat,
	idempotent, state, executions, reason, created_at, updated_at, kind, run_id`

type rowScanner interface{ Scan(dest ...any) error }

func scanCall(r rowScanner) (vend.Call, error) {
	var c vend.Call
	var created, updated int64
	var state, kind string
	err := r.Scan(&c.ID, &c.Transport, &c.Client, &c.RequestID, &c.Server, &c.Tool, &c.ArgsHash,
		&c.Price, &c.Idempotent, &state, &c.Executions, &c.Reason, &created, &updated, &kind, &c.Run)
	c.Kind = vend.ItemKind(kind)
	if errors.Is(err, sql.ErrNoRows) {
		return c, vend.ErrNotFound
	}
	c.State = vend.CallState(state)
	c.CreatedAt, c.UpdatedAt = fromMS(created), fromMS(updated)
	return c, err
}

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

func getCall(ctx context.Context, q querier, id vend.CallID) (vend.Call, error) {
	c, err := scanCall(q.QueryRowContext(ctx, "SELECT "+callColumns+" FROM calls WHERE id = ?", id))
	if err != nil {
		return c, fmt.Errorf("call %d: %w", id, err)
	}
	return c, nil
}

func getPayment(ctx context.Context, q querier, ref string) (vend.Payment, error) {
	p, err := scanPayment(q.QueryRowContext(ctx, "SELECT "+paymentColumns+" FROM payments WHERE ref = ?", ref))
	if err != nil {
		return p, fmt.Errorf("payment %s: %w", ref, err)
	}
	return p, nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// setCallState moves a call from one state to another inside tx, refusing
// anything that is not an edge of the state machine or whose current state
// is not from.
func setCallState(ctx context.Context, tx *wtx, c *vend.Call, to vend.CallState, reason string, now time.Time) error {
	if !c.State.CanTransition(to) {
		return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(to)}
	}
	res, err := tx.ExecContext(ctx, `UPDATE calls SET state = ?, reason = CASE WHEN ? = '' THEN reason ELSE ? END, updated_at = ?
		WHERE id = ? AND state = ?`, string(to), reason, reason, ms(now), c.ID, string(c.State))
	if err != nil {
		if isConstraint(err) {
			return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(to)}
		}
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(to)}
	}
	tx.changed(vend.Change{What: vend.ChangeCall, Call: c.ID, Kind: c.Kind.Or(), Server: c.Server, Tool: c.Tool,
		Price: c.Price, CallFrom: c.State, CallTo: to, Reason: reason, Since: now.Sub(c.UpdatedAt)})
	c.State, c.UpdatedAt = to, now
	if reason != "" {
		c.Reason = reason
	}
	return nil
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

// RecordCall implements vend.Ledger.
func (l *Ledger) RecordCall(ctx context.Context, nc vend.NewCall) (vend.Call, bool, error) {
	if err := validateNewCall(nc); err != nil {
		return vend.Call{}, false, err
	}
	var call vend.Call
	var created bool
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		call, created, err = recordCall(ctx, tx, nc, now)
		return err
	})
	if err != nil {
		return vend.Call{}, false, fmt.Errorf("record call: %w", err)
	}
	return call, created, nil
}

// recordCall is RecordCall's transaction body: the new call (created), or
// the call of the same request key if it sells the same Binding.
func recordCall(ctx context.Context, tx *wtx, nc vend.NewCall, now time.Time) (vend.Call, bool, error) {
	res, err := tx.ExecContext(ctx, `INSERT INTO calls (transport, client, request_id, server, tool, args_hash,
		price_msat, idempotent, state, created_at, updated_at, kind, refund_invoice, run_id, limit_key)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'quoted', ?, ?, ?, ?, ?, ?)
		ON CONFLICT (transport, client, request_id) DO NOTHING`,
		nc.Transport, nc.Client, nc.RequestID, nc.Server, nc.Tool, nc.ArgsHash, nc.Price, nc.Idempotent, ms(now), ms(now),
		string(nc.Kind.Or()), nc.RefundInvoice, nc.Run, nc.LimitKey)
	if err != nil {
		return vend.Call{}, false, err
	}
	n, _ := res.RowsAffected()
	created := n == 1
	call, err := callByRequest(ctx, tx, nc.Transport, nc.Client, nc.RequestID)
	if err != nil {
		return vend.Call{}, false, err
	}
	if !created {
		if call.Binding() != nc.Binding() {
			return vend.Call{}, false, fmt.Errorf("%w: request %q of %s is call %d (%s %s/%s)", vend.ErrRequestReused,
				nc.RequestID, nc.Client, call.ID, call.Kind.Or(), call.Server, call.Tool)
		}
		return call, false, nil
	}
	tx.changed(vend.Change{What: vend.ChangeCall, Call: call.ID, Kind: call.Kind.Or(), Server: call.Server, Tool: call.Tool,
		Price: call.Price, CallTo: call.State})
	// A request that was answered free under its quota may come back
	// priced (the quota is used up or gone), but only as the same
	// request.
	var freeServer string
	var freeHash sql.NullString
	err = tx.QueryRowContext(ctx, `SELECT server, args_hash FROM free_uses WHERE transport = ? AND client = ? AND request_id = ?`,
		nc.Transport, nc.Client, nc.RequestID).Scan(&freeServer, &freeHash)
	switch {
	case err == nil:
		if freeServer != nc.Server || !freeHash.Valid || freeHash.String != nc.ArgsHash {
			return vend.Call{}, false, fmt.Errorf("%w: request %q of %s was a free call with other parameters", vend.ErrRequestReused, nc.RequestID, nc.Client)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return vend.Call{}, false, err
	}
	if nc.ToolName == "" {
		return call, true, nil
	}
	args := nc.Arguments
	if args == nil {
		args = []byte("{}")
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO call_arguments (call_id, tool_name, arguments, explicit) VALUES (?, ?, ?, ?)",
		call.ID, nc.ToolName, args, nc.Explicit)
	return call, true, err
}

func validateNewCall(nc vend.NewCall) error {
	switch {
	case nc.Transport == "" || nc.Client == "" || nc.RequestID == "" || nc.Server == "" || nc.Tool == "":
		return errors.New("record call: transport, client, request id, server and tool are required")
	case nc.Kind.Or() != vend.KindTool && nc.Kind != vend.KindPrompt && nc.Kind != vend.KindResource:
		return fmt.Errorf("record call: unknown kind %q", nc.Kind)
	case len(nc.ArgsHash) != 64:
		return errors.New("record call: args hash must be a hex SHA-256")
	case nc.Price <= 0:
		return fmt.Errorf("record call: price must be positive, got %d msat (free calls are not recorded)", nc.Price)
	}
	return nil
}

// CancelQuote implements vend.Ledger.
func (l *Ledger) CancelQuote(ctx context.Context, id vend.CallID, reason string) error {
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		c, err := getCall(ctx, tx, id)
		if err != nil {
			return err
		}
		if c.State != vend.CallQuoted {
			return &vend.TransitionError{What: fmt.Sprintf("call %d", c.ID), From: string(c.State), To: string(vend.CallCanceled)}
		}
		return setCallState(ctx, tx, &c, vend.CallCanceled, reason, now)
	})
	if err != nil {
		return fmt.Errorf("cancel quote: %w", err)
	}
	return nil
}

// Call implements vend.Ledger.
func (l *Ledger) Call(ctx context.Context, id vend.CallID) (vend.Call, error) {
	return getCall(ctx, l.reader(ctx), id)
}

// callByRequest reads the call recorded for a request key.
func callByRequest(ctx context.Context, q querier, transport, client, requestID string) (vend.Call, error) {
	return scanCall(q.QueryRowContext(ctx, "SELECT "+callColumns+` FROM calls
		WHERE transport = ? AND client = ? AND request_id = ?`, transport, client, requestID))
}

// CallByRequest implements vend.Ledger.
func (l *Ledger) CallByRequest(ctx context.Context, transport, client, requestID string) (vend.Call, error) {
	c, err := callByRequest(ctx, l.reader(ctx), transport, client, requestID)
	if err != nil {
		return c, fmt.Errorf("call of request %s: %w", requestID, err)
	}
	return c, nil
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

// FindGrant implements vend.Ledger.
func (l *Ledger) FindGrant(ctx context.Context, client string, b vend.Binding) (vend.Call, error) {
	c, err := scanCall(l.reader(ctx).QueryRowContext(ctx, "SELECT "+callColumns+` FROM calls
		WHERE client = ? AND args_hash = ? AND state IN ('awaiting_payment', 'paid')
		AND kind = ? AND server = ? AND tool = ?
		ORDER BY id DESC LIMIT 1`, client, b.ArgsHash, string(b.Kind.Or()), b.Server, b.Tool))
	if err != nil {
		return c, fmt.Errorf("grant: %w", err)
	}
	return c, nil
}

// CallArguments implements vend.Ledger.
func (l *Ledger) CallArguments(ctx context.Context, id vend.CallID) (string, []byte, bool, error) {
	var tool string
	var args []byte
	var explicit bool
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT tool_name, arguments, explicit FROM call_arguments WHERE call_id = ?", id).
		Scan(&tool, &args, &explicit)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, false, fmt.Errorf("arguments of call %d: %w", id, vend.ErrNotFound)
	}
	if err != nil {
		return "", nil, false, fmt.Errorf("arguments of call %d: %w", id, err)
	}
	return tool, args, explicit, nil
}

// CallsIn implements vend.Ledger.
func (l *Ledger) CallsIn(ctx context.Context, states ...vend.CallState) ([]vend.Call, error) {
	if len(states) == 0 {
		return nil, nil
	}
	q := "SELECT " + callColumns + " FROM calls WHERE state IN (?" + strings.Repeat(", ?", len(states)-1) + ") ORDER BY id"
	args := make([]any, len(states))
	for i, s := range states {
		args[i] = string(s)
	}
	rows, err := l.reader(ctx).QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("calls: %w", err)
	}
	defer rows.Close()
	var out []vend.Call
	for rows.Next() {
		c, err := scanCall(rows)
		if err != nil {
			return nil, fmt.Errorf("calls: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
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

// checkBinding refuses an execution that would send anything but what c
// sold.
func checkBinding(c vend.Call, b vend.Binding) error {
	if want := c.Binding(); b != want {
		return fmt.Errorf("%w: call %d sold %s %s/%s (args %.12s…), the execution would send %s %s/%s (args %.12s…)",
			vend.ErrExecutionMismatch, c.ID, want.Kind, want.Server, want.Tool, want.ArgsHash, b.Kind, b.Server, b.Tool, b.ArgsHash)
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
		c.ID, c.Executions+1, string(b.Kind), b.Server, b.Tool, b.ArgsHash, ms(now), string(by.Scheme), by.Transport, by.Client); err != nil {
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

// ClaimProofs implements vend.Ledger.
func (l *Ledger) ClaimProofs(ctx context.Context, payment vend.PaymentID, proofs []vend.Proof) error {
	if err := checkProofs(proofs); err != nil {
		return fmt.Errorf("claim proofs: %w", err)
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error { return claimProofs(ctx, tx, payment, proofs, now) })
	if err != nil {
		return fmt.Errorf("claim proofs: %w", err)
	}
	return nil
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
