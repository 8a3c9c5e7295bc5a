package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

var _ vend.RequestClaimer = (*Ledger)(nil)

// ClaimRequest implements vend.RequestClaimer: it inserts key's claim for
// holder (ON CONFLICT DO NOTHING, as every claim here) and reports whether
// holder has it: the insert went through, or holder claimed key before (a
// copy of the request delivered again to the same instance). Another
// holder's claim is false. On PostgreSQL every write transaction holds
// the write lock (see the package doc), so two instances claiming the
// same key at once get true and false. It costs one write: capvend claims
// Nostr requests only on a shared (PostgreSQL) ledger.
func (l *Ledger) ClaimRequest(ctx context.Context, key, holder string) (bool, error) {
	if key == "" || holder == "" {
		return false, errors.New("claim request: key and holder are required")
	}
	var mine bool
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO request_claims (request_key, holder, claimed_at) VALUES (?, ?, ?)
			ON CONFLICT (request_key) DO NOTHING`, key, holder, ms(now))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil || n == 1 {
			mine = n == 1
			return err
		}
		var got string
		if err := tx.QueryRowContext(ctx, "SELECT holder FROM request_claims WHERE request_key = ?", key).Scan(&got); err != nil {
			return err
		}
		mine = got == holder
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("claim request: %w", err)
	}
	return mine, nil
}

// PruneRequestClaims deletes the request claims made before t and returns
// how many. Requests that old are refused anyway (outside the window).
func (l *Ledger) PruneRequestClaims(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM request_claims WHERE claimed_at < ?", ms(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune request claims: %w", err)
	}
	return n, nil
}
