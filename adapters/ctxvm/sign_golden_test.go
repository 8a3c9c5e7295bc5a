package ctxvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// TestSignaturesGolden: the server's signatures of fixed events with
// fixed keys, and which of them and of their corruptions verify, are
// testdata/golden/signatures.txt in either build: pure Go (btcec) and
// -tags libsecp256k1 (.ci/run runs this package both ways), so the two
// sign byte for byte alike and accept the same events.
func TestSignaturesGolden(t *testing.T) {
	const n = "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141" // the group order
	const p = "fffffffffffffffffffffffffffffffffffffffffffffffffffffffefffffc2f" // the field prime
	keys := []string{
		strings.Repeat("0", 63) + "1",
		strings.Repeat("0", 63) + "2",
		strings.Repeat("0", 63) + "3",
		"5f1ac1c9b3a1c1c8ee2cbbd1b3e6b3f0a6b0d1e2f3a4b5c6d7e8f9a0b1c2d3e4",
		"ebaaedce6af48a03bbfd25e8cd0364140fffffffffffffffffffffffffffffff",
	}
	corruptions := []struct {
		name string
		mod  func(*nostr.Event)
	}{
		{"as signed", func(*nostr.Event) {}},
		{"content changed, id kept", func(e *nostr.Event) { e.Content += " " }},
		{"sig's last digit changed", func(e *nostr.Event) { e.Sig = flipHex(e.Sig) }},
		{"sig's s is the group order", func(e *nostr.Event) { e.Sig = e.Sig[:64] + n }},
		{"sig's r is the field prime", func(e *nostr.Event) { e.Sig = p + e.Sig[64:] }},
		{"sig's r is zero", func(e *nostr.Event) { e.Sig = strings.Repeat("0", 64) + e.Sig[64:] }},
		{"pubkey is the field prime", func(e *nostr.Event) { e.PubKey = p }},
		{"pubkey's x has no point", func(e *nostr.Event) { e.PubKey = strings.Repeat("0", 63) + "5" }},
		{"sig of the key's last event", nil}, // set below
		{"pubkey of the next key", nil},
	}
	var out strings.Builder
	parities := map[byte]bool{}
	for i, sk := range keys {
		s, err := New(Config{Vendor: &fakeVendor{}, SecretKey: sk, Relays: []string{"ws://x"}})
		if err != nil {
			t.Fatal(err)
		}
		parities[s.priv.PubKey().SerializeCompressed()[0]] = true
		next, _ := nostr.GetPublicKey(keys[(i+1)%len(keys)])
		last := strings.Repeat("0", 128)
		for j, content := range []string{``, `{"jsonrpc":"2.0","id":1,"result":{}}`, "\"\\\n\t<&>\u2028 ünï"} {
			ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Timestamp(1_700_000_000 + j), Tags: nostr.Tags{{"p", next}, {"e", strings.Repeat("ab", 32)}}, Content: content}
			if err := s.sign(&ev); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&out, "key %d, event %d: id %s sig %s\n", i, j, ev.ID, ev.Sig)
			for _, c := range corruptions {
				e := ev
				switch {
				case c.mod == nil && strings.HasPrefix(c.name, "sig"):
					e.Sig = last
				case c.mod == nil:
					e.PubKey = next
				default:
					c.mod(&e)
				}
				err := s.verify(&e)
				fmt.Fprintf(&out, "  %-28s verifies: %v\n", c.name, err == nil)
			}
			last = ev.Sig
		}
	}
	if len(parities) != 2 {
		t.Fatalf("the keys' points have one parity of y only: %v", parities)
	}
	path := filepath.Join("testdata", "golden", "signatures.txt")
	if *update {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != out.String() {
		t.Errorf("%s differs (run with -update if the change is intended); got:\n%s", path, out.String())
	}
}
