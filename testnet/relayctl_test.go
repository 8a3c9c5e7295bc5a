package testnet

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/freeport"
	"github.com/capvend/capvend/internal/skip"
)

// TestRelayOutage: StopRelay takes the stack's relay down (its port
// refuses connections, testnet.json still names it) and StartRelay brings
// it back on the same address as a new process, recorded; both are
// idempotent. Only the relay runs: the rest of the stack is not needed.
func TestRelayOutage(t *testing.T) {
	skip.Short(t, "builds capvend to run the relay")
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a deadlock guard around a build
	defer cancel()
	exe, err := BuildCapvend(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := newStack(Info{Version: 1, Dir: dir}, nil)
	s.owned = true
	s.Info.Relay = ServiceInfo{URL: "ws://" + addr, Listen: addr, Proc: Proc{Log: filepath.Join(dir, "relay.log")}}
	if err := s.startRelay(exe); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	answers := func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr, nil)
		req.Header.Set("Accept", "application/nostr+json")
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if err := s.StartRelay(ctx); err != nil { // waits for the one running
		t.Fatal(err)
	}
	first := s.Info.Relay.PID
	if !answers() {
		t.Fatal("the relay does not answer NIP-11")
	}
	for range 2 {
		if err := s.StopRelay(); err != nil {
			t.Fatal(err)
		}
	}
	if s.Info.Relay.Alive() || answers() {
		t.Fatal("the relay still runs after StopRelay")
	}
	if err := s.StartRelay(ctx); err != nil {
		t.Fatal(err)
	}
	if !answers() || s.Info.Relay.PID == first {
		t.Fatalf("after StartRelay: answers %v, pid %d (was %d)", answers(), s.Info.Relay.PID, first)
	}
	l, err := Load(dir, nil)
	if err != nil || l.Info.Relay.PID != s.Info.Relay.PID {
		t.Fatalf("testnet.json after StartRelay: %+v %v", l.Info.Relay, err)
	}
}
