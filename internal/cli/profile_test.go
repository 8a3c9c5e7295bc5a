package cli

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit"
)

// TestServeProfile: `capvend serve` with nostr.announce publishes the
// key's CEP-23 profile (kind 0) from the server section with its
// announcements; `capvend unannounce` withdraws the announcements and
// leaves the profile.
func TestServeProfile(t *testing.T) {
	relay := testkit.Relay(t)
	path, sk := capvendtest.UnannounceConfig(t, relay)
	pk, _ := nostr.GetPublicKey(sk)
	yaml := fmt.Sprintf(`ledger:
  path: capvend.db
server:
  name: Profile shop
  about: sells words
  website: https://example.com
nostr:
  relays: [%s]
  nsec_file: server.nsec
upstreams:
  - name: tools
    prefix: t_
    command: %s
`, relay, capvendtest.ExampleTools(t))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	stop := startCapvend(t, path).Stop
	profile := func() []*nostr.Event { return capvendtest.EventsOn(t, relay, pk, ctxvm.KindProfile) }
	want := `{"name":"Profile shop","about":"sells words","website":"https://example.com"}`
	deadline := time.Now().Add(60 * time.Second) // a deadlock guard
	for len(profile()) == 0 || len(capvendtest.AnnouncementsOn(t, relay, pk)) != len(ctxvm.AnnouncementAddresses(pk)) {
		if time.Now().After(deadline) {
			t.Fatalf("no profile, or not every announcement, on the relay")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if evs := profile(); len(evs) != 1 || evs[0].Content != want || len(evs[0].Tags) != 0 {
		t.Fatalf("profile %v, want content %s", evs, want)
	}
	stop()
	if _, errOut, code := run(t, nil, "unannounce", "--config", path); code != 0 || !strings.Contains(errOut, "nostr.announce is true") {
		t.Fatalf("unannounce: exit %d: %s", code, errOut)
	}
	if n := len(capvendtest.AnnouncementsOn(t, relay, pk)); n != 0 || len(profile()) != 1 {
		t.Fatalf("after unannounce: %d announcements, %d profiles; want 0 and 1", n, len(profile()))
	}
}
