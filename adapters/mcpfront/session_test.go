package mcpfront

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// send sends one HTTP request to the front (a legacy 2025-11-25 request
// when sid is set) and returns the status and the body.
func send(t *testing.T, method, url, sid, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if method == http.MethodGet && resp.StatusCode == http.StatusOK {
		return resp.StatusCode, resp.Header, nil // a listening stream: it never ends
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// rpcError decodes a JSON-RPC error body; ok=false if b is not one.
func rpcError(b []byte) (code int, msg string, ok bool) {
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &m) != nil || m.JSONRPC != "2.0" || m.Error == nil {
		return 0, "", false
	}
	return m.Error.Code, m.Error.Message, true
}

// Only session ids this front issued are served (hole 2 of issue 11): a
// made-up, terminated or missing one never reaches the Vendor.
func TestSessionsOnlyIssuedIDs(t *testing.T) {
	s, fv := newServer(t, Config{})
	url := startHTTP(t, s)
	madeUp := "mcp-session-0b5e4f2c-5d0a-4b59-9a43-3c1d2e8f7a61"

	for _, tc := range []struct {
		name, method, sid, body string
		status, code            int
	}{
		{"made-up session", http.MethodPost, madeUp, call(`7`, "free", `,"arguments":{"text":"x"}`), http.StatusNotFound, codeSessionNotFound},
		{"made-up session, notification", http.MethodPost, madeUp, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, http.StatusNotFound, codeSessionNotFound},
		{"made-up session, GET stream", http.MethodGet, madeUp, ``, http.StatusNotFound, codeSessionNotFound},
		{"made-up session, DELETE", http.MethodDelete, madeUp, ``, http.StatusNotFound, codeSessionNotFound},
		{"no session", http.MethodPost, "", call(`7`, "free", `,"arguments":{"text":"x"}`), http.StatusBadRequest, codeTransport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := send(t, tc.method, url, tc.sid, tc.body)
			code, _, ok := rpcError(body)
			if status != tc.status || !ok || code != tc.code {
				t.Errorf("HTTP %d %s, want %d with JSON-RPC error %d", status, body, tc.status, tc.code)
			}
		})
	}
	if n := len(fv.calls); n != 0 {
		t.Fatalf("%d calls reached the Vendor", n)
	}

	r := newRawSession(t, url)
	if msgs, resp := r.post(call(`1`, "free", `,"arguments":{"text":"x"}`)); resp.StatusCode != http.StatusOK || len(msgs) != 1 {
		t.Fatalf("issued session: HTTP %d %s", resp.StatusCode, msgs)
	}
	if status, _, body := send(t, http.MethodDelete, url, r.sid, ``); status != http.StatusOK {
		t.Fatalf("DELETE: HTTP %d %s", status, body)
	}
	status, _, body := send(t, http.MethodPost, url, r.sid, call(`2`, "free", `,"arguments":{"text":"x"}`))
	if code, _, _ := rpcError(body); status != http.StatusNotFound || code != codeSessionNotFound {
		t.Errorf("terminated session: HTTP %d %s", status, body)
	}
	if n := len(fv.calls); n != 1 {
		t.Errorf("%d calls reached the Vendor, want 1", n)
	}

	// Protocol 2026-07-28 has no sessions: a session id is ignored.
	status, _, body = sendModern(t, url, "free", `{"text":"x"}`, "Mcp-Session-Id", madeUp)
	if _, _, isErr := rpcError(body); status != http.StatusOK || isErr {
		t.Errorf("modern call: HTTP %d %s", status, body)
	}
}

// sendModern sends one protocol 2026-07-28 tools/call (no session) with
// the extra headers and returns the status, headers and the JSON-RPC
// answer (the last SSE event of a stream).
func sendModern(t *testing.T, url, tool, args string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	meta := `"_meta":{"` + mcp.MetaKeyProtocolVersion + `":"` + mcp.LATEST_PROTOCOL_VERSION + `","` +
		mcp.MetaKeyClientCapabilities + `":{},"` + mcp.MetaKeyClientInfo + `":{"name":"raw","version":"1"}}`
	body := `{"jsonrpc":"2.0","id":"m1","method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `,` + meta + `}}`
	h := append([]string{"Mcp-Protocol-Version", mcp.LATEST_PROTOCOL_VERSION, "Mcp-Method", "tools/call", "Mcp-Name", tool}, header...)
	status, hdr, b := send(t, http.MethodPost, url, "", body, h...)
	if i := strings.LastIndex(string(b), "data: "); i >= 0 {
		b = []byte(strings.TrimSpace(string(b[i+len("data: "):])))
	}
	return status, hdr, b
}

// fakeClock replaces the sessions' clock; advance moves it.
type fakeClock struct {
	base time.Time
	off  atomic.Int64
}

func useFakeClock(s *Server) *fakeClock {
	c := &fakeClock{base: time.Now()}
	s.sessions.now = func() time.Time { return c.base.Add(time.Duration(c.off.Load())) }
	return c
}

func (c *fakeClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// openStream opens a session's GET listening stream; close ends it.
func openStream(t *testing.T, url, sid string) (close func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: HTTP %d", resp.StatusCode)
	}
	return func() { cancel(); resp.Body.Close() }
}

// registered reports whether mcp-go holds session sid.
func registered(s *Server, sid string) bool {
	err := s.mcp.SendLogMessageToSpecificClient(sid, mcp.NewLoggingMessageNotification(mcp.LoggingLevelDebug, "test", nil))
	return !errors.Is(err, server.ErrSessionNotFound)
}

// waitIdle waits until the server has ended every request of session sid
// (a closed stream ends on the server a little later).
func waitIdle(t *testing.T, s *Server, sid string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		s.sessions.mu.Lock()
		ss := s.sessions.byID[sid]
		idle := ss == nil || ss.inflight == 0
		s.sessions.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s still has a request in flight", sid)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSessionsExpireWhenIdle(t *testing.T) {
	s, _ := newServer(t, Config{SessionIdle: time.Hour})
	clock := useFakeClock(s)
	url := startHTTP(t, s)
	free := call(`1`, "free", `,"arguments":{"text":"x"}`)

	idle := newRawSession(t, url)
	busy := newRawSession(t, url)
	closeStream := openStream(t, url, busy.sid) // a request in flight: never idle
	clock.advance(time.Hour - time.Second)
	if status, _, body := send(t, http.MethodPost, url, idle.sid, free); status != http.StatusOK {
		t.Fatalf("before the idle limit: HTTP %d %s", status, body) // and idle counts from now again
	}
	clock.advance(time.Hour - time.Second)
	if status, _, body := send(t, http.MethodPost, url, idle.sid, free); status != http.StatusOK {
		t.Fatalf("active session: HTTP %d %s", status, body)
	}
	if registered(s, idle.sid) != true {
		t.Fatal("mcp-go does not know the live session")
	}
	clock.advance(time.Hour)
	status, _, body := send(t, http.MethodPost, url, idle.sid, free)
	if code, _, _ := rpcError(body); status != http.StatusNotFound || code != codeSessionNotFound {
		t.Errorf("idle session: HTTP %d %s, want 404", status, body)
	}
	if registered(s, idle.sid) {
		t.Error("mcp-go still holds the expired session")
	}
	if status, _, body := send(t, http.MethodPost, url, busy.sid, free); status != http.StatusOK {
		t.Errorf("session with a stream open: HTTP %d %s", status, body)
	}
	closeStream()
	waitIdle(t, s, busy.sid)
	// Its idle time counts from the end of its last request.
	clock.advance(time.Hour)
	if status, _, _ := send(t, http.MethodPost, url, busy.sid, free); status != http.StatusNotFound {
		t.Errorf("session idle after its stream closed: HTTP %d", status)
	}
	if n := s.sessions.count(); n != 0 {
		t.Errorf("%d sessions kept", n)
	}
}

// At MaxSessions live sessions a new initialize evicts the one idle the
// longest; when every session has a request in flight it gets 503.
func TestSessionsBounded(t *testing.T) {
	s, _ := newServer(t, Config{MaxSessions: 2})
	clock := useFakeClock(s)
	url := startHTTP(t, s)
	free := call(`1`, "free", `,"arguments":{"text":"x"}`)

	a := newRawSession(t, url)
	clock.advance(time.Second)
	b := newRawSession(t, url)
	clock.advance(time.Second)
	send(t, http.MethodPost, url, a.sid, free) // a is now the more recent
	clock.advance(time.Second)
	c := newRawSession(t, url) // evicts b
	for _, tc := range []struct {
		name, sid string
		status    int
	}{{"a", a.sid, 200}, {"b", b.sid, 404}, {"c", c.sid, 200}} {
		if status, _, body := send(t, http.MethodPost, url, tc.sid, free); status != tc.status {
			t.Errorf("session %s: HTTP %d %s, want %d", tc.name, status, body, tc.status)
		}
	}

	closeA, closeC := openStream(t, url, a.sid), openStream(t, url, c.sid)
	status, hdr, body := send(t, http.MethodPost, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if code, _, _ := rpcError(body); status != http.StatusServiceUnavailable || code != codeTransport || hdr.Get("Retry-After") == "" || hdr.Get("Mcp-Session-Id") != "" {
		t.Errorf("initialize with every session busy: HTTP %d %v %s", status, hdr, body)
	}
	closeA()
	closeC()
	waitIdle(t, s, a.sid)
	if d := newRawSession(t, url); d.sid == a.sid || d.sid == c.sid {
		t.Error("session id reused")
	}
	if n := s.sessions.count(); n != 2 {
		t.Errorf("%d sessions, want 2", n)
	}
}

// Session ids are 256 random bits, never a format anyone can fill in.
func TestSessionIDs(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		id, err := newSessionID()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(id, sessionIDPrefix))
		if err != nil || len(raw) != 32 || seen[id] {
			t.Fatalf("id %q", id)
		}
		seen[id] = true
	}
}
