package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// MCP HTTP sessions shared by the instances (table mcp_sessions): the
// front (adapters/mcpfront's SessionStore) keeps the SHA-256 (hex) of each
// session id its clients use, with when the session expires if idle, so
// that another instance accepts it. Coordination, not books.

// PutSession records session hash live until expires (a later expiry
// only: an earlier one leaves it), and deletes, at most once a minute,
// the sessions expired at the transaction's time. One write.
func (l *Ledger) PutSession(ctx context.Context, hash string, expires time.Time) error {
	if len(hash) != 64 {
		return errors.New("put session: the hash must be 64 hex digits")
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		if last := l.sessionsSwept.Load(); ms(now)-last >= time.Minute.Milliseconds() && l.sessionsSwept.CompareAndSwap(last, ms(now)) {
			if _, err := tx.ExecContext(ctx, "DELETE FROM mcp_sessions WHERE expires_at <= ?", ms(now)); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO mcp_sessions (id_hash, expires_at) VALUES (?, ?)
			ON CONFLICT (id_hash) DO UPDATE SET expires_at = excluded.expires_at
			WHERE mcp_sessions.expires_at < excluded.expires_at`, hash, ms(expires))
		return err
	})
	if err != nil {
		return fmt.Errorf("put session: %w", err)
	}
	return nil
}

// SessionLive reports whether session hash was recorded and has not
// expired at now. A read.
func (l *Ledger) SessionLive(ctx context.Context, hash string, now time.Time) (bool, error) {
	var expires int64
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT expires_at FROM mcp_sessions WHERE id_hash = ?", hash).Scan(&expires)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("session live: %w", err)
	}
	return expires > ms(now), nil
}

// EndSession forgets session hash (its client ended it).
func (l *Ledger) EndSession(ctx context.Context, hash string) error {
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM mcp_sessions WHERE id_hash = ?", hash)
		return err
	})
	if err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	return nil
}
