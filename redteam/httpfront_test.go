package redteam

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 11, "HTTP server: read, write and idle timeouts, a connection cap,
// Origin validated (configurable allow list; loopback-only by default),
// optional bearer-token auth for the MCP endpoint (token file), and
// http.client_id_header only behind trusted proxies."

// initializeWith tries an initialize with extra headers and returns the
// HTTP status.
func initializeWith(c *httpClient, hdr http.Header) int {
	st, err := c.postRaw("", request(0, "initialize", map[string]any{
		"protocolVersion": protocolVersion, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "redteam", "version": "1"}}), hdr)
	if err == nil {
		st.close()
	}
	return statusOf(err)
}

func TestHTTPOrigin(t *testing.T) {
	t.Parallel()
	t.Run("loopback only by default", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{})
		c := newHTTPClient(t, sh)
		for _, origin := range []string{"http://evil.example", "https://attacker.example:8443", "null"} {
			if got := initializeWith(c, http.Header{"Origin": {origin}}); got != http.StatusForbidden {
				t.Errorf("Origin %s: HTTP %d, want 403", origin, got)
			}
		}
		for _, origin := range []string{"http://127.0.0.1:" + port(sh.listen), "http://localhost:" + port(sh.listen)} {
			if got := initializeWith(c, http.Header{"Origin": {origin}}); got != http.StatusOK {
				t.Errorf("Origin %s (loopback): HTTP %d, want 200", origin, got)
			}
		}
		if got := initializeWith(c, nil); got != http.StatusOK {
			t.Errorf("no Origin (not a browser): HTTP %d, want 200", got)
		}
	})
	t.Run("allow list", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{http: "  allowed_origins: [\"https://app.example\"]\n"})
		c := newHTTPClient(t, sh)
		if got := initializeWith(c, http.Header{"Origin": {"https://app.example"}}); got != http.StatusOK {
			t.Errorf("an allowed Origin: HTTP %d, want 200", got)
		}
		if got := initializeWith(c, http.Header{"Origin": {"https://evil.example"}}); got != http.StatusForbidden {
			t.Errorf("another Origin: HTTP %d, want 403", got)
		}
	})
}

func port(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}

// TestHTTPBearerToken configures http.auth_token_file: the MCP endpoint
// wants "Authorization: Bearer <token>".
func TestHTTPBearerToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "mcp.token")
	const token = "redteam-0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sh := newShop(t, shopOpts{http: "  auth_token_file: " + tokenFile + "\n"})
	t.Cleanup(sh.finish)
	sh.opts.noWait = true
	sh.start()
	sh.waitLog("serving MCP at")
	c := newHTTPClient(t, sh)
	for name, hdr := range map[string]http.Header{
		"no token":     nil,
		"wrong token":  {"Authorization": {"Bearer wrong"}},
		"not bearer":   {"Authorization": {"Basic " + token}},
		"token prefix": {"Authorization": {"Bearer " + token[:20]}},
	} {
		if got := initializeWith(c, hdr); got != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d, want 401", name, got)
		}
	}
	if got := initializeWith(c, http.Header{"Authorization": {"Bearer " + token}}); got != http.StatusOK {
		t.Errorf("the right token: HTTP %d, want 200", got)
	}
}

// TestHTTPConnectionCap configures http.max_connections: with that many
// connections open, one more is answered 503 and closed; once they close,
// a new one is served.
func TestHTTPConnectionCap(t *testing.T) {
	t.Parallel()
	const max = 4
	sh := startShop(t, shopOpts{http: fmt.Sprintf("  max_connections: %d\n", max)})
	body := request(0, "initialize", map[string]any{"protocolVersion": protocolVersion, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "redteam", "version": "1"}})
	// open dials, sends an initialize and reads the answer's status; the
	// connection stays open (kept alive) unless the server closes it.
	open := func() (net.Conn, int) {
		conn, err := net.Dial("tcp", sh.listen)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Minute)) // a hang guard
		fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", sh.listen, len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			return nil, 0 // closed without an answer
		}
		resp.Body.Close()
		return conn, resp.StatusCode
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := false
	// Connections of the shop's start may still be counted: at most max
	// are served, and one beyond max+2 must have been refused.
	for range max + 3 {
		conn, code := open()
		if code == http.StatusServiceUnavailable {
			refused = true
			conn.Close()
			break
		}
		if code != http.StatusOK {
			t.Fatalf("a connection under the cap: HTTP %d", code)
		}
		held = append(held, conn)
	}
	if len(held) > max {
		t.Errorf("%d connections served at once with http.max_connections %d", len(held), max)
	}
	if !refused {
		t.Fatalf("no connection refused with %d open and http.max_connections %d", len(held), max)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	waitUntil(t, "a new connection served once the others closed", func() bool {
		conn, code := open()
		if conn != nil {
			conn.Close()
		}
		return code == http.StatusOK
	})
}

// closedByServer reports whether the server closes conn (EOF, or an
// error status then EOF) within the hang guard.
func closedByServer(t *testing.T, conn net.Conn) bool {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(time.Minute)) // a hang guard
	_, err := io.Copy(io.Discard, conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// TestHTTPTimeouts configures read, write and idle timeouts and holds
// connections open the way slowloris does.
func TestHTTPTimeouts(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{http: "  read_timeout: 2s\n  write_timeout: 2s\n  idle_timeout: 2s\n"})
	t.Run("slow body", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", sh.listen)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":", sh.listen)
		if !closedByServer(t, conn) {
			t.Fatal("a request whose body never arrives holds its connection past the read timeout")
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", sh.listen)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		body := request(0, "initialize", map[string]any{"protocolVersion": protocolVersion, "capabilities": map[string]any{},
			"clientInfo": map[string]any{"name": "redteam", "version": "1"}})
		fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", sh.listen, len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !closedByServer(t, conn) {
			t.Fatal("an idle keep-alive connection is kept past the idle timeout")
		}
	})
	t.Run("payment wait outlives write timeout", func(t *testing.T) {
		t.Parallel()
		// A call waiting for its payment streams heartbeats and waits
		// minutes: the write timeout must not cut it.
		c := newHTTPClient(t, sh)
		sess := c.initialize()
		st, err := c.postRaw(sess, request(1, "tools/call", callParams("sha256", map[string]any{"text": "slow payer"}, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		bolt11 := untilNote(t, st, notePaymentRequired).payReq()
		time.Sleep(4 * time.Second) // the condition under test: longer than write_timeout
		paid := payAsync(sh.s, bolt11)
		m, _ := untilResponse(t, st, nil)
		if err := <-paid; err != nil {
			t.Fatalf("payment: %v", err)
		}
		if !strings.Contains(string(m.Result), sha256Hex("slow payer")) {
			t.Fatalf("a paid call waiting longer than write_timeout: %s", m)
		}
	})
}

// TestHTTPClientIdentity: without trusted proxies, X-Forwarded-For and
// the client id header are the client's own words and identify no one:
// session-less calls from one address share its free quota. Behind a
// trusted proxy, X-Forwarded-For names the client.
func TestHTTPClientIdentity(t *testing.T) {
	t.Parallel()
	countFree := func(t *testing.T, sh *shop, hdrs []http.Header) int {
		c := newHTTPClient(t, sh)
		free := 0
		for i, h := range hdrs {
			m, err := c.tryModernCall(i+1, "word_count", map[string]any{"text": fmt.Sprintf("client %d", i)}, explicit(), h)
			if err != nil {
				t.Fatal(err)
			}
			if m.Error == nil && strings.Contains(resultText(m.Result), "words") {
				free++
			}
		}
		return free
	}
	xff := []http.Header{{"X-Forwarded-For": {"10.0.0.1"}}, {"X-Forwarded-For": {"10.0.0.2"}}, {"X-Forwarded-For": {"10.0.0.3"}}}
	t.Run("X-Forwarded-For untrusted", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{})
		if n := countFree(t, sh, xff); n > 1 {
			t.Fatalf("%d free calls from one address with forged X-Forwarded-For, want 1", n)
		}
	})
	ids := []http.Header{{"X-Client-Id": {"alice"}}, {"X-Client-Id": {"bob"}}, {"X-Client-Id": {"carol"}}}
	t.Run("client id header untrusted", func(t *testing.T) {
		t.Parallel()
		// Refusing the configuration is as good as ignoring the header.
		sh := newShop(t, shopOpts{http: "  client_id_header: X-Client-Id\n"})
		t.Cleanup(sh.finish)
		sh.opts.noWait = true
		sh.start()
		for !strings.Contains(sh.logs.String(), "capvend: serving") {
			select {
			case <-sh.exited:
				if out := sh.logs.String(); !strings.Contains(out, "client_id_header") {
					t.Fatalf("capvend refused the configuration without naming http.client_id_header:\n%s", out)
				}
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		sh.opts.noWait = false
		sh.restart() // serving: wait for the upstream's tools too
		if n := countFree(t, sh, ids); n > 1 {
			t.Fatalf("%d free calls from one address with made-up client ids (no trusted proxy), want 1", n)
		}
	})
	t.Run("client id header behind a trusted proxy", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{http: "  trusted_proxies: [127.0.0.1/32]\n  client_id_header: X-Client-Id\n"})
		if n := countFree(t, sh, ids); n != len(ids) {
			t.Fatalf("%d free calls for %d clients named by a trusted proxy, want one each", n, len(ids))
		}
	})
	t.Run("X-Forwarded-For behind a trusted proxy", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{http: "  trusted_proxies: [127.0.0.1/32]\n"})
		if n := countFree(t, sh, xff); n != len(xff) {
			t.Fatalf("%d free calls for %d clients behind a trusted proxy, want one each", n, len(xff))
		}
	})
}
