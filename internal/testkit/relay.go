// Package testkit holds the helpers capvend's tests share: in-process
// Nostr relays (khatru with an in-memory store, under httptest) here, and
// the ledger's open and verify in internal/testkit/ledgerkit. Tests only
// import it. What the demo shares with the tests is not here: the
// ContextVM client is internal/ctxvmclient, the wait until a server lists
// its tools internal/listed. It imports no adapter, billing or ledger
// package, so that every package's tests may use it (adapters must not
// depend on the ledger, even in tests: hence ledgerkit apart).
package testkit

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fiatjaf/khatru"

	"github.com/capvend/capvend/internal/khatrurelay"
)

// NewRelay returns an in-memory khatru relay, to adjust (RejectEvent ...)
// and serve with ServeRelay.
func NewRelay() *khatru.Relay { return khatrurelay.New(khatrurelay.Options{}) }

// LimitedRelay serves a fresh in-memory relay that reads no websocket
// message over maxMessage bytes (closing the connection of a client that
// sends one, as public relays do) and advertises that limit in NIP-11
// (limitation.max_message_length), until the test ends; it returns its
// ws:// URL.
func LimitedRelay(t testing.TB, maxMessage int) string {
	t.Helper()
	return ServeRelay(t, khatrurelay.New(khatrurelay.Options{MaxMessageLength: maxMessage}))
}

// ServeRelay serves rl under httptest until the test ends and returns its
// ws:// URL.
func ServeRelay(t testing.TB, rl *khatru.Relay) string {
	t.Helper()
	srv := httptest.NewServer(rl)
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// Relay serves a fresh in-memory relay until the test ends and returns its
// ws:// URL.
func Relay(t testing.TB) string {
	t.Helper()
	return ServeRelay(t, NewRelay())
}

// StoppableRelay serves a fresh relay on addr ("127.0.0.1:0" for any
// port) and returns its address and a function that stops it, closing
// its websocket connections too (http.Server.Close leaves hijacked ones).
// The test's end stops it too; stop is idempotent.
func StoppableRelay(t testing.TB, addr string) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	srv := &http.Server{Handler: NewRelay(), ConnState: func(c net.Conn, st http.ConnState) {
		if st == http.StateHijacked {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}}
	go srv.Serve(ln)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			srv.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// GatedRelay serves one in-memory relay at two URLs: open, always up,
// and gated, behind a gate the test closes and opens. Closing it (Cut)
// closes the websocket connections made through gated and refuses new
// ones (HTTP 503) until Restore; the relay and its stored events stay.
// For a server that loses its relay while its clients do not.
type GatedRelay struct {
	Open, Gated string

	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

// NewGatedRelay serves a GatedRelay until the test ends.
func NewGatedRelay(t testing.TB) *GatedRelay {
	t.Helper()
	rl := NewRelay()
	g := &GatedRelay{Open: ServeRelay(t, rl)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		down := g.down
		g.mu.Unlock()
		if down {
			http.Error(w, "gate closed", http.StatusServiceUnavailable)
			return
		}
		rl.ServeHTTP(w, r)
	}))
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateHijacked {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.down {
				c.Close()
				return
			}
			g.conns = append(g.conns, c)
		}
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		g.Cut() // hijacked connections outlive srv.Close
	})
	g.Gated = "ws" + strings.TrimPrefix(srv.URL, "http")
	return g
}

// Cut closes the gate: the connections through Gated are closed, and new
// ones refused until Restore.
func (g *GatedRelay) Cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = true
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}

// Restore opens the gate again.
func (g *GatedRelay) Restore() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = false
}
