package ctxvm

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/testkit"
)

// TestProfile: with Profile (and Announce), the server publishes its
// CEP-23 profile with the announcements: a kind 0 event of its key, no
// tags, content the NIP-01 metadata of the configured name, about,
// picture and website (those set, in that order), as the relay serves
// it back; an unchanged Refresh does not publish it again, a changed
// field would (it is an announcement like the others). Without Profile,
// no kind 0 is published.
func TestProfile(t *testing.T) {
	t.Run("relay", func(t *testing.T) {
		relay := testkit.Relay(t)
		s := startServer(t, relay, &fakeVendor{}, func(c *Config) {
			c.Announce, c.Profile = true, true
			c.Website, c.Picture = "https://example.com", "https://example.com/p.png"
		})
		r, err := nostr.RelayConnect(context.Background(), relay)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		want := `{"name":"test server","about":"sells echoes","picture":"https://example.com/p.png","website":"https://example.com"}`
		deadline := time.Now().Add(30 * time.Second) // a deadlock guard
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			evs, err := r.QuerySync(ctx, nostr.Filter{Authors: []string{s.PublicKey()}, Kinds: []int{KindProfile}})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 1 {
				ev := evs[0]
				if ok, _ := ev.CheckSignature(); !ok || ev.Content != want || len(ev.Tags) != 0 {
					t.Fatalf("profile %v, want content %s and no tags", ev, want)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d profiles on the relay", len(evs))
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	t.Run("once, name only", func(t *testing.T) {
		s, pub, rounds := announceRecorder(t, &fakeVendor{}, func(c *Config) { c.Profile = true })
		runServer(t, s)
		nextRound(t, rounds)
		s.Refresh()
		nextRound(t, rounds)
		var profiles []nostr.Event
		for _, ev := range pub.all() {
			if ev.Kind == KindProfile {
				profiles = append(profiles, ev)
			}
		}
		if len(profiles) != 1 || profiles[0].Content != `{"name":"test server"}` || profiles[0].PubKey != s.PublicKey() {
			t.Fatalf("profiles %v", profiles)
		}
	})
	t.Run("off", func(t *testing.T) {
		s, pub, rounds := announceRecorder(t, &fakeVendor{}, nil)
		runServer(t, s)
		nextRound(t, rounds)
		if slices.ContainsFunc(pub.all(), func(ev nostr.Event) bool { return ev.Kind == KindProfile }) {
			t.Fatal("a profile without Profile")
		}
	})
}
