package ledger

import (
	"context"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

// TestRepliesShareTheLeadersWait: replies that come while the first one
// waits (replyLinger) are committed with it in one transaction, each
// stored and readable, in this process and after a reopen, when its call
// returns; a second answer to a key in the same batch is not stored.
func TestRepliesShareTheLeadersWait(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l, err := OpenForTest(t, ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 5 // the leader's and the others'
	b := &l.replies
	b.linger = func() {
		for {
			b.mu.Lock()
			queued := len(b.pending)
			b.mu.Unlock()
			if queued == n+1 {
				return
			}
			runtime.Gosched()
		}
	}
	type result struct {
		stored bool
		err    error
	}
	results := make([]result, n+1)
	var wg sync.WaitGroup
	for i := range n + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "nostr:" + strconv.Itoa(i%n) // the last is a second answer to key 0
			ok, err := l.RememberReply(ctx, key, []byte(strconv.Itoa(i)))
			results[i] = result{ok, err}
			if err != nil {
				return
			}
			if _, found, err := l.Reply(ctx, key); err != nil || !found {
				t.Errorf("%s not readable when its call returned: %v %v", key, found, err)
			}
		}()
	}
	wg.Wait()
	if b.commits != 1 {
		t.Fatalf("%d commits for %d replies that came during the wait, want 1", b.commits, n+1)
	}
	stored := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("reply %d: %v", i, r.err)
		}
		if r.stored {
			stored++
		}
	}
	if stored != n {
		t.Fatalf("%d replies stored, want %d (one key answered twice)", stored, n)
	}
	l.Close()
	l, err = OpenForTest(t, ctx, path, Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range n {
		key := "nostr:" + strconv.Itoa(i)
		got, found, err := l.Reply(ctx, key)
		if err != nil || !found || (i != 0 && string(got) != strconv.Itoa(i)) {
			t.Fatalf("after reopen %s: %q %v %v", key, got, found, err)
		}
	}
}
