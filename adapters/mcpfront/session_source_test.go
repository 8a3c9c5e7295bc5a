package mcpfront

import (
	"net/http"
	"net/netip"
	"testing"
	"time"
)

const initializeBody = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// initializeFrom sends an initialize as the client at ip (through the
// trusted proxy the test server's peer is) and returns the status, the
// session id issued ("" if none) and the body.
func initializeFrom(t *testing.T, url, ip string) (int, string, []byte) {
	t.Helper()
	status, hdr, body := send(t, http.MethodPost, url, "", initializeBody, "X-Forwarded-For", ip)
	return status, hdr.Get("Mcp-Session-Id"), body
}

// One source flooding initialize cannot evict another source's idle
// session: at MaxSessions the session evicted is the least recently used
// one of the source holding the most.
func TestSessionFloodEvictsOnlyTheFloodersSessions(t *testing.T) {
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	s, _ := newServer(t, Config{MaxSessions: 4, TrustedProxies: loopback})
	clock := useFakeClock(s)
	url := startHTTP(t, s)
	free := call(`1`, "free", `,"arguments":{"text":"x"}`)

	_, victim, _ := initializeFrom(t, url, "198.51.100.1")
	clock.advance(time.Second)
	_, other, _ := initializeFrom(t, url, "198.51.100.3")
	for i := range 40 {
		clock.advance(time.Second)
		if status, sid, body := initializeFrom(t, url, "198.51.100.2"); status != http.StatusOK || sid == "" {
			t.Fatalf("flood initialize %d: HTTP %d %s", i, status, body)
		}
	}
	for name, sid := range map[string]string{"the first client's": victim, "the third client's": other} {
		if status, _, body := send(t, http.MethodPost, url, sid, free, "X-Forwarded-For", "198.51.100.1"); status != http.StatusOK {
			t.Errorf("%s session after another address sent 40 initialize: HTTP %d %s", name, status, body)
		}
	}
	if n := s.sessions.count(); n > 4 {
		t.Errorf("%d sessions live, MaxSessions 4", n)
	}
}

// A source holds at most MaxSessionsPerSource sessions: beyond, its
// initialize evicts its own session idle the longest, or gets 429 when
// each of its sessions has a request in flight. Other sources are not
// touched either way.
func TestSessionsPerSourceBounded(t *testing.T) {
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	s, _ := newServer(t, Config{MaxSessions: 100, MaxSessionsPerSource: 2, TrustedProxies: loopback})
	clock := useFakeClock(s)
	url := startHTTP(t, s)
	free := call(`1`, "free", `,"arguments":{"text":"x"}`)
	const a, b = "198.51.100.1", "198.51.100.2"

	_, other, _ := initializeFrom(t, url, b)
	clock.advance(time.Second)
	_, first, _ := initializeFrom(t, url, a)
	clock.advance(time.Second)
	_, second, _ := initializeFrom(t, url, a)
	clock.advance(time.Second)
	_, third, _ := initializeFrom(t, url, a) // evicts first, a's idle the longest
	for _, tc := range []struct {
		name, sid string
		status    int
	}{{"first", first, 404}, {"second", second, 200}, {"third", third, 200}, {"other source's", other, 200}} {
		if status, _, body := send(t, http.MethodPost, url, tc.sid, free, "X-Forwarded-For", a); status != tc.status {
			t.Errorf("%s session: HTTP %d %s, want %d", tc.name, status, body, tc.status)
		}
	}

	closeSecond := openStream(t, url, second)
	defer closeSecond()
	closeThird := openStream(t, url, third)
	defer closeThird()
	status, hdr, body := send(t, http.MethodPost, url, "", initializeBody, "X-Forwarded-For", a)
	if code, _, _ := rpcError(body); status != http.StatusTooManyRequests || code != codeTransport || hdr.Get("Retry-After") == "" || hdr.Get("Mcp-Session-Id") != "" {
		t.Errorf("initialize with each of the source's sessions busy: HTTP %d %v %s, want 429", status, hdr, body)
	}
	if status, sid, body := initializeFrom(t, url, b); status != http.StatusOK || sid == "" {
		t.Errorf("another source's initialize meanwhile: HTTP %d %s", status, body)
	}
	if status, _, body := send(t, http.MethodPost, url, other, free, "X-Forwarded-For", b); status != http.StatusOK {
		t.Errorf("the other source's first session: HTTP %d %s", status, body)
	}
}
