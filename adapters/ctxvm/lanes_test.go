package ctxvm

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip13"

	"github.com/capvend/capvend/internal/testkit"
)

// A known payer's request comes by the payers lane: with the main
// subscription holding every event back (as a flood's queue does), the
// customer who paid is served, also one who paid after the server
// started, and each request is answered once when both deliver it.
func TestKnownPayerComesByItsLane(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{payers: map[string]bool{}}
	customer := newClient(t, relay, "")
	later := newClient(t, relay, "")
	v.payers[customer.pk] = true
	s := startServer(t, relay, v, func(c *Config) {
		c.slowMain = func(ev *nostr.Event) bool { return ev.PubKey == customer.pk || ev.PubKey == later.pk }
	})
	customer.server, later.server = s.PublicKey(), s.PublicKey()

	servedByLane(t, customer)

	// One who pays now is followed once the lane looks again (every
	// laneRefresh); until then its requests wait in the (held) main queue.
	v.mu.Lock()
	v.payers[later.pk] = true
	v.mu.Unlock()
	servedByLane(t, later)
}

// servedByLane pings until an answer comes: a lane subscribes
// asynchronously, and what was sent before it did is not delivered.
func servedByLane(t *testing.T, c *client) {
	t.Helper()
	sent := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; time.Now().Before(deadline); i++ {
		ping := c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, i))
		sent[ping.ID] = true
		select {
		case ev := <-c.events:
			if e := ev.Tags.Find("e"); e == nil || !sent[e[1]] {
				t.Fatalf("an answer to another request: %v", ev.Tags)
			}
			return
		case <-time.After(2 * laneRefresh):
		}
	}
	t.Fatal("no request came by the lane")
}

// An event delivered by a lane and by the main subscription is served
// once.
func TestLaneAndMainServeOnce(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{payers: map[string]bool{}}
	customer := newClient(t, relay, "")
	v.payers[customer.pk] = true
	s := startServer(t, relay, v, nil)
	customer.server = s.PublicKey()
	var last *nostr.Event
	for i := range 5 {
		last = customer.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"free","arguments":{"text":"x"}}}`, i))
		customer.expect(last) // fails on a second answer to an earlier one
	}
	// A duplicate would come right after its first answer: give it the
	// time a last request takes, then nothing may be waiting.
	ping := customer.send(`{"jsonrpc":"2.0","id":99,"method":"ping"}`)
	customer.expect(ping)
	v.mu.Lock()
	calls := len(v.calls)
	v.mu.Unlock()
	if calls != 5 {
		t.Fatalf("the vendor got %d calls for 5 requests", calls)
	}
}

// With a proof-of-work difficulty, a request that did the work comes by
// the work lane when the main subscription holds everything back.
func TestWorkComesByItsLane(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{}
	s := startServer(t, relay, v, func(c *Config) {
		c.PowDifficulty = 8
		c.slowMain = func(*nostr.Event) bool { return true }
	})
	c := newClient(t, relay, s.PublicKey())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The work lane subscribes from the second it starts (since), on its
	// own goroutine: a request made before that comes by the main
	// subscription only, which this test holds back. So a request not
	// answered in 5 s is made again, anew; any of them answered passes.
	sent := map[string]bool{}
	for attempt := 1; ; attempt++ {
		ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), PubKey: c.pk,
			Content: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free"}}`, Tags: nostr.Tags{{"p", s.PublicKey()}}}
		tag, err := nip13.DoWork(ctx, ev, 8)
		if err != nil {
			t.Fatal(err)
		}
		ev.Tags = append(ev.Tags, tag)
		if err := ev.Sign(c.sk); err != nil {
			t.Fatal(err)
		}
		sent[ev.ID] = true
		c.publish(&ev)
		select {
		case got := <-c.events:
			if e := got.Tags.Find("e"); got.PubKey != s.PublicKey() || len(e) < 2 || !sent[e[1]] {
				t.Fatalf("not an answer to a request sent: %v", got)
			}
			var r reply
			if err := json.Unmarshal([]byte(got.Content), &r); err != nil || r.Error != nil {
				t.Fatalf("the mined request: %s (%v)", got.Content, err)
			}
			return
		case <-time.After(5 * time.Second):
			if attempt == 6 {
				t.Fatal("no mined request came by the work lane in 30 s")
			}
		}
	}
}

// laneSeen admits an id once within seenFor, again after it, and
// remembers at most maxSeen ids.
func TestLaneSeen(t *testing.T) {
	var l laneSeen
	now := time.Now()
	id := func(i int) string { return fmt.Sprintf("%064x", i) }
	if !l.admit(id(1), now) || l.admit(id(1), now.Add(seenFor-time.Second)) {
		t.Fatal("an id seen within seenFor was let in again")
	}
	if !l.admit(id(1), now.Add(seenFor)) {
		t.Fatal("an id last seen seenFor ago was refused")
	}
	for i := 2; i <= maxSeen+1; i++ {
		l.admit(id(i), now)
	}
	if len(l.at) != maxSeen || len(l.ring) != maxSeen {
		t.Fatalf("%d ids remembered in a ring of %d, want %d", len(l.at), len(l.ring), maxSeen)
	}
	if !l.admit(id(1), now) {
		t.Fatal("the oldest id was not forgotten")
	}
	if first, again := l.admit("not hex", now), l.admit("not hex", now); !first || !again {
		t.Fatal("a malformed id is left to parse")
	}
}

// CloseRelay survives go-nostr's close race, whose loser dereferences a
// nil connection (here a connection without its websocket).
func TestCloseRelayRecoversTheCloseRace(t *testing.T) {
	r := nostr.NewRelay(context.Background(), "ws://127.0.0.1:1")
	r.Connection = &nostr.Connection{}
	CloseRelay(r)
}
