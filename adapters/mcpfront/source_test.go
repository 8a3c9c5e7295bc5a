package mcpfront

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// TestSourceForLimits: what a request counts as for limits and quotas
// (vend.CallRequest.Source) is the TCP peer, unless the peer is a trusted
// proxy: then the right-most untrusted X-Forwarded-For address, or the
// client id header it set. A client cannot name itself.
func TestSourceForLimits(t *testing.T) {
	lan := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}
	for _, tc := range []struct {
		name    string
		cfg     Config
		peer    string
		headers []string
		want    string
	}{
		{"peer", Config{}, "203.0.113.5:4000", nil, "ip:203.0.113.5"},
		{"spoofed XFF from an untrusted peer", Config{}, "203.0.113.5:4000", []string{"X-Forwarded-For", "198.51.100.1"}, "ip:203.0.113.5"},
		{"untrusted peer with trusted list", Config{TrustedProxies: lan}, "203.0.113.5:4000", []string{"X-Forwarded-For", "198.51.100.1"}, "ip:203.0.113.5"},
		{"trusted proxy", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "198.51.100.1"}, "ip:198.51.100.1"},
		{"right-most untrusted", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1, 192.0.2.7"}, "ip:198.51.100.1"},
		{"several XFF headers", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "198.51.100.2, 10.9.9.9"}, "ip:198.51.100.2"},
		{"all trusted", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "10.4.4.4, 192.0.2.7"}, "ip:10.4.4.4"},
		{"no XFF", Config{TrustedProxies: lan}, "10.1.2.3:4000", nil, "ip:10.1.2.3"},
		{"garbage hop", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "198.51.100.1, bogus"}, "ip:10.1.2.3"},
		{"hop with port", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "198.51.100.1:5555"}, "ip:198.51.100.1"},
		{"IPv6 by /64", Config{}, "[2001:db8:1:2:3:4:5:6]:4000", nil, "ip:2001:db8:1:2::/64"},
		{"IPv6 hop", Config{TrustedProxies: lan}, "10.1.2.3:4000", []string{"X-Forwarded-For", "[2001:db8::9]:80"}, "ip:2001:db8::/64"},
		{"IPv4-mapped", Config{}, "[::ffff:203.0.113.5]:4000", nil, "ip:203.0.113.5"},
		{"client id from a trusted proxy", Config{TrustedProxies: lan, ClientIDHeader: "X-Client-Id"}, "10.1.2.3:4000",
			[]string{"X-Forwarded-For", "198.51.100.1", "X-Client-Id", "alice"}, "id:alice"},
		{"client id from an untrusted peer", Config{TrustedProxies: lan, ClientIDHeader: "X-Client-Id"}, "203.0.113.5:4000",
			[]string{"X-Client-Id", "alice"}, "ip:203.0.113.5"},
		{"no client id", Config{TrustedProxies: lan, ClientIDHeader: "X-Client-Id"}, "10.1.2.3:4000",
			[]string{"X-Forwarded-For", "198.51.100.1"}, "ip:198.51.100.1"},
		{"unprintable client id", Config{TrustedProxies: lan, ClientIDHeader: "X-Client-Id"}, "10.1.2.3:4000",
			[]string{"X-Forwarded-For", "198.51.100.1", "X-Client-Id", "a b"}, "ip:198.51.100.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, fv := newServer(t, tc.cfg)
			meta := `"_meta":{"` + mcp.MetaKeyProtocolVersion + `":"` + mcp.LATEST_PROTOCOL_VERSION + `","` +
				mcp.MetaKeyClientCapabilities + `":{},"` + mcp.MetaKeyClientInfo + `":{"name":"raw","version":"1"}}`
			req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(
				`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free","arguments":{"text":"x"},`+meta+`}}`))
			req.RemoteAddr = tc.peer
			for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
				"Mcp-Protocol-Version": mcp.LATEST_PROTOCOL_VERSION, "Mcp-Method": "tools/call", "Mcp-Name": "free"} {
				req.Header.Set(k, v)
			}
			for i := 0; i+1 < len(tc.headers); i += 2 {
				req.Header.Add(tc.headers[i], tc.headers[i+1])
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			if rec.Code != http.StatusOK || len(fv.calls) != 1 {
				t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
			}
			if got := fv.last(); got.Source != tc.want || got.Client != anonClient || !got.Anonymous {
				t.Errorf("source %q client %q anonymous %v, want source %q", got.Source, got.Client, got.Anonymous, tc.want)
			}
		})
	}
}

// A legacy session's calls are counted by the same source; the session
// stays the client (it makes request ids unique).
func TestSourceOfSessionCalls(t *testing.T) {
	s, fv := newServer(t, Config{})
	r := newRawSession(t, startHTTP(t, s))
	r.post(call(`1`, "free", `,"arguments":{"text":"x"}`))
	if got := fv.last(); got.Source != "ip:127.0.0.1" || got.Client != r.sid || got.Anonymous {
		t.Errorf("%+v", got)
	}
}

func TestClientIDHeaderNeedsTrustedProxies(t *testing.T) {
	if _, err := New(Config{Vendor: &fakeVendor{}, ClientIDHeader: "X-Client-Id"}); err == nil {
		t.Error("client id header without trusted proxies accepted")
	}
}
