package ctxvm

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

// TestAnswerReachesEveryRelay: an answer is published on every relay: a
// relay slower than the first to acknowledge still gets it (publishPool
// returns at the first OK and leaves the rest running).
func TestAnswerReachesEveryRelay(t *testing.T) {
	fast := startRelay(t)
	slowRelay := newRelay(t)
	slowRelay.RejectEvent = append(slowRelay.RejectEvent, func(ctx context.Context, ev *nostr.Event) (bool, string) {
		if ev.Kind == KindMessage && ev.Tags.Find("e") != nil {
			time.Sleep(time.Second) // slower than the fast relay's OK
		}
		return false, ""
	})
	srv := httptest.NewServer(slowRelay)
	t.Cleanup(srv.Close)
	slow := "ws" + strings.TrimPrefix(srv.URL, "http")

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
