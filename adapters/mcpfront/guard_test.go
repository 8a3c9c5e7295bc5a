package mcpfront

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// A request whose Origin is not allowed is refused (403) before anything
// else: a web page in a browser must not drive the front. Loopback origins
// are allowed by default.
func TestOriginChecked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allowed []string
		origin  string
		status  int
	}{
		{"no Origin", nil, "", 200},
		{"localhost", nil, "http://localhost:5173", 200},
		{"localhost no port", nil, "http://localhost", 200},
		{"127.0.0.1 https", nil, "https://127.0.0.1:8443", 200},
		{"[::1]", nil, "http://[::1]:3000", 200},
		{"foreign", nil, "https://evil.example", 403},
		{"foreign with localhost in it", nil, "http://localhost.evil.example", 403},
		{"userinfo trick", nil, "http://localhost:80@evil.example", 403},
		{"null", nil, "null", 403},
		{"listed", []string{"https://app.example.com"}, "https://app.example.com", 200},
		{"listed, case", []string{"https://app.example.com"}, "HTTPS://App.Example.com", 200},
		{"listed, other port", []string{"https://app.example.com"}, "https://app.example.com:444", 403},
		{"list replaces the default", []string{"https://app.example.com"}, "http://localhost:5173", 403},
		{"any port", []string{"https://app.example.com:*"}, "https://app.example.com:444", 200},
		{"any origin", []string{"*"}, "https://evil.example", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, fv := newServer(t, Config{AllowedOrigins: tc.allowed})
			url := startHTTP(t, s)
			var h []string
			if tc.origin != "" {
				h = []string{"Origin", tc.origin}
			}
			status, _, body := sendModern(t, url, "free", `{"text":"x"}`, h...)
			if status != tc.status {
				t.Fatalf("HTTP %d %s, want %d", status, body, tc.status)
			}
			if status == http.StatusForbidden {
				if code, _, ok := rpcError(body); !ok || code != codeTransport {
					t.Errorf("body %s", body)
				}
				if len(fv.calls) != 0 {
					t.Error("refused call reached the Vendor")
				}
			}
		})
	}
	if _, err := New(Config{Vendor: &fakeVendor{}, AllowedOrigins: []string{"app.example.com"}}); err == nil {
		t.Error("origin without scheme accepted")
	}
}

// With a bearer token, every request to the endpoint must carry it
// (401 with WWW-Authenticate otherwise); the token never reaches a log.
func TestBearerToken(t *testing.T) {
	const token = "tok-9f8e7d6c5b4a39281706"
	var logs bytes.Buffer
	fv := &fakeVendor{}
	s, err := New(Config{Vendor: fv, BearerToken: []byte(token), Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	url := startHTTP(t, s)
	for _, tc := range []struct {
		name, auth string
		status     int
	}{
		{"none", "", 401},
		{"wrong", "Bearer tok-9f8e7d6c5b4a39281707", 401},
		{"prefix", "Bearer tok-9f8e7d6c5b4a3928170", 401},
		{"basic", "Basic dG9rOnRvaw==", 401},
		{"token without scheme", token, 401},
		{"right", "Bearer " + token, 200},
		{"scheme case", "bearer " + token, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h []string
			if tc.auth != "" {
				h = []string{"Authorization", tc.auth}
			}
			status, hdr, body := sendModern(t, url, "free", `{"text":"x"}`, h...)
			if status != tc.status {
				t.Fatalf("HTTP %d %s, want %d", status, body, tc.status)
			}
			if status == http.StatusUnauthorized {
				if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("WWW-Authenticate %q", hdr.Get("WWW-Authenticate"))
				}
				if code, _, ok := rpcError(body); !ok || code != codeTransport {
					t.Errorf("body %s", body)
				}
			}
		})
	}
	// A legacy session needs the token on every request, not only at
	// initialize.
	status, _, _ := send(t, http.MethodPost, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusUnauthorized {
		t.Errorf("initialize without token: HTTP %d", status)
	}
	if n := len(fv.calls); n != 2 {
		t.Errorf("%d calls reached the Vendor, want 2", n)
	}
	if strings.Contains(logs.String(), "tok-9f8e7d6c5b4a3928170") {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}
	if _, err := New(Config{Vendor: fv, BearerToken: []byte("short")}); err == nil {
		t.Error("a 5-byte token accepted")
	}
}
