package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

var _ vend.GrantTokens = (*Ledger)(nil)

// AddGrantToken implements vend.GrantTokens: one row of grant_tokens
// (schema 11). The schema refuses a token for a call that is not an
// explicit-gating one, and a token hash recorded before.
func (l *Ledger) AddGrantToken(ctx context.Context, id vend.CallID, tokenHash string, expires time.Time) error {
	if expires.IsZero() {
		return errors.New("grant token: an expiry is required")
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO grant_tokens (token_hash, call_id, expires_at, created_at) VALUES (?, ?, ?, ?)",
			tokenHash, id, ms(expires), ms(now))
		return err
	})
	if err != nil {
		return fmt.Errorf("grant token of call %d: %w", id, l.fileError(err))
	}
	return nil
}

// GrantByToken implements vend.GrantTokens. It only reads.
func (l *Ledger) GrantByToken(ctx context.Context, tokenHash string) (vend.Call, time.Time, error) {
	var expires int64
	var id vend.CallID
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT call_id, expires_at FROM grant_tokens WHERE token_hash = ?", tokenHash).Scan(&id, &expires)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return vend.Call{}, time.Time{}, fmt.Errorf("grant token: %w", vend.ErrNotFound)
		}
		return vend.Call{}, time.Time{}, fmt.Errorf("grant token: %w", l.fileError(err))
	}
	c, err := l.Call(ctx, id)
	if err != nil {
		return vend.Call{}, time.Time{}, fmt.Errorf("grant token: %w", err)
	}
	return c, fromMS(expires), nil
}
