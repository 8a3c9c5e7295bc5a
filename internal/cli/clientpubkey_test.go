package cli

import (
	"strings"
	"testing"
)

// TestConfigClientPubkey: upstreams[].client_pubkey (CEP-16) is off by
// default, reaches the upstream's configuration when set, and is refused
// without a Nostr front (nostr.relays), the only one whose clients have
// a pubkey.
func TestConfigClientPubkey(t *testing.T) {
	const nostrFront = "nostr:\n  relays: [ws://127.0.0.1:1]\n  nsec_file: server.nsec\n"
	const ups = "upstreams:\n  - name: a\n    command: x\n    client_pubkey: true\n  - name: b\n    command: y\n"
	cfg, err := parseConfig("capvend.yaml", []byte(nostrFront+ups), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	sc := upstreamServers(cfg)
	if len(sc) != 2 || !sc[0].ClientPubkey || sc[1].ClientPubkey {
		t.Fatalf("upstream configs %+v", sc)
	}
	_, err = parseConfig("capvend.yaml", []byte("http:\n  listen: 127.0.0.1:0\n"+ups), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "upstreams[0].client_pubkey") || !strings.Contains(err.Error(), "nostr.relays") ||
		strings.Contains(err.Error(), "upstreams[1]") {
		t.Fatalf("client_pubkey without a Nostr front: %v", err)
	}
}
