package ctxvm

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/capvend/capvend/internal/racesupp"
)

// leakOptions are the goroutines that may outlive the tests.
var leakOptions = []goleak.Option{
	// khatru v0.19.1's NewRelay starts its NIP-40 expiration manager with
	// context.Background() and has no way to stop it: one per test relay
	// (relays are test fixtures here; capvend serve runs none, and the
	// relay of capvend testnet lives as long as its process).
	goleak.IgnoreTopFunction("github.com/fiatjaf/khatru.(*expirationManager).start"),
}

// leakGrace is how long goroutines may take to end after the tests:
// go-nostr v0.52.3's SimplePool sleeps between reconnects without
// watching its context (pool.go:573, 3 s the first time), so a pool
// whose relay went down ends that long after the server stopped.
const leakGrace = 10 * time.Second

// TestMain runs the tests with the race detector's suppressions of known
// races inside go-nostr and khatru (see package racesupp), then fails if
// any goroutine the tests started is still running leakGrace after they
// ended: every goroutine the server starts must stop when Run's context
// ends.
func TestMain(m *testing.M) {
	racesupp.Reexec()
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(leakGrace)
		for {
			err := goleak.Find(leakOptions...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: goroutines still running %s after the tests: %v\n", leakGrace, err)
				code = 1
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.Exit(code)
}
