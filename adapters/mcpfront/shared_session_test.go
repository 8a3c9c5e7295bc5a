package mcpfront

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// memSessions is a SessionStore in memory (the ledger's is tested in
// package ledger, on SQLite and PostgreSQL, and end to end in
// internal/cli).
type memSessions struct {
	mu     sync.Mutex
	m      map[string]time.Time
	puts   int
	lookup int
}

func (m *memSessions) PutSession(_ context.Context, hash string, expires time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string]time.Time{}
	}
	if expires.After(m.m[hash]) {
		m.m[hash] = expires
	}
	m.puts++
	return nil
}

func (m *memSessions) SessionLive(_ context.Context, hash string, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lookup++
	e, ok := m.m[hash]
	return ok && e.After(now), nil
}

func (m *memSessions) EndSession(_ context.Context, hash string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, hash)
	return nil
}

func (m *memSessions) counts() (puts, lookups int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.puts, m.lookup
}

// With Config.Sessions, a session one front issued is accepted by another
// sharing the store (its calls reach the Vendor as the same client); a
// made-up id is still refused (a well-formed one costs a lookup, another
// none), a session idle past SessionIdle is refused there too, and one
// ended by its client's DELETE is refused by the others.
func TestSharedSessions(t *testing.T) {
	store := &memSessions{}
	a, _ := newServer(t, Config{Sessions: store, SessionIdle: time.Hour})
	b, fvb := newServer(t, Config{Sessions: store, SessionIdle: time.Hour})
	clockB := useFakeClock(b)
	urlA, urlB := startHTTP(t, a), startHTTP(t, b)
	free := call(`1`, "free", `,"arguments":{"text":"x"}`)

	r := newRawSession(t, urlA) // initialize and notifications/initialized at A
	if puts, _ := store.counts(); puts != 1 {
		t.Fatalf("%d writes for a session's start, want 1", puts)
	}
	if status, _, body := send(t, http.MethodPost, urlB, r.sid, free); status != http.StatusOK {
		t.Fatalf("A's session at B: HTTP %d %s", status, body)
	}
	if c := fvb.last(); c.Client != r.sid {
		t.Fatalf("B's call is of client %q, want the session %q", c.Client, r.sid)
	}
	if status, _, body := send(t, http.MethodPost, urlB, r.sid, free); status != http.StatusOK {
		t.Fatalf("A's session at B again: HTTP %d %s", status, body)
	}
	if puts, lookups := store.counts(); puts != 2 || lookups != 1 {
		t.Fatalf("%d writes, %d lookups; want 2 (A's, B's taking it) and 1", puts, lookups)
	}

	madeUp, err := newSessionID()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{madeUp, "mcp-session-0b5e4f2c-5d0a-4b59-9a43-3c1d2e8f7a61"} {
		status, _, body := send(t, http.MethodPost, urlB, id, free)
		if code, _, _ := rpcError(body); status != http.StatusNotFound || code != codeSessionNotFound {
			t.Errorf("made-up session %s at B: HTTP %d %s", id, status, body)
		}
	}
	if _, lookups := store.counts(); lookups != 2 {
		t.Errorf("%d lookups, want 2: only the well-formed made-up id is looked up", lookups)
	}

	// Idle past SessionIdle at B (its clock): refused there, its expiry
	// in the store passed too.
	clockB.advance(time.Hour + time.Second)
	status, _, body := send(t, http.MethodPost, urlB, r.sid, free)
	if code, _, _ := rpcError(body); status != http.StatusNotFound || code != codeSessionNotFound {
		t.Errorf("idle session at B: HTTP %d %s", status, body)
	}

	// Ended by its client at A: another instance refuses it.
	r2 := newRawSession(t, urlA)
	if status, _, body := send(t, http.MethodDelete, urlA, r2.sid, ``); status != http.StatusOK {
		t.Fatalf("DELETE: HTTP %d %s", status, body)
	}
	status, _, body = send(t, http.MethodPost, urlB, r2.sid, free)
	if code, _, _ := rpcError(body); status != http.StatusNotFound || code != codeSessionNotFound {
		t.Errorf("ended session at B: HTTP %d %s", status, body)
	}
}
