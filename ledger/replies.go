package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// MaxReplyBytes bounds a stored reply; larger replies are not kept (a
// replay of that request is then served again).
const MaxReplyBytes = 1 << 20

// Reply returns the answer RememberReply stored for key, and whether
// there is one. It only reads.
func (l *Ledger) Reply(ctx context.Context, key string) ([]byte, bool, error) {
	var reply []byte
	err := l.rdb.QueryRowContext(ctx, "SELECT reply FROM request_replies WHERE request_key = ?", key).Scan(&reply)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reply %s: %w", key, l.fileError(err))
	}
	return reply, true, nil
}

// RememberReply stores the answer to the request key, once: it reports
// false, and changes nothing, when key already has one. Replies larger
// than MaxReplyBytes are not stored (false, nil). Atomic.
func (l *Ledger) RememberReply(ctx context.Context, key string, reply []byte) (bool, error) {
	if key == "" {
		return false, errors.New("remember reply: empty key")
	}
	if len(reply) > MaxReplyBytes {
		return false, nil
	}
	stored := false
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		res, err := tx.ExecContext(ctx, "INSERT INTO request_replies (request_key, reply, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
			key, reply, ms(now))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		stored = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("remember reply %s: %w", key, err)
	}
	return stored, nil
}

// PruneReplies deletes the replies stored before t and returns how many.
// Requests that old are refused anyway (outside the window).
func (l *Ledger) PruneReplies(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM request_replies WHERE created_at < ?", ms(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune replies: %w", err)
	}
	return n, nil
}
