package ctxvm

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// TestOutboxOrder: an answer with nothing queued before it is published
// by the answering goroutine, before answer returns, and what comes
// after it is dropped; an answer after notifications goes after them, in
// order, published by the time close returns; elicitation requests of
// ours after the answer are refused.
func TestOutboxOrder(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	newReq := func(s *Server) *request {
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}},
			Content: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free"}}`}
		ev.Sign(sk)
		r, err := s.parse(ev)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	methods := func(evs []nostr.Event) string {
		var got []string
		for _, ev := range evs {
			var m message
			if err := json.Unmarshal([]byte(ev.Content), &m); err != nil {
				t.Fatal(err)
			}
			if m.Method == "" {
				m.Method = "answer"
			}
			got = append(got, m.Method)
		}
		return strings.Join(got, " ")
	}

	t.Run("inline", func(t *testing.T) {
		s, out := recorder(t, nil)
		o := s.newOutbox(context.Background(), newReq(s))
		o.answer(json.RawMessage(`{"content":[]}`), nil, nil, false)
		if got := methods(*out); got != "answer" {
			t.Fatalf("published by the time answer returned: %q", got)
		}
		if o.ch != nil {
			t.Fatal("an answer alone started the outbox goroutine")
		}
		o.notify("notifications/progress", map[string]any{"progress": 1})
		if o.request("e1", methodElicit, json.RawMessage(`{}`), make(chan error, 1)) {
			t.Fatal("a request of ours queued after the answer")
		}
		o.close()
		if got := methods(*out); got != "answer" {
			t.Fatalf("published: %q, want the answer alone", got)
		}
	})
	t.Run("queued", func(t *testing.T) {
		s, out := recorder(t, nil)
		o := s.newOutbox(context.Background(), newReq(s))
		o.notify("notifications/progress", map[string]any{"progress": 1})
		o.notify("notifications/progress", map[string]any{"progress": 2})
		o.answer(json.RawMessage(`{"content":[]}`), nil, nil, false)
		o.close()
		if got := methods(*out); got != "notifications/progress notifications/progress answer" {
			t.Fatalf("published: %q", got)
		}
	})
}

// orderedReplies is a ReplyStore that records whether the answer was
// published when a reply was remembered.
type orderedReplies struct {
	memReplies
	published func() int
	mu        sync.Mutex
	seen      []int // answers published at each RememberReply
}

func (o *orderedReplies) RememberReply(ctx context.Context, key string, reply []byte) (bool, error) {
	o.mu.Lock()
	o.seen = append(o.seen, o.published())
	o.mu.Unlock()
	return o.memReplies.RememberReply(ctx, key, reply)
}

// TestAnswerDoesNotWaitForTheReplyStore: a free call's answer goes out
// before its reply is stored (the client does not wait for the ledger),
// and handle returns only once it is stored (a replay then finds it).
func TestAnswerDoesNotWaitForTheReplyStore(t *testing.T) {
	store := &orderedReplies{memReplies: memReplies{m: map[string][]byte{}}}
	s, out := recorder(t, func(c *Config) { c.Replies = store })
	var mu sync.Mutex
	inner := s.publish
	s.publish = func(ctx context.Context, ev nostr.Event) error {
		mu.Lock()
		defer mu.Unlock()
		return inner(ctx, ev)
	}
	store.published = func() int { mu.Lock(); defer mu.Unlock(); return len(*out) }
	ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}},
		Content: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free","arguments":{"text":"x"}}}`}
	ev.Sign(nostr.GeneratePrivateKey())
	s.handle(context.Background(), ev)
	if len(store.seen) != 1 || store.seen[0] != 1 {
		t.Fatalf("answers published when the reply was stored: %v, want [1]", store.seen)
	}
	if _, ok, _ := store.Reply(context.Background(), replyKey(&request{ev: ev})); !ok {
		t.Fatal("handle returned before the reply was stored")
	}
}
