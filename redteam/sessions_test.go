package redteam

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Issue 11, hole 2 and "Sessions: only ids capvend issued are accepted
// (404 otherwise), idle sessions expire (configurable, default 30 min),
// and their count is bounded."

// TestMadeUpSession sends requests with Mcp-Session-Id values capvend
// never issued, without initialize: every one must be answered 404 and
// nothing may run.
func TestMadeUpSession(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{})
	c := newHTTPClient(t, sh)
	id := 0
	for i, sess := range []string{
		"mcp-session-" + uuid.NewString(), // the form mcp-go issues
		uuid.NewString(),
		"mcp-session-" + uuid.NewString(),
	} {
		for _, call := range []struct {
			method string
			params any
		}{
			{"tools/list", nil},
			{"tools/call", callParams("word_count", map[string]any{"text": fmt.Sprintf("made-up session %d", i)}, explicit())},
			{"tools/call", callParams("sha256", map[string]any{"text": "made up"}, explicit())},
		} {
			id++
			_, err := c.tryRPC(sess, id, call.method, call.params, nil)
			if got := statusOf(err); got != http.StatusNotFound {
				t.Errorf("%s with made-up session %q: HTTP %d (%v), want 404", call.method, sess, got, err)
			}
		}
	}
}

// TestSessionIdleExpiry configures http.session_idle (its least value, 10
// seconds) and checks that an idle session is forgotten (404), while a
// fresh one works.
func TestSessionIdleExpiry(t *testing.T) {
	t.Parallel()
	const idle = 10 * time.Second
	sh := startShop(t, shopOpts{http: fmt.Sprintf("  session_idle: %s\n", idle)})
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	if _, err := c.tryRPC(sess, 1, "ping", nil, nil); err != nil {
		t.Fatalf("a fresh session: %v", err)
	}
	// The condition under test is time passing without the session being
	// used: wait it out (plus slack for a loaded machine), then use it.
	time.Sleep(idle + 3*time.Second)
	_, err := c.tryRPC(sess, 2, "tools/call", callParams("word_count", map[string]any{"text": "after expiry"}, nil), nil)
	if got := statusOf(err); got != http.StatusNotFound {
		t.Fatalf("a session idle for %s (http.session_idle %s): HTTP %d (%v), want 404", idle+3*time.Second, idle, got, err)
	}
	if _, err := c.tryRPC(c.initialize(), 1, "ping", nil, nil); err != nil {
		t.Fatalf("a new session after expiry: %v", err)
	}
}

// TestSessionCountBounded configures http.max_sessions and opens more:
// at most that many may be usable at once (whether capvend refuses new
// ones or evicts old ones).
func TestSessionCountBounded(t *testing.T) {
	t.Parallel()
	const max = 4
	sh := startShop(t, shopOpts{http: fmt.Sprintf("  max_sessions: %d\n", max)})
	c := newHTTPClient(t, sh)
	var sessions []string
	for range 3 * max {
		if s, err := c.tryInitialize(); err == nil {
			sessions = append(sessions, s)
		}
	}
	usable := 0
	for i, s := range sessions {
		if _, err := c.tryRPC(s, i+1, "ping", nil, nil); err == nil {
			usable++
		}
	}
	if usable > max {
		t.Fatalf("%d sessions usable at once with http.max_sessions %d (%d initialized)", usable, max, len(sessions))
	}
	if usable == 0 {
		t.Fatal("no session usable at all")
	}
}

// TestSessionFloodKeepsOthersGrants: one address sends initialize after
// initialize (issue 26, item 5c). Another address's idle session, which
// holds a paid explicit-gating grant, must survive it: its repeat of the
// call is answered in that session, not refused as an unknown session.
func TestSessionFloodKeepsOthersGrants(t *testing.T) {
	t.Parallel()
	needLoopback(t, "127.0.0.2")
	const max = 6
	sh := startShop(t, shopOpts{lnd: plainInvoices, http: fmt.Sprintf("  max_sessions: %d\n", max)})
	victim := newHTTPClient(t, sh)
	sess := victim.initialize()
	call := callParams("sha256", map[string]any{"text": "held grant"}, explicit())
	m, err := victim.tryRPC(sess, 1, "tools/call", call, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-payAsync(sh.s, gatedInvoice(t, m)); err != nil {
		t.Fatalf("paying the grant: %v", err)
	}
	waitUntil(t, "the grant paid", func() bool { return callState(t, sh, 1) == "paid" })

	flooder := newHTTPClientFrom(t, sh, "127.0.0.2")
	issued := 0
	for range 5 * max {
		if _, err := flooder.tryInitialize(); err == nil {
			issued++
		}
	}
	if issued == 0 {
		t.Fatal("the flooding address got no session at all")
	}
	m, err = victim.tryRPC(sess, 2, "tools/call", call, nil)
	if err != nil {
		t.Fatalf("the paid grant's session after %d initialize from another address (http.max_sessions %d): %v", 5*max, max, err)
	}
	if !strings.Contains(string(m.Result), sha256Hex("held grant")) {
		t.Fatalf("the paid grant's repeat: %s", m)
	}
}

// TestSessionsPerSourceCapped configures http.max_sessions_per_source and
// opens more from one address: at most that many are usable at once, and
// another address still gets a session.
func TestSessionsPerSourceCapped(t *testing.T) {
	t.Parallel()
	needLoopback(t, "127.0.0.2")
	const perSource = 3
	sh := startShop(t, shopOpts{http: fmt.Sprintf("  max_sessions_per_source: %d\n", perSource)})
	c := newHTTPClientFrom(t, sh, "127.0.0.2")
	var sessions []string
	for range 4 * perSource {
		if s, err := c.tryInitialize(); err == nil {
			sessions = append(sessions, s)
		}
	}
	usable := 0
	for i, s := range sessions {
		if _, err := c.tryRPC(s, i+1, "ping", nil, nil); err == nil {
			usable++
		}
	}
	if usable == 0 || usable > perSource {
		t.Fatalf("%d sessions of one address usable at once with http.max_sessions_per_source %d (%d initialized)", usable, perSource, len(sessions))
	}
	other := newHTTPClient(t, sh)
	if _, err := other.tryRPC(other.initialize(), 1, "ping", nil, nil); err != nil {
		t.Fatalf("another address's session: %v", err)
	}
}
