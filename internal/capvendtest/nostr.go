package capvendtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/capvend/capvend/adapters/ctxvm"
)

// UnannounceConfig writes a configuration naming relays and a fresh key,
// and returns its path and the key.
func UnannounceConfig(t testing.TB, relays ...string) (path, sk string) {
	t.Helper()
	dir := t.TempDir()
	sk = nostr.GeneratePrivateKey()
	nsec, _ := nip19.EncodePrivateKey(sk)
	if err := os.WriteFile(filepath.Join(dir, "server.nsec"), []byte(nsec+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "capvend.yaml")
	yaml := fmt.Sprintf("nostr:\n  relays: [%s]\n  nsec_file: server.nsec\n  announce: false\n", strings.Join(relays, ", "))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, sk
}

// AnnouncementsOn returns the announcement events of pk the relay holds.
func AnnouncementsOn(t testing.TB, relay, pk string) []*nostr.Event {
	t.Helper()
	var kinds []int
	for _, a := range ctxvm.AnnouncementAddresses(pk) {
		kinds = append(kinds, a.Kind)
	}
	return EventsOn(t, relay, pk, kinds...)
}

// EventsOn returns the events of pk of those kinds the relay holds.
func EventsOn(t testing.TB, relay, pk string, kinds ...int) []*nostr.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := nostr.RelayConnect(ctx, relay)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	evs, err := r.QuerySync(ctx, nostr.Filter{Authors: []string{pk}, Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}
