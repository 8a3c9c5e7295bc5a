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
	err := r.Scan(&c.ID, &c.Transport, &c.Client, &c.RequestID, &c.Server, &c.Name, &c.ArgsHash,
		&c.Price, &c.Idempotent, &state, &c.Executions, &c.Reason, &created, &updated, &kind, &c.Run)
	c.Kind = vend.ItemKind(kind)
	if errors.Is(err, sql.ErrNoRows) {
		return c, vend.ErrNotFound
	}
	c.State = vend.CallState(state)
	c.CreatedAt, c.UpdatedAt = fromMS(created), fromMS(updated)
	return c, err
}

func getCall(ctx context.Context, q querier, id vend.CallID) (vend.Call, error) {
	c, err := scanCall(q.QueryRowContext(ctx, "SELECT "+callColumns+" FROM calls WHERE id = ?", id))
	if err != nil {
		return c, fmt.Errorf("call %d: %w", id, err)
	}
	return c, nil
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
	tx.changed(vend.Change{What: vend.ChangeCall, Call: c.ID, Kind: c.Kind.Or(), Server: c.Server, Tool: c.Name,
		Price: c.Price, CallFrom: c.State, CallTo: to, Reason: reason, Since: now.Sub(c.UpdatedAt)})
	c.State, c.UpdatedAt = to, now
	if reason != "" {
		c.Reason = reason
	}
	return nil
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
		nc.Transport, nc.Client, nc.RequestID, nc.Server, nc.Name, nc.ArgsHash, nc.Price, nc.Idempotent, ms(now), ms(now),
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
				nc.RequestID, nc.Client, call.ID, call.Kind.Or(), call.Server, call.Name)
		}
		return call, false, nil
	}
	tx.changed(vend.Change{What: vend.ChangeCall, Call: call.ID, Kind: call.Kind.Or(), Server: call.Server, Tool: call.Name,
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
	if nc.ExposedName == "" {
		return call, true, nil
	}
	args := nc.Arguments
	if args == nil {
		args = []byte("{}")
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO call_arguments (call_id, tool_name, arguments, explicit) VALUES (?, ?, ?, ?)",
		call.ID, nc.ExposedName, args, nc.Explicit)
	return call, true, err
}

func validateNewCall(nc vend.NewCall) error {
	switch {
	case nc.Transport == "" || nc.Client == "" || nc.RequestID == "" || nc.Server == "" || nc.Name == "":
		return errors.New("record call: transport, client, request id, server and tool are required")
	case nc.Kind.Or() != vend.ItemTool && nc.Kind != vend.ItemPrompt && nc.Kind != vend.ItemResource:
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

// FindGrant implements vend.Ledger.
func (l *Ledger) FindGrant(ctx context.Context, client string, b vend.Binding) (vend.Call, error) {
	c, err := scanCall(l.reader(ctx).QueryRowContext(ctx, "SELECT "+callColumns+` FROM calls
		WHERE client = ? AND args_hash = ? AND state IN ('awaiting_payment', 'paid')
		AND kind = ? AND server = ? AND tool = ?
		ORDER BY id DESC LIMIT 1`, client, b.ArgsHash, string(b.Kind.Or()), b.Server, b.Name))
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
