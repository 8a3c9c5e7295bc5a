package ledger_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
)

func TestRepliesStoredOnceAndSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	if _, ok, err := l.Reply(ctx, "nostr:ev1"); err != nil || ok {
		t.Fatalf("unknown key: ok %v, err %v", ok, err)
	}
	// Ten concurrent answers to one request: exactly one is kept.
	var stored atomic.Int32
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := l.RememberReply(ctx, "nostr:ev1", []byte(`{"n":`+string(rune('0'+i))+`}`))
			if err != nil {
				t.Error(err)
			}
			if ok {
				stored.Add(1)
			}
		}()
	}
	wg.Wait()
	if stored.Load() != 1 {
		t.Fatalf("%d replies stored for one key, want 1", stored.Load())
	}
	first, ok, err := l.Reply(ctx, "nostr:ev1")
	if err != nil || !ok || !strings.HasPrefix(string(first), `{"n":`) {
		t.Fatalf("reply: %q %v %v", first, ok, err)
	}
	l.Close()
	l = openLedger(t, path)
	again, ok, err := l.Reply(ctx, "nostr:ev1")
	if err != nil || !ok || string(again) != string(first) {
		t.Fatalf("after reopen: %q %v %v, want %q", again, ok, err, first)
	}
	if ok, err := l.RememberReply(ctx, "nostr:big", make([]byte, ledger.MaxReplyBytes+1)); ok || err != nil {
		t.Fatalf("oversized reply: stored %v, err %v", ok, err)
	}
	if _, err := l.RememberReply(ctx, "", []byte("{}")); err == nil {
		t.Fatal("empty key accepted")
	}
}

func TestPruneReplies(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "") // its clock ticks one second per transaction
	remember := func(keys ...string) {
		for _, k := range keys {
			if _, err := l.RememberReply(ctx, k, []byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
	}
	remember("a", "b")
	// Their bodies pruned after the retention period: the rows stay,
	// and go too (schema 30 reaches them by another index).
	if _, err := l.PruneBatch(ctx, time.Now().Add(24*time.Hour*365*10)); err != nil {
		t.Fatal(err)
	}
	remember("c")
	_, _, _ = l.Reply(ctx, "a")
	// Everything stored before a time far in the future goes.
	n, err := l.PruneReplies(ctx, time.Now().Add(24*time.Hour*365*10))
	if err != nil || n != 3 {
		t.Fatalf("pruned %d, %v; want 3", n, err)
	}
	if _, ok, _ := l.Reply(ctx, "b"); ok {
		t.Fatal("a pruned reply is still there")
	}
	if n, err := l.PruneReplies(ctx, time.Unix(0, 0)); err != nil || n != 0 {
		t.Fatalf("pruning nothing: %d, %v", n, err)
	}
}

// TestRepliesGroupCommit: many concurrent replies (sharing transactions)
// are each stored and each readable when their call returns.
func TestRepliesGroupCommit(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "k" + strconv.Itoa(i)
			ok, err := l.RememberReply(ctx, key, []byte(strconv.Itoa(i)))
			if err != nil || !ok {
				t.Errorf("%s: stored %v, err %v", key, ok, err)
				return
			}
			got, found, err := l.Reply(ctx, key)
			if err != nil || !found || string(got) != strconv.Itoa(i) {
				t.Errorf("%s: read back %q %v %v", key, got, found, err)
			}
		}()
	}
	wg.Wait()
}
