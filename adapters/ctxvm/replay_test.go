package ctxvm

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// memReplies is an in-memory ReplyStore (the ledger's is tested in
// package ledger).
type memReplies struct {
	mu     sync.Mutex
	m      map[string][]byte
	pruned map[string]bool // answered, its answer pruned after the retention period
}

func (m *memReplies) Reply(_ context.Context, key string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pruned[key] {
		return nil, false, fmt.Errorf("reply %s: %w", key, vend.ErrResultExpired)
	}
	r, ok := m.m[key]
	return r, ok, nil
}

func (m *memReplies) RememberReply(_ context.Context, key string, reply []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[key]; ok {
		return false, nil
	}
	m.m[key] = append([]byte(nil), reply...)
	return true, nil
}

// TestReplaysAnsweredFromStore: a free call delivered again, also to a
// new server (a restart) with the same store, runs once and every copy
// gets the same answer; an error is not kept, so its replay is evaluated
// again.
func TestReplaysAnsweredFromStore(t *testing.T) {
	store := &memReplies{m: map[string][]byte{}}
	v := &fakeVendor{}
	withStore := func(c *Config) { c.Vendor, c.Replies = v, store }
	s, out := recorder(t, withStore)
	sk := nostr.GeneratePrivateKey()
	req := func(content string) *nostr.Event {
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: content, Tags: nostr.Tags{{"p", s.PublicKey()}}}
		ev.Sign(sk)
		return ev
	}
	call := req(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"free","arguments":{"text":"once"}}}`)
	ctx := context.Background()
	s.handle(ctx, call)
	s.handle(ctx, call)
	s2, out2 := recorder(t, func(c *Config) { withStore(c); c.SecretKey = s.cfg.SecretKey })
	s2.handle(ctx, call)

	v.mu.Lock()
	ran := len(v.calls)
	v.mu.Unlock()
	if ran != 1 {
		t.Fatalf("the free call ran %d times, want 1", ran)
	}
	answers := append(append([]nostr.Event(nil), *out...), *out2...)
	if len(answers) != 3 {
		t.Fatalf("%d answers, want 3", len(answers))
	}
	for _, a := range answers {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal([]byte(a.Content), &m); err != nil {
			t.Fatal(err)
		}
		if string(m.ID) != "7" || string(m.Result) != `{"content":[{"type":"text","text":"free:once"}]}` ||
			a.Tags.FindWithValue("e", call.ID) == nil {
			t.Fatalf("answer %s %v", a.Content, a.Tags)
		}
	}

	// An error answer is not kept: the replay reaches the Vendor again
	// (which finds a priced call by its RequestID).
	gated := req(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"gated"}}`)
	s.handle(ctx, gated)
	s.handle(ctx, gated)
	v.mu.Lock()
	ran = len(v.calls)
	v.mu.Unlock()
	if ran != 3 {
		t.Fatalf("vendor saw %d calls, want 3 (the gated call evaluated twice)", ran)
	}
	if _, ok, _ := store.Reply(ctx, replyKey(&request{ev: gated})); ok {
		t.Fatal("an error answer was stored")
	}
	// Lists are not stored.
	s.handle(ctx, req(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	if len(store.m) != 1 {
		t.Fatalf("store holds %d answers, want 1", len(store.m))
	}
}

// TestReplayOfAPrunedAnswerIsAnError: a request delivered again after its
// stored answer was pruned (ledger.results_retention) gets the JSON-RPC
// error saying so, and does not reach the Vendor: nothing runs again.
func TestReplayOfAPrunedAnswerIsAnError(t *testing.T) {
	store := &memReplies{m: map[string][]byte{}, pruned: map[string]bool{}}
	v := &fakeVendor{}
	s, out := recorder(t, func(c *Config) { c.Vendor, c.Replies = v, store })
	call := signedRequest(s, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"free","arguments":{"text":"once"}}}`)
	store.pruned[replyKey(&request{ev: call})] = true
	s.handle(context.Background(), call)
	v.mu.Lock()
	ran := len(v.calls)
	v.mu.Unlock()
	if ran != 0 {
		t.Fatalf("the request whose answer was pruned ran %d times", ran)
	}
	if len(*out) != 1 {
		t.Fatalf("%d answers, want 1", len(*out))
	}
	var m struct {
		ID    json.RawMessage `json:"id"`
		Error rpcerr.Error    `json:"error"`
	}
	if err := json.Unmarshal([]byte((*out)[0].Content), &m); err != nil {
		t.Fatal(err)
	}
	if string(m.ID) != "7" || m.Error.Code != rpcerr.CodeResultExpired || m.Error.Message != rpcerr.FromVend(vend.ErrResultExpired, "").Message {
		t.Fatalf("answer %s", (*out)[0].Content)
	}
}

// TestDuplicateInFlightServedOnce: a copy of a request arriving while the
// first is still being served is dropped; the first answers.
func TestDuplicateInFlightServedOnce(t *testing.T) {
	v := &fakeVendor{block: make(chan struct{})}
	s, out := recorder(t, func(c *Config) { c.Vendor = v })
	ev := signedRequest(s, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"block"}}`)
	done := make(chan struct{})
	go func() { s.handle(context.Background(), ev); close(done) }()
	for {
		v.mu.Lock()
		n := len(v.calls)
		v.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s.handle(context.Background(), ev) // returns at once: dropped
	close(v.block)
	<-done
	if v.mu.Lock(); len(v.calls) != 1 {
		t.Fatalf("%d calls", len(v.calls))
	}
	v.mu.Unlock()
	if len(*out) != 1 {
		t.Fatalf("%d answers, want 1", len(*out))
	}
}

// TestRepliesStoredByTimeThenID: an answer is stored under the request's
// created_at, then its id; one stored by an earlier build under the id
// alone still answers a replay for two windows after Run starts (the
// longest it is wanted), and the call does not run again.
func TestRepliesStoredByTimeThenID(t *testing.T) {
	store := &memReplies{m: map[string][]byte{}}
	v := &fakeVendor{}
	s, out := recorder(t, func(c *Config) { c.Vendor, c.Replies = v, store })
	ev := signedRequest(s, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"free","arguments":{"text":"once"}}}`)
	if got, want := replyKey(&request{ev: ev}), fmt.Sprintf("nostr@%d:%s", ev.CreatedAt, ev.ID); got != want {
		t.Fatalf("replyKey %s, want %s", got, want)
	}
	if got, want := replyKey(&request{ev: &nostr.Event{CreatedAt: 42, ID: "ab"}}), "nostr@0000000042:ab"; got != want {
		t.Fatalf("replyKey %s, want %s", got, want)
	}
	legacy := `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"stored by an earlier build"}]}}`
	store.m["nostr:"+ev.ID] = []byte(legacy)

	s.legacyUntil = time.Now().Add(time.Minute) // Run started less than two windows ago
	s.handle(context.Background(), ev)
	if len(v.calls) != 0 || len(*out) != 1 || !strings.Contains((*out)[0].Content, "stored by an earlier build") {
		t.Fatalf("within two windows of the start: %d runs, answers %v", len(v.calls), *out)
	}

	s.legacyUntil = time.Now().Add(-time.Second) // later: only the new key is read
	s.handle(context.Background(), ev)
	if len(v.calls) != 1 {
		t.Fatalf("after two windows: %d runs, want 1", len(v.calls))
	}
	if _, ok := store.m[replyKey(&request{ev: ev})]; !ok {
		t.Fatal("the answer is not stored under its time and id")
	}
}

// slowReplies holds RememberReply until release is closed.
type slowReplies struct {
	memReplies
	storing chan struct{} // closed when RememberReply is called
	release chan struct{}
}

func (s *slowReplies) RememberReply(ctx context.Context, key string, reply []byte) (bool, error) {
	close(s.storing)
	<-s.release
	return s.memReplies.RememberReply(ctx, key, reply)
}

// TestCopyAnsweredWhileItsAnswerIsStored: a copy of a request that comes
// after the answer went out but before it is stored (a group commit
// waits for others) gets the same answer, and nothing runs again.
func TestCopyAnsweredWhileItsAnswerIsStored(t *testing.T) {
	store := &slowReplies{memReplies: memReplies{m: map[string][]byte{}}, storing: make(chan struct{}), release: make(chan struct{})}
	v := &fakeVendor{}
	s, out := recorder(t, func(c *Config) { c.Vendor, c.Replies = v, store })
	call := signedRequest(s, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"free","arguments":{"text":"once"}}}`)
	first := make(chan struct{})
	go func() { defer close(first); s.handle(context.Background(), call) }()
	<-store.storing
	s.handle(context.Background(), call) // the copy
	close(store.release)
	<-first
	v.mu.Lock()
	ran := len(v.calls)
	v.mu.Unlock()
	if ran != 1 {
		t.Fatalf("ran %d times, want 1", ran)
	}
	if len(*out) != 2 || (*out)[0].Content != (*out)[1].Content {
		t.Fatalf("answers %v, want the same answer twice", *out)
	}
}

// signedRequest is a request with content to s, signed by a fresh client
// key.
func signedRequest(s *Server, content string) *nostr.Event {
	ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}}, Content: content}
	ev.Sign(nostr.GeneratePrivateKey())
	return ev
}
