package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/capvend/capvend/vend"
)

// MaxReplyBytes bounds a stored reply; larger replies are not kept (a
// replay of that request is then served again).
const MaxReplyBytes = 1 << 20

// Reply returns the answer RememberReply stored for key, and whether
// there is one. A reply pruned after the retention period (retention.go)
// is an error matching vend.ErrResultExpired: the request ran, and its
// answer is gone. It only reads.
func (l *Ledger) Reply(ctx context.Context, key string) ([]byte, bool, error) {
	if l.replyIdx != nil && !l.replyIdx.mayHave(key) {
		return nil, false, nil
	}
	var reply []byte
	var pruned sql.NullInt64
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT reply, pruned_at FROM request_replies WHERE request_key = ?", key).Scan(&reply, &pruned)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reply %s: %w", key, l.fileError(err))
	}
	if pruned.Valid {
		return nil, false, fmt.Errorf("reply %s, pruned %s: %w", key, fromMS(pruned.Int64).Format(time.RFC3339), vend.ErrResultExpired)
	}
	return reply, true, nil
}

// replyLinger is how long the first reply of a group commit waits for
// others before its transaction begins. A Nostr front stores each answer
// once it is published, so replies come one call apart (about 0.45 ms
// with 8 calls in flight): without the wait nearly every reply had a
// transaction of its own, and the BEGIN, COMMIT and the two PRAGMAs of
// writeRelaxed cost more than the INSERT. With 1 ms, 4.4 replies shared
// a commit and storing them was 15 % of capvend's CPU per free Nostr
// call; with 5 ms, every call in flight (8) shares it and that is 10 %
// (longer waits gather no more). Nobody waits for a stored reply but the
// request's own goroutine (its answer is out already); a crash within
// the wait loses those replies, and a replay then runs a free call again
// (a priced call is still found by its call record).
const replyLinger = 5 * time.Millisecond

// RememberReply stores the answer to the request key, once: it reports
// false, and changes nothing, when key already has one. Replies larger
// than MaxReplyBytes are not stored (false, nil). Atomic; durable against
// capvend being killed, not against a power cut (no fsync: see
// writeRelaxed). Concurrent callers share one transaction (group commit):
// the first waits replyLinger for others, and each returns once the
// transaction holding its reply committed.
func (l *Ledger) RememberReply(ctx context.Context, key string, reply []byte) (bool, error) {
	if key == "" {
		return false, errors.New("remember reply: empty key")
	}
	if len(reply) > MaxReplyBytes {
		return false, nil
	}
	req := &replyReq{key: key, reply: reply, done: make(chan struct{})}
	b := &l.replies
	b.mu.Lock()
	b.pending = append(b.pending, req)
	if b.writing {
		// A leader is waiting or committing: it takes this one in its
		// next batch.
		b.mu.Unlock()
		select {
		case <-req.done:
			return req.stored, req.err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	b.writing = true
	linger := b.linger
	b.mu.Unlock()
	if linger != nil {
		linger()
	} else {
		time.Sleep(replyLinger)
	}
	b.mu.Lock()
	for len(b.pending) > 0 {
		batch := b.pending
		b.pending = nil
		b.commits++
		b.mu.Unlock()
		l.commitReplies(context.WithoutCancel(ctx), batch)
		b.mu.Lock()
	}
	b.writing = false
	b.mu.Unlock()
	return req.stored, req.err
}

// replyBatch queues replies for group commit.
type replyBatch struct {
	mu      sync.Mutex
	pending []*replyReq
	writing bool // a caller is waiting for others or committing batches
	commits int  // batches committed (or tried), for tests

	// linger, set by tests only, replaces the leader's replyLinger wait.
	linger func()
}

type replyReq struct {
	key    string
	reply  []byte
	stored bool
	err    error
	done   chan struct{}
}

// commitReplies stores a batch in one transaction and tells each caller.
func (l *Ledger) commitReplies(ctx context.Context, batch []*replyReq) {
	err := l.writeRelaxed(ctx, func(tx *wtx, now time.Time) error {
		for _, r := range batch {
			if l.replyIdx != nil {
				l.replyIdx.add(r.key, ms(now))
			}
			res, err := tx.ExecContext(ctx, "INSERT INTO request_replies (request_key, reply, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
				r.key, r.reply, ms(now))
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			r.stored = n == 1
		}
		return nil
	})
	for _, r := range batch {
		if err != nil {
			r.stored, r.err = false, fmt.Errorf("remember reply %s: %w", r.key, err)
		}
		close(r.done)
	}
}

// PruneReplies deletes the replies stored before t and returns how many.
// Requests that old are refused anyway (outside the window).
func (l *Ledger) PruneReplies(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		// Two statements, so that each reads a partial index (schema
		// 30): the replies whose body is kept, and those pruned.
		for _, q := range []string{
			"DELETE FROM request_replies WHERE pruned_at IS NULL AND created_at < ?",
			"DELETE FROM request_replies WHERE pruned_at IS NOT NULL AND created_at < ?",
		} {
			res, err := tx.ExecContext(ctx, q, ms(before))
			if err != nil {
				return err
			}
			d, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += d
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune replies: %w", err)
	}
	if l.replyIdx != nil {
		l.replyIdx.prune(ms(before))
	}
	return n, nil
}
