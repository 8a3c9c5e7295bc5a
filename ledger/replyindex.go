package ledger

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
)

// maxIndexedReplies bounds the reply index (about 30 bytes each): at
// capvend's most, 2,300 free calls a second, two windows of 5 minutes
// hold 1.4 million replies.
const maxIndexedReplies = 1 << 21

// replyIndex knows, in memory, which request keys may have a stored
// reply, so that looking up a request seen for the first time (nearly
// every request) reads no row: that query was 5 % of capvend's CPU per
// free Nostr call. It holds a hash of each key stored (its rows loaded
// when the ledger opened, and every reply stored since) with its
// created_at, and forgets them as PruneReplies deletes their rows. A
// hash it holds means "maybe": Reply reads the row, so a collision only
// costs a query; a hash it lacks means no row, which holds only while
// no one else stores replies (Options.SoleReplyWriter). Past
// maxIndexedReplies it stops adding and says "maybe" for every key
// until PruneReplies has deleted every row it left out.
type replyIndex struct {
	seed  maphash.Seed
	limit int // maxIndexedReplies; smaller in tests
	mu    sync.Mutex
	at    map[uint64]int64 // key hash → newest created_at (unix ms)
	// overflow: the created_at of the newest row left out, 0 when none.
	overflow int64
}

func newReplyIndex() *replyIndex {
	return &replyIndex{seed: maphash.MakeSeed(), limit: maxIndexedReplies, at: make(map[uint64]int64)}
}

func (x *replyIndex) hash(key string) uint64 { return maphash.String(x.seed, key) }

// mayHave reports whether key may have a stored reply.
func (x *replyIndex) mayHave(key string) bool {
	h := x.hash(key)
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.overflow != 0 {
		return true
	}
	_, ok := x.at[h]
	return ok
}

// add notes that key's reply is stored at createdMS (before the row is
// committed: until then a lookup reads the row and finds none).
func (x *replyIndex) add(key string, createdMS int64) {
	h := x.hash(key)
	x.mu.Lock()
	defer x.mu.Unlock()
	if t, ok := x.at[h]; ok {
		x.at[h] = max(t, createdMS)
		return
	}
	if len(x.at) >= x.limit {
		x.overflow = max(x.overflow, createdMS)
		return
	}
	x.at[h] = createdMS
}

// prune forgets the keys stored before beforeMS, whose rows
// PruneReplies deleted.
func (x *replyIndex) prune(beforeMS int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for h, t := range x.at {
		if t < beforeMS {
			delete(x.at, h)
		}
	}
	if x.overflow != 0 && x.overflow < beforeMS {
		x.overflow = 0
	}
}

// loadReplyIndex indexes the replies stored before the ledger opened.
func (l *Ledger) loadReplyIndex(ctx context.Context) error {
	x := newReplyIndex()
	rows, err := l.rdb.QueryContext(ctx, "SELECT request_key, created_at FROM request_replies")
	if err != nil {
		return fmt.Errorf("ledger %s: index stored replies: %w", l.path, l.fileError(err))
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var created int64
		if err := rows.Scan(&key, &created); err != nil {
			return fmt.Errorf("ledger %s: index stored replies: %w", l.path, l.fileError(err))
		}
		x.add(key, created)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ledger %s: index stored replies: %w", l.path, l.fileError(err))
	}
	l.replyIdx = x
	return nil
}
