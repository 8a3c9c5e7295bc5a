package ctxvm

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
	"github.com/capvend/capvend/internal/testkit"
)

// TestAnswerReachesEveryRelay: an answer is published on every relay: a
// relay slower than the first to acknowledge still gets it (publishPool
// returns at the first OK and leaves the rest running).
func TestAnswerReachesEveryRelay(t *testing.T) {
	fast := testkit.Relay(t)
	slowRelay := testkit.NewRelay()
	slowRelay.RejectEvent = append(slowRelay.RejectEvent, func(ctx context.Context, ev *nostr.Event) (bool, string) {
		if ev.Kind == KindMessage && ev.Tags.Find("e") != nil {
			time.Sleep(time.Second) // slower than the fast relay's OK
		}
		return false, ""
	})
	slow := testkit.ServeRelay(t, slowRelay)

	s := startServer(t, fast, &fakeVendor{}, func(c *Config) { c.Relays = []string{fast, slow} })
	// Kind 25910 is ephemeral: relays pass it on, never store it, so
	// listen on the slow relay before asking.
	r, err := nostr.RelayConnect(context.Background(), slow)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	since := nostr.Now()
	sub, err := r.Subscribe(context.Background(), nostr.Filters{{Authors: []string{s.PublicKey()}, Kinds: []int{KindMessage}, Since: &since}})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, fast, s.PublicKey())
	req := c.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	if _, ev := c.expect(req); ev == nil {
		t.Fatal("no answer on the fast relay")
	}
	// A bound on waiting (a deadlock guard), not a speed check.
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-sub.Events:
			if ev.Tags.FindWithValue("e", req.ID) != nil {
				return
			}
		case <-timeout:
			t.Fatal("the slow relay never got the answer")
		}
	}
}

// TestFirstAnswerHeld: the first event to a client never answered waits
// FirstAnswerDelay (its subscription may not be in place at the relay
// yet); later answers to it do not, and another new client waits again.
func TestFirstAnswerHeld(t *testing.T) {
	s, out := recorder(t, func(c *Config) { c.FirstAnswerDelay = 200 * time.Millisecond })
	var slept []time.Duration
	s.sleep = func(_ context.Context, d time.Duration) { slept = append(slept, d) }
	ping := func(sk string, id int) {
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}},
			Content: `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"ping"}`}
		ev.Sign(sk)
		s.handle(context.Background(), ev)
	}
	a, b := nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()
	ping(a, 1)
	ping(a, 2)
	ping(b, 3)
	if len(*out) != 3 {
		t.Fatalf("%d answers, want 3", len(*out))
	}
	if len(slept) != 2 || slept[0] != 200*time.Millisecond || slept[1] != 200*time.Millisecond {
		t.Fatalf("held %v, want two holds of 200ms (one per new client)", slept)
	}
}

// TestEventSizeBound: eventSize is the encoded size whenever it matters
// (a relay's limit, or DefaultThreshold, within reach of its bound), and
// otherwise a bound at or above it.
func TestEventSizeBound(t *testing.T) {
	s := &Server{}
	s.info.learn("ws://small", 700) // as if it closed the connection on a larger event
	sk := nostr.GeneratePrivateKey()
	for _, content := range []string{"", "plain", strings.Repeat("\x01\"\\<>&é", 900), strings.Repeat("x", 40_000)} {
		ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: content, Tags: nostr.Tags{{"p", strings.Repeat("a", 64)}, {"e", "\x02\n"}}}
		ev.Sign(sk)
		env, _ := nostr.EventEnvelope{Event: ev}.MarshalJSON()
		got := s.eventSize(&ev, []string{"ws://unknown"})
		if got.Content != len(content) || got.Message < len(env) {
			t.Fatalf("content of %d bytes: size %+v, encoded %d", len(content), got, len(env))
		}
		if got.Message > oversized.DefaultThreshold && got.Message != len(env) {
			t.Fatalf("content of %d bytes: over DefaultThreshold, size %d not the encoded %d", len(content), got.Message, len(env))
		}
		if small := s.eventSize(&ev, []string{"ws://unknown", "ws://small"}); small.Message != len(env) {
			t.Fatalf("content of %d bytes, a relay's limit within reach: size %d not the encoded %d", len(content), small.Message, len(env))
		}
	}
}
