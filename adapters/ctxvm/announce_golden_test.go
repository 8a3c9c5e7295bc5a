package ctxvm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/vend"
)

// goldenKey is a fixed server key: pubkeys, d tags and coordinates in the
// golden files stay put.
var goldenKey = strings.Repeat("7", 64)

// TestAnnounceGolden holds every announcement's kind, tags and content
// (id, sig and created_at are not compared) in
// testdata/golden/announce_<kind>[_<d suffix>].json. Regenerate with
// -update after a deliberate change, and read the diff.
func TestAnnounceGolden(t *testing.T) {
	s, err := New(Config{Vendor: &fakeVendor{}, Catalog: newListCatalog(), SecretKey: goldenKey,
		Relays: []string{"wss://relay.example.com", "wss://relay2.example.com"}, Name: "Echo shop", Version: "1.2.3",
		About: "sells echoes", Website: "https://example.com", Picture: "https://example.com/p.png",
		PMIs: []string{vend.PMILightning, vend.PMICashu}, Announce: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	anns := s.announcements()
	if len(anns) != numAnnouncements {
		t.Fatalf("%d announcements", len(anns))
	}
	seen := map[string]bool{}
	for _, a := range anns {
		name := "announce_" + strconv.Itoa(a.Kind)
		if _, suffix, ok := strings.Cut(a.D, "/"); ok {
			name += "_" + strings.ReplaceAll(suffix, "/", "_")
		}
		if seen[name] {
			t.Fatalf("two announcements named %s", name)
		}
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			ev := nostr.Event{Kind: a.Kind, CreatedAt: 1, Tags: a.tags, Content: a.content}
			if err := ev.Sign(goldenKey); err != nil {
				t.Fatal(err)
			}
			if a.content != "" && !json.Valid([]byte(a.content)) {
				t.Fatalf("content is not JSON: %s", a.content)
			}
			checkGolden(t, name, announceGolden(ev))
		})
	}
}

// goldenEvent renders ev for a golden file: id, sig and created_at
// (which vary) left out, one tag per line, the content as its exact
// string.
func announceGolden(ev nostr.Event) []byte {
	var b bytes.Buffer
	str := func(v any) string {
		var sb bytes.Buffer
		enc := json.NewEncoder(&sb)
		enc.SetEscapeHTML(false)
		enc.Encode(v)
		return strings.TrimSuffix(sb.String(), "\n")
	}
	fmt.Fprintf(&b, "{\n  \"kind\": %d,\n  \"pubkey\": %s,\n  \"tags\": [", ev.Kind, str(ev.PubKey))
	for i, t := range ev.Tags {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n    " + strings.ReplaceAll(str(t), `","`, `", "`))
	}
	if len(ev.Tags) > 0 {
		b.WriteString("\n  ")
	}
	fmt.Fprintf(&b, "],\n  \"content\": %s\n}\n", str(ev.Content))
	return b.Bytes()
}

// TestAnnounceProfileGolden holds the CEP-23 profile (kind 0) of the
// golden server in testdata/golden/announce_0.json.
func TestAnnounceProfileGolden(t *testing.T) {
	s, err := New(Config{Vendor: &fakeVendor{}, SecretKey: goldenKey, Relays: []string{"wss://relay.example.com"}, Name: "Echo shop",
		Version: "1.2.3", About: "sells echoes", Website: "https://example.com", Picture: "https://example.com/p.png",
		Announce: true, Profile: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range s.announcements() {
		if a.Kind == KindProfile {
			ev := nostr.Event{Kind: a.Kind, CreatedAt: 1, Tags: a.tags, Content: a.content}
			if err := ev.Sign(goldenKey); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, "announce_0", announceGolden(ev))
			return
		}
	}
	t.Fatal("no profile announced")
}
