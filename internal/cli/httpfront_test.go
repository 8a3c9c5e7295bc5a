package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
)

func errorCode(body string) int {
	var m struct {
		Error struct{ Code int } `json:"error"`
	}
	json.Unmarshal([]byte(body), &m)
	return m.Error.Code
}

// TestServeHTTPFrontGuards drives `capvend serve` over HTTP: only issued
// sessions, the bearer token of http.auth_token_file, Origin checks, and a
// response that waits longer than http.write_timeout.
func TestServeHTTPFrontGuards(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef0123456789abcdef"
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "http.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path, listen := capvendtest.FreeToolsConfig(t, "")
	capvendtest.EditConfig(t, path, "http:\n", "http:\n"+"  auth_token_file: "+tokenFile+"\n  write_timeout: 1s\n")
	startCapvend(t, path)
	url := "http://" + listen + "/mcp"
	auth := []string{"Authorization", "Bearer " + token}
	legacyCall := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sha256","arguments":{"text":"x"}}}`

	t.Run("no token", func(t *testing.T) {
		status, hdr, body := capvendtest.Post(t, url, legacyCall)
		if status != http.StatusUnauthorized || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") || errorCode(body) != -32000 {
			t.Errorf("HTTP %d %v %s", status, hdr, body)
		}
	})
	t.Run("made-up session", func(t *testing.T) {
		status, _, body := capvendtest.Post(t, url, legacyCall, append(auth, "Mcp-Session-Id", "mcp-session-0b5e4f2c-5d0a-4b59-9a43-3c1d2e8f7a61",
			"Mcp-Protocol-Version", "2025-11-25")...)
		if status != http.StatusNotFound || errorCode(body) != -32001 {
			t.Errorf("HTTP %d %s", status, body)
		}
	})
	t.Run("foreign origin", func(t *testing.T) {
		status, _, body := capvendtest.Post(t, url, legacyCall, append(auth, "Origin", "https://evil.example")...)
		if status != http.StatusForbidden || errorCode(body) != -32000 {
			t.Errorf("HTTP %d %s", status, body)
		}
	})
	t.Run("slower than write_timeout", func(t *testing.T) {
		for _, legacy := range []bool{false, true} {
			tr, err := transport.NewStreamableHTTP(url, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
			if err != nil {
				t.Fatal(err)
			}
			var opts []client.ClientOption
			if legacy {
				opts = append(opts, client.WithProtocolVersion(mcp.ProtocolVersion20251125))
			}
			c := client.NewClient(tr, opts...)
			ctx := context.Background()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Initialize(ctx, capvendtest.PayingInit()); err != nil {
				t.Fatal(err)
			}
			if legacy != (c.GetSessionId() != "") {
				t.Fatalf("legacy %v: session %q", legacy, c.GetSessionId())
			}
			capvendtest.WaitTools(t, c, listed.All("slow_count"))
			req := mcp.CallToolRequest{}
			req.Params.Name = "slow_count"
			req.Params.Arguments = map[string]any{"n": 30} // 1.5 s without a write
			res, err := c.CallTool(ctx, req)
			if err != nil || len(res.Content) != 1 || !strings.Contains(res.Content[0].(mcp.TextContent).Text, "counted to 30") {
				t.Errorf("legacy %v: %+v %v", legacy, res, err)
			}
			c.Close()
		}
	})
}

// TestServeConnectionCap: beyond http.max_connections open connections a
// new one is answered 503 at once; a freed slot serves again.
func TestServeConnectionCap(t *testing.T) {
	path, listen := capvendtest.FreeToolsConfig(t, "")
	capvendtest.EditConfig(t, path, "http:\n", "http:\n"+"  max_connections: 2\n")
	startCapvend(t, path)
	// Two kept-alive connections that were served hold both slots (a
	// connection refused because a slot was not yet given back is dialled
	// again).
	deadline := time.Now().Add(waitLimitServe)
	var held []net.Conn
	for len(held) < 2 {
		c, err := net.Dial("tcp", listen)
		if err != nil {
			t.Fatal(err)
		}
		if status := getOn(t, c, listen, false); status == http.StatusBadRequest {
			held = append(held, c)
			defer c.Close()
			continue
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("no slot for two connections")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state
	}
	if status := getOn(t, nil, listen, true); status != http.StatusServiceUnavailable {
		t.Fatalf("third connection: HTTP %d, want 503", status)
	}
	held[0].Close()
	for {
		status := getOn(t, nil, listen, true)
		if status != http.StatusServiceUnavailable {
			if status != http.StatusBadRequest { // a GET without a session: the front answered
				t.Errorf("after a slot freed: HTTP %d", status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no slot freed")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state
	}
}

// waitLimitServe bounds waiting for capvend serve; a deadlock guard.
const waitLimitServe = 30 * time.Second

// getOn sends a GET /mcp on c (keeping it open unless closing; nil: a
// new connection to addr, closed after) and returns the status (0 when
// the connection ended without one).
func getOn(t *testing.T, c net.Conn, addr string, closing bool) int {
	t.Helper()
	if c == nil {
		var err error
		if c, err = net.Dial("tcp", addr); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	c.SetDeadline(time.Now().Add(waitLimitServe))
	conn := ""
	if closing {
		conn = "Connection: close\r\n"
	}
	io.WriteString(c, "GET /mcp HTTP/1.1\r\nHost: "+addr+"\r\nAccept: text/event-stream\r\n"+conn+"\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestHTTPConfigValidates(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"client id without proxies", "http:\n  client_id_header: X-Client-Id\n", []string{"http.client_id_header", "trusted_proxies"}},
		{"bad header name", "http:\n  trusted_proxies: [10.0.0.1]\n  client_id_header: \"X Client\"\n", []string{"http.client_id_header", "header name"}},
		{"bad proxy", "http:\n  trusted_proxies: [10.0.0.0/33]\n", []string{"http.trusted_proxies[0]", "CIDR"}},
		{"bad origin", "http:\n  allowed_origins: [app.example.com]\n", []string{"http.allowed_origins[0]", "scheme://host"}},
		{"bad session idle", "http:\n  session_idle: 9s\n", []string{"http.session_idle", "10s .. 24h"}},
		{"bad max sessions", "http:\n  max_sessions: 0\n", []string{"http.max_sessions"}},
		{"bad max connections", "http:\n  max_connections: -1\n", []string{"http.max_connections"}},
		{"bad write timeout", "http:\n  write_timeout: 0s\n", []string{"http.write_timeout", "1s .. 10m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig("capvend.yaml", []byte(tc.yaml), func(string) string { return "" })
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	c, err := parseConfig("capvend.yaml", []byte("http:\n  trusted_proxies: [10.0.0.0/8, 192.0.2.7, \"::1\"]\n  client_id_header: X-Client-Id\n  allowed_origins: [\"https://app.example.com\", \"http://localhost:*\"]\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	fc, err := frontConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(fc.TrustedProxies); got != 3 || fc.TrustedProxies[1].String() != "192.0.2.7/32" || fc.ClientIDHeader != "X-Client-Id" ||
		fc.WriteTimeout != c.HTTP.WriteTimeout || fc.SessionIdle != 30*time.Minute || fc.MaxSessions != 10_000 || len(fc.AllowedOrigins) != 2 {
		t.Errorf("%+v", fc)
	}
}
