package memstore

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

func event(t *testing.T, sk string, kind int, at nostr.Timestamp, d string) *nostr.Event {
	t.Helper()
	ev := &nostr.Event{Kind: kind, CreatedAt: at, Content: fmt.Sprint(at)}
	if d != "" {
		ev.Tags = nostr.Tags{{"d", d}}
	}
	if err := ev.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return ev
}

func query(t *testing.T, s *Store, f nostr.Filter) []*nostr.Event {
	t.Helper()
	ch, err := s.QueryEvents(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	var out []*nostr.Event
	for ev := range ch {
		out = append(out, ev)
	}
	return out
}

func TestReplaceKeepsTheNewest(t *testing.T) {
	var s Store
	sk := nostr.GeneratePrivateKey()
	ctx := context.Background()
	for _, tc := range []struct {
		kind int
		d    string
	}{{11316, ""}, {31316, "a"}, {31316, "b"}} {
		for _, at := range []nostr.Timestamp{100, 300, 200} { // 200 arrives after 300: not stored
			if err := s.ReplaceEvent(ctx, event(t, sk, tc.kind, at, tc.d)); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := query(t, &s, nostr.Filter{})
	if len(got) != 3 {
		t.Fatalf("%d events, want one per replaceable address", len(got))
	}
	for _, ev := range got {
		if ev.CreatedAt != 300 {
			t.Errorf("kind %d d %q: the one from %d is kept, want 300", ev.Kind, ev.Tags.GetD(), ev.CreatedAt)
		}
	}
}

// Queries while events are replaced and saved see each stored event once
// (slicestore's could see one twice and miss another), and the race
// detector sees no race.
func TestConcurrentQueriesSeeEachEventOnce(t *testing.T) {
	var s Store
	sk := nostr.GeneratePrivateKey()
	ctx := context.Background()
	const kinds = 12
	for k := range kinds {
		if err := s.ReplaceEvent(ctx, event(t, sk, 11300+k, 1, "")); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for at := nostr.Timestamp(2); at < 40; at++ {
			for k := range kinds {
				s.ReplaceEvent(ctx, event(t, sk, 11300+k, at, ""))
			}
			s.SaveEvent(ctx, event(t, sk, 1, at, ""))
		}
	}()
	go func() {
		defer wg.Done()
		for range 200 {
			seen := map[string]bool{}
			got := query(t, &s, nostr.Filter{Kinds: []int{11300, 11301, 11302, 11303, 11304, 11305, 11306, 11307, 11308, 11309, 11310, 11311}})
			for _, ev := range got {
				if seen[ev.ID] {
					t.Errorf("event %s returned twice", ev.ID)
				}
				seen[ev.ID] = true
			}
			if len(got) != kinds {
				t.Errorf("%d replaceable events, want %d", len(got), kinds)
			}
		}
	}()
	wg.Wait()
	if n, _ := s.CountEvents(ctx, nostr.Filter{Kinds: []int{1}}); n != 38 {
		t.Errorf("%d kind-1 events, want 38", n)
	}
}
