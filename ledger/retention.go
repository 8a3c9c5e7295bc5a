package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Result retention (schema 24). A stored answer (a call's result, a Nostr
// request's reply) stored before the retention period is pruned: its body
// is replaced by its record, the body's SHA-256, size and error flag, with
// the time it was pruned. The schema allows that one change and checks
// the hash against the body it replaces. A replay of a pruned answer gets
// vend.ErrResultExpired (Result, Reply). Money is never pruned.

// DefaultResultsRetention is how long stored answers are kept whole when
// the configuration does not say: 30 days. A client retries a paid call's
// request for its answer within seconds or hours (a lost connection, a
// restarted host); a month also covers a refund claimed or a result
// disputed within a billing cycle, while it bounds the ledger to a month
// of answers instead of growing with every paid call forever.
const DefaultResultsRetention = 30 * 24 * time.Hour

// Bounds of one prune batch: one write transaction holds the ledger's
// writer while it hashes and frees the bodies (twice: the trigger checks
// the hash), so a batch is kept to a few milliseconds of the hot path's
// time, and Prune pauses between batches.
const (
	pruneBatchRows  = 256
	pruneBatchBytes = 4 << 20
	// PrunePause is Prune's default pause between batches.
	PrunePause = 50 * time.Millisecond
)

// PruneStats counts what a prune replaced by its record.
type PruneStats struct {
	Results int64 // stored results of calls
	Replies int64 // stored replies to Nostr requests
	Bytes   int64 // body bytes released (the file reuses its pages)
}

func (s *PruneStats) add(o PruneStats) {
	s.Results += o.Results
	s.Replies += o.Replies
	s.Bytes += o.Bytes
}

// Zero reports whether nothing was pruned.
func (s PruneStats) Zero() bool { return s.Results == 0 && s.Replies == 0 }

// PruneBatch prunes one bounded batch of the stored answers (results,
// then replies) stored before before and not pruned yet: at most 256 rows
// or 4 MiB of bodies (at least one row), in one write transaction. It
// returns what it pruned: zero when nothing that old is left whole.
// Atomic; idempotent (a pruned answer is not pruned again). Money records
// are never touched.
func (l *Ledger) PruneBatch(ctx context.Context, before time.Time) (PruneStats, error) {
	// Most runs find nothing: a read says so without taking the writer.
	var due bool
	if err := l.reader(ctx).QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM results WHERE pruned_at IS NULL AND stored_at < ?)
		OR EXISTS (SELECT 1 FROM request_replies WHERE pruned_at IS NULL AND created_at < ?)`, ms(before), ms(before)).Scan(&due); err != nil {
		return PruneStats{}, fmt.Errorf("prune stored answers: %w", l.fileError(err))
	}
	if !due {
		return PruneStats{}, nil
	}
	var st PruneStats
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		st = PruneStats{}
		if err := pruneResults(ctx, tx, before, now, &st); err != nil {
			return err
		}
		if st.Bytes >= pruneBatchBytes || st.Results >= pruneBatchRows {
			return nil
		}
		return pruneReplies(ctx, tx, before, now, &st)
	})
	if err != nil {
		return PruneStats{}, fmt.Errorf("prune stored answers: %w", err)
	}
	return st, nil
}

// Prune runs PruneBatch until nothing stored before before is left whole,
// pausing pause (0: PrunePause) between batches so that the calls being
// served get the ledger's writer in between. It returns what it pruned,
// with ctx's error if ctx ended first.
func (l *Ledger) Prune(ctx context.Context, before time.Time, pause time.Duration) (PruneStats, error) {
	if pause <= 0 {
		pause = PrunePause
	}
	var total PruneStats
	for {
		st, err := l.PruneBatch(ctx, before)
		total.add(st)
		if err != nil || st.Zero() {
			return total, err
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// pruneResults replaces the bodies of the oldest results stored before
// before by their record, within the batch's bounds. The hash is computed
// by the database from the body it replaces (SET expressions read the
// old row); the trigger results_immutable recomputes it.
func pruneResults(ctx context.Context, tx *wtx, before, now time.Time, st *PruneStats) error {
	rows, err := tx.QueryContext(ctx, `SELECT call_id, length(body) FROM results
		WHERE pruned_at IS NULL AND stored_at < ? ORDER BY stored_at, call_id LIMIT ?`, ms(before), pruneBatchRows)
	if err != nil {
		return err
	}
	var ids []int64
	var bytes int64
	for rows.Next() {
		var id, n int64
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return err
		}
		if len(ids) > 0 && bytes+n > pruneBatchBytes {
			break
		}
		ids = append(ids, id)
		bytes += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		res, err := tx.ExecContext(ctx, `UPDATE results SET body = ?, body_sha256 = capvend_sha256(body),
			body_size = length(CAST(body AS BLOB)), pruned_at = ? WHERE call_id = ? AND pruned_at IS NULL`,
			[]byte{}, ms(now), id)
		if err != nil {
			return fmt.Errorf("result of call %d: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		st.Results += n
	}
	st.Bytes += bytes
	return nil
}

// pruneReplies replaces the oldest stored replies stored before before by
// their record, within what is left of the batch's bounds. A reply's error
// flag is read from its body here (an MCP result with "isError": true);
// the trigger request_replies_prune_only checks the hash and size.
func pruneReplies(ctx context.Context, tx *wtx, before, now time.Time, st *PruneStats) error {
	rows, err := tx.QueryContext(ctx, `SELECT request_key, length(reply) FROM request_replies
		WHERE pruned_at IS NULL AND created_at < ? ORDER BY created_at, request_key LIMIT ?`,
		ms(before), pruneBatchRows-st.Results)
	if err != nil {
		return err
	}
	var keys []string
	bytes := st.Bytes
	for rows.Next() {
		var key string
		var n int64
		if err := rows.Scan(&key, &n); err != nil {
			rows.Close()
			return err
		}
		if (st.Results > 0 || len(keys) > 0) && bytes+n > pruneBatchBytes {
			break
		}
		keys = append(keys, key)
		bytes += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, key := range keys {
		var reply []byte
		if err := tx.QueryRowContext(ctx, "SELECT reply FROM request_replies WHERE request_key = ?", key).Scan(&reply); err != nil {
			return fmt.Errorf("reply %s: %w", key, err)
		}
		res, err := tx.ExecContext(ctx, `UPDATE request_replies SET reply = ?, reply_sha256 = ?, reply_size = ?,
			is_error = ?, pruned_at = ? WHERE request_key = ? AND pruned_at IS NULL`,
			[]byte{}, sha256Hex(reply), len(reply), replyIsError(reply), ms(now), key)
		if err != nil {
			return fmt.Errorf("reply %s: %w", key, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		st.Replies += n
		st.Bytes += int64(len(reply))
	}
	return nil
}

// replyIsError reads a stored reply's error flag: an MCP result (a JSON
// object) whose isError is true. Anything else is not an error.
func replyIsError(reply []byte) bool {
	var m struct {
		IsError bool `json:"isError"`
	}
	return json.Unmarshal(reply, &m) == nil && m.IsError
}
