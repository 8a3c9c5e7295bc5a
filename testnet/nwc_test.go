package testnet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/skip"
)

// TestStackNWC: the stack's NWC wallet service (Options.NWC, `capvend
// testnet up --nwc`) starts in front of the vendor node on the stack's
// relay, publishes its four connections, is recorded in testnet.json with
// their URIs, is stopped first of the stack's processes, and stops. It
// fronts the shared stack's node and relay (never stopping them); the
// service itself is proven in billing/nwc's TestWalletService.
func TestStackNWC(t *testing.T) {
	skip.Short(t, "needs the regtest stack")
	if _, err := NWCServiceDir(); errors.Is(err, ErrNWCNotInstalled) {
		skip.Missing(t, "the NWC wallet service (node and testnet/nwc's npm packages)", NWCInstall)
	}
	ctx := context.Background()
	shared, release, err := Shared(ctx, SharedOptions{Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	dir := t.TempDir()
	s := newStack(Info{Version: 1, Dir: dir, Nodes: shared.Info.Nodes, Relay: shared.Info.Relay}, nil)
	if err := s.startNWC(ctx); err != nil {
		t.Fatal(err)
	}
	n := s.Info.NWC
	t.Cleanup(func() { n.Stop() })
	if ps := s.procs(); len(ps) == 0 || ps[0].name != "nwc wallet" || ps[0].PID != n.PID {
		t.Fatalf("the wallet service is not stopped first: %+v", ps)
	}
	for _, conn := range []string{NWCHold, NWCPlain, NWCNIP04, NWCReceive} {
		if !strings.HasPrefix(n.URIs[conn], "nostr+walletconnect://") || !strings.Contains(n.URIs[conn], "secret=") {
			t.Errorf("connection %s: %q", conn, n.URIs[conn])
		}
	}
	if n.Node != Vendor || n.Relay != shared.Info.Relay.URL {
		t.Fatalf("fronts %s on %s", n.Node, n.Relay)
	}
	loaded, err := Load(dir, nil)
	if err != nil && loaded == nil {
		t.Fatal(err)
	}
	if loaded.Info.NWC == nil || loaded.Info.NWC.PID != n.PID || loaded.Info.NWC.URIs[NWCHold] != n.URIs[NWCHold] {
		t.Fatalf("testnet.json: %+v", loaded.Info.NWC)
	}
	loaded.Release()
	if st, err := os.Stat(filepath.Join(dir, "nwc", "connections.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("connections file: %v %v", st, err)
	}
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	if n.Alive() {
		t.Fatal("the wallet service still runs")
	}
}
