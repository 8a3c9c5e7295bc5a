package ctxvm

import (
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/testkit"
)

// A request published while the server's connection to its relay is down
// is answered once the connection is back: the server subscribes again
// from the newest event it saw there (less a margin), not from then.
// What it had served before the outage comes again from the relay and is
// not served twice (laneSeen, which would drop it within a minute, is
// off here: the subscription's own note of what it saw drops it).
func TestRequestDuringRelayOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the server to connect again (5 s)")
	}
	// Parallel: it waits seconds for the server to connect again, on a
	// relay and server of its own.
	t.Parallel()
	g := testkit.NewGatedRelay(t)
	s := startServer(t, g.Gated, &fakeVendor{}, func(c *Config) { c.SeenFor = time.Nanosecond })
	c := newClient(t, g.Open, s.PublicKey())
	job := func(name string) *nostr.Event { // a stored kind: relays keep it for a later subscription
		ev := &nostr.Event{Kind: KindJobRequest, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}, {"c", "list-tools"}, {"t", name}}}
		if err := c.c.Sign(ev); err != nil {
			t.Fatal(err)
		}
		c.publish(ev)
		return ev
	}
	answered := func(req *nostr.Event) {
		t.Helper()
		ev, _ := c.next()
		if ev.Kind != KindJobResult || ev.Tags.FindWithValue("e", req.ID) == nil {
			t.Fatalf("kind %d %v, want the answer to %s", ev.Kind, ev.Tags, req.ID)
		}
	}
	before := job("before")
	answered(before)

	g.Cut()
	for i := 0; s.RelayStates()[0].Subscribed; i++ {
		if i > 3000 { // a deadlock guard: 30 s
			t.Fatal("the server never saw its connection close")
		}
		time.Sleep(10 * time.Millisecond)
	}
	during := job("during")
	g.Restore()
	answered(during)

	ping := c.send(`{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	for {
		ev, _ := c.next()
		if ev.Tags.FindWithValue("e", before.ID) != nil {
			t.Fatal("the request served before the outage was served again")
		}
		if ev.Tags.FindWithValue("e", ping.ID) != nil {
			break
		}
	}
	if st := s.RelayStates()[0]; !st.Subscribed || st.Err != "" {
		t.Fatalf("relay state %+v", st)
	}
}

// The subscription starts again resumeMargin before the newest event it
// saw, never more than resumeMax or the window back, and drops a stored
// event it saw already, but not the same event sent again live.
func TestResumeSince(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var r resume
	if got, want := r.since(now, time.Hour), nostr.Timestamp(now.Add(-resumeMax).Unix()); got != want {
		t.Fatalf("nothing seen: since %d, want %d", got, want)
	}
	if got, want := r.since(now, time.Minute), nostr.Timestamp(now.Add(-time.Minute).Unix()); got != want {
		t.Fatalf("nothing seen, 1 min window: since %d, want %d", got, want)
	}
	ev := &nostr.Event{ID: "a", CreatedAt: nostr.Timestamp(now.Add(-10 * time.Second).Unix())}
	if r.note(ev, false, now.Add(-9*time.Second)) {
		t.Fatal("a new event dropped")
	}
	if got, want := r.since(now, time.Hour), ev.CreatedAt-nostr.Timestamp(resumeMargin/time.Second); got != want {
		t.Fatalf("since %d, want %d", got, want)
	}
	if !r.note(ev, true, now) {
		t.Fatal("a stored event seen before was not dropped")
	}
	if r.note(ev, false, now) {
		t.Fatal("an event sent again live was dropped")
	}
	future := &nostr.Event{ID: "b", CreatedAt: nostr.Timestamp(now.Add(time.Hour).Unix())}
	r.note(future, false, now)
	if _, ok := r.ids["b"]; ok {
		t.Fatal("an id dated an hour ahead kept")
	}
	if got, want := r.since(now, time.Hour), nostr.Timestamp(now.Add(-resumeMargin).Unix()); got != want {
		t.Fatalf("an event dated in the future moved since to %d, want %d", got, want)
	}
	r.eose(now.Add(time.Minute))
	if _, ok := r.ids["a"]; ok {
		t.Fatal("an id dated before the margin kept")
	}
}

// Settled waits for every relay's main subscription to end its stored
// events or fail; RelayStates says which relay is subscribed, and why
// another is not.
func TestRelayStates(t *testing.T) {
	good := testkit.Relay(t)
	addr, stopDead := testkit.StoppableRelay(t, "127.0.0.1:0")
	stopDead() // nothing listens there any more
	dead := "ws://" + addr
	s, err := New(Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{good, dead}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Settled():
		t.Fatal("settled before Run")
	default:
	}
	runServer(t, s)
	select {
	case <-s.Settled():
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatal("never settled")
	}
	<-s.Up()
	st := s.RelayStates()
	if len(st) != 2 || st[0].URL != good || !st[0].Subscribed || st[0].Err != "" {
		t.Fatalf("the good relay: %+v", st)
	}
	if st[1].URL != dead || st[1].Subscribed || st[1].Err == "" {
		t.Fatalf("the dead relay: %+v", st)
	}
}

// BenchmarkResumeNote: what the main subscription's note of each event
// (resume.note) costs per event, under a flood of fresh events.
func BenchmarkResumeNote(b *testing.B) {
	var r resume
	now := time.Unix(1_800_000_000, 0)
	evs := make([]nostr.Event, 1<<16)
	for i := range evs {
		evs[i] = nostr.Event{ID: fmt.Sprintf("%064x", i), CreatedAt: nostr.Timestamp(now.Unix())}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// A flood of 1,000 events a second, dated as they come.
		at := now.Add(time.Duration(i) * time.Millisecond)
		ev := &evs[i%len(evs)]
		ev.CreatedAt = nostr.Timestamp(at.Unix())
		r.note(ev, false, at)
	}
}
