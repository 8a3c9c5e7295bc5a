package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit"
)

func TestUnannounce(t *testing.T) {
	relay := testkit.Relay(t)
	path, sk := capvendtest.UnannounceConfig(t, relay)
	pk, _ := nostr.GetPublicKey(sk)

	// Announcements as a server publishes them (one replaceable, one
	// addressable, one of another author that must stay).
	r, err := nostr.RelayConnect(context.Background(), relay)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	other := nostr.GeneratePrivateKey()
	otherPK, _ := nostr.GetPublicKey(other)
	for _, ev := range []struct {
		sk   string
		kind int
		tags nostr.Tags
	}{
		{sk, ctxvm.KindAnnounceServer, nil},
		{sk, ctxvm.KindDVMCPAnnounceTools, nostr.Tags{{"d", ctxvm.ServerID(pk) + "/tools/list"}}},
		{other, ctxvm.KindAnnounceServer, nil},
	} {
		e := nostr.Event{Kind: ev.kind, CreatedAt: nostr.Now(), Tags: ev.tags, Content: "{}"}
		e.Sign(ev.sk)
		if err := r.Publish(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(capvendtest.AnnouncementsOn(t, relay, pk)); n != 2 {
		t.Fatalf("%d announcements before", n)
	}

	out, errOut, code := run(t, nil, "unannounce", "--config", path, "--reason", "closing shop")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "(2 announcement events found) accepted by 1 of 1 relay(s)") || !strings.Contains(out, relay+": accepted") {
		t.Errorf("output %q", out)
	}
	if n := len(capvendtest.AnnouncementsOn(t, relay, pk)); n != 0 {
		t.Errorf("%d announcements left", n)
	}
	if n := len(capvendtest.AnnouncementsOn(t, relay, otherPK)); n != 1 {
		t.Errorf("another author's announcement deleted")
	}
	// The request itself, as the relay holds it.
	dels, err := r.QuerySync(context.Background(), nostr.Filter{Authors: []string{pk}, Kinds: []int{ctxvm.KindDeletion}})
	if err != nil || len(dels) != 1 {
		t.Fatalf("%d deletion requests: %v", len(dels), err)
	}
	del := dels[0]
	if del.Content != "closing shop" || del.Tags.FindWithValue("a", fmt.Sprintf("31316:%s:%s", pk, pk)) == nil ||
		del.Tags.FindWithValue("a", "11316:"+pk+":") == nil || del.Tags.FindWithValue("k", "31990") == nil ||
		len(slices.Collect(del.Tags.FindAll("e"))) != 2 {
		t.Errorf("deletion request %v", del)
	}
}

func TestUnannounceFails(t *testing.T) {
	rl := testkit.NewRelay()
	rl.RejectEvent = append(rl.RejectEvent, func(_ context.Context, ev *nostr.Event) (bool, string) {
		return ev.Kind == ctxvm.KindDeletion, "blocked: not here"
	})
	refusing := testkit.ServeRelay(t, rl)
	path, _ := capvendtest.UnannounceConfig(t, refusing, "ws://127.0.0.1:1")
	_, errOut, code := run(t, nil, "unannounce", "--config", path, "--timeout", "5s")
	if code != 1 || !strings.Contains(errOut, "no relay accepted the deletion request") {
		t.Fatalf("exit %d: %s", code, errOut)
	}

	dir := t.TempDir()
	noRelays := filepath.Join(dir, "capvend.yaml")
	os.WriteFile(noRelays, []byte("ledger:\n  path: x.db\n"), 0o600)
	if _, errOut, code := run(t, nil, "unannounce", "--config", noRelays); code != 1 || !strings.Contains(errOut, "nostr.relays is empty") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if _, _, code := run(t, nil, "unannounce", "--config", path, "extra"); code != 2 {
		t.Fatalf("exit %d with an argument", code)
	}
}

func TestConfigNostrAccessLists(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	npub, _ := nip19.EncodePublicKey(pk)
	good := fmt.Sprintf("nostr:\n  allow: [%s, %s]\n  deny: [%s]\n", npub, strings.ToUpper(pk), pk)
	cfg, err := parseConfig("capvend.yaml", []byte(good), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if got := hexPubkeys(cfg.Nostr.Allow); len(got) != 2 || got[0] != pk || got[1] != pk {
		t.Errorf("allow %v", got)
	}
	if !cfg.Nostr.Announce {
		t.Error("announce is not on by default")
	}
	for _, tc := range []struct{ yaml, want string }{
		{fmt.Sprintf("nostr:\n  allow: [%s, npub1nope]\n", pk), "nostr.allow[1]"},
		{fmt.Sprintf("nostr:\n  deny: [%s]\n", pk[:60]), "nostr.deny[0]"},
		{fmt.Sprintf("nostr:\n  deny: [%s]\n", strings.Replace(npub, "npub", "nsec", 1)), "nostr.deny[0]"},
	} {
		_, err := parseConfig("capvend.yaml", []byte(tc.yaml), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "npub1… or 64 hex") {
			t.Errorf("%q: err %v, want %s", tc.yaml, err, tc.want)
		}
	}
}

// TestUnannounceAfterServe: serve (announce on by default) announces the
// upstream's tools on the relay; unannounce then removes every one.
func TestUnannounceAfterServe(t *testing.T) {
	relay := testkit.Relay(t)
	path, sk := capvendtest.UnannounceConfig(t, relay)
	pk, _ := nostr.GetPublicKey(sk)
	yaml := fmt.Sprintf("ledger:\n  path: capvend.db\nnostr:\n  relays: [%s]\n  nsec_file: server.nsec\nupstreams:\n  - name: tools\n    prefix: t_\n    command: %s\n",
		relay, capvendtest.ExampleTools(t))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	stop := startCapvend(t, path).Stop
	deadline := time.Now().Add(60 * time.Second) // a deadlock guard
	for {
		evs := capvendtest.AnnouncementsOn(t, relay, pk)
		tools := false
		for _, ev := range evs {
			tools = tools || (ev.Kind == ctxvm.KindAnnounceTools && strings.Contains(ev.Content, `"name":"t_word_count"`))
		}
		if tools && len(evs) == len(ctxvm.AnnouncementAddresses(pk)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("announcements on the relay: %d, tools list announced: %v", len(evs), tools)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()

	if _, errOut, code := run(t, nil, "unannounce", "--config", path); code != 0 || !strings.Contains(errOut, "nostr.announce is true") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if n := len(capvendtest.AnnouncementsOn(t, relay, pk)); n != 0 {
		t.Errorf("%d announcements left", n)
	}
}
