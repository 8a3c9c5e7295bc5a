package redteam

import (
	"fmt"
	"net/http"
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
