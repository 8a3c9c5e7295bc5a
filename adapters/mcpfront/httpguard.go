package mcpfront

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/rpcerr"
)

const (
	logKeyReason   = "reason"
	rpcerrInternal = rpcerr.CodeInternal
)

// isInitialize reports whether body is an initialize request.
func isInitialize(body []byte) bool {
	if !bytes.Contains(body, []byte(mcp.MethodInitialize)) {
		return false
	}
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == string(mcp.MethodInitialize)
}

// rpcID returns the id of the JSON-RPC request in body (a string or a
// number, as JSON), nil if it has none.
func rpcID(body []byte) []byte {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if len(body) == 0 || json.Unmarshal(body, &m) != nil || len(m.ID) == 0 {
		return nil
	}
	switch m.ID[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return m.ID
	}
	return nil
}

// jsonString encodes s as a JSON string.
func jsonString(s string) ([]byte, error) { return json.Marshal(s) }

// maxClientID bounds a ClientIDHeader value.
const maxClientID = 256

// source returns who r counts as for limits and quotas
// (vend.CallRequest.Source): "id:<value>" of Config.ClientIDHeader when a
// trusted proxy set it, else "ip:<address>" of the client: the TCP peer,
// or, when the peer is a trusted proxy, the right-most X-Forwarded-For
// address that is not a trusted proxy (the left-most if all are; the last
// good one when a hop does not parse). IPv6 clients count by /64, the
// block one subscriber gets.
func (s *Server) source(r *http.Request) string {
	peer, ok := parseHop(r.RemoteAddr)
	if !ok {
		return "ip:" + r.RemoteAddr
	}
	if !s.trusted(peer) {
		return ipSource(peer)
	}
	if h := s.cfg.ClientIDHeader; h != "" {
		if v := r.Header.Get(h); validClientID(v) {
			return "id:" + v
		}
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(strings.TrimSpace(hops[i]))
		if !ok {
			break
		}
		client = a
		if !s.trusted(a) {
			break
		}
	}
	return ipSource(client)
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHop reads an address as RemoteAddr and X-Forwarded-For give it:
// "a.b.c.d", "a.b.c.d:port", "::1", "[::1]:port".
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

// ipSource names a client address; an IPv6 one by its /64.
func ipSource(a netip.Addr) string {
	if a.Is4() || a.IsLoopback() {
		return "ip:" + a.String()
	}
	return "ip:" + netip.PrefixFrom(a.WithZone(""), 64).Masked().String()
}

// validClientID accepts 1..maxClientID printable ASCII characters, no
// spaces.
func validClientID(v string) bool {
	if v == "" || len(v) > maxClientID {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// DefaultAllowedOrigins are the origins served when Config.AllowedOrigins
// is nil: pages served from this machine (loopback), on any port.
func DefaultAllowedOrigins() []string {
	return []string{
		"http://localhost:*", "https://localhost:*",
		"http://127.0.0.1:*", "https://127.0.0.1:*",
		"http://[::1]:*", "https://[::1]:*",
	}
}

// originRule is one entry of Config.AllowedOrigins.
type originRule struct {
	any          bool // "*"
	scheme, host string
	port         string // "" : the scheme's default port
	anyPort      bool
}

// parseOriginRule reads "*", "scheme://host", "scheme://host:port" or
// "scheme://host:*".
func parseOriginRule(s string) (originRule, error) {
	if s == "*" {
		return originRule{any: true}, nil
	}
	base, anyPort := strings.CutSuffix(s, ":*")
	o, ok := parseOrigin(base)
	if !ok {
		return originRule{}, fmt.Errorf("allowed origin %q is not scheme://host[:port] (or :* for any port, or *)", s)
	}
	if anyPort && o.port != "" {
		return originRule{}, fmt.Errorf("allowed origin %q has two ports", s)
	}
	return originRule{scheme: o.scheme, host: o.host, port: o.port, anyPort: anyPort}, nil
}

func (r originRule) match(o origin) bool {
	return r.any || r.scheme == o.scheme && r.host == o.host && (r.anyPort || r.port == o.port)
}

type origin struct{ scheme, host, port string }

// parseOrigin reads an Origin header value: an http(s) scheme and a host,
// an optional port, nothing else. Scheme and host are lowercased and a
// default port dropped.
func parseOrigin(s string) (origin, bool) {
	u, err := url.Parse(s)
	if err != nil || u.User != nil || u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Hostname() == "" {
		return origin{}, false
	}
	o := origin{scheme: strings.ToLower(u.Scheme), host: strings.ToLower(u.Hostname()), port: u.Port()}
	switch {
	case o.scheme != "http" && o.scheme != "https":
		return origin{}, false
	case o.scheme == "http" && o.port == "80", o.scheme == "https" && o.port == "443":
		o.port = ""
	}
	return o, true
}

// originAllowed reports whether a request may be served by its Origin
// header: none (not a browser, or a same-origin GET), or an allowed one.
func (s *Server) originAllowed(r *http.Request) bool {
	v := r.Header.Values("Origin")
	if len(v) == 0 {
		return true
	}
	o, ok := parseOrigin(v[0])
	if len(v) > 1 || !ok {
		return slices.ContainsFunc(s.origins, func(r originRule) bool { return r.any })
	}
	return slices.ContainsFunc(s.origins, func(r originRule) bool { return r.match(o) })
}

// minBearerToken is the shortest Config.BearerToken accepted.
const minBearerToken = 16

// authorized reports whether r carries the bearer token (always true
// without one configured). The hashes are compared in constant time.
func (s *Server) authorized(r *http.Request) bool {
	if s.tokenHash == nil {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(sum[:], s.tokenHash) == 1
}

// guard refuses a request whose Origin is not allowed (403) or that lacks
// the bearer token (401), with a JSON-RPC error body; it reports whether
// the request may go on. Nothing of the request is logged but why.
func (s *Server) guard(w http.ResponseWriter, r *http.Request) bool {
	if !s.originAllowed(r) {
		s.log.Info("mcp request refused", logKeyReason, "origin not allowed")
		writeRPCError(w, http.StatusForbidden, nil, codeTransport, "Forbidden: Origin not allowed")
		return false
	}
	if !s.authorized(r) {
		s.log.Info("mcp request refused", logKeyReason, "no valid bearer token")
		w.Header().Set("WWW-Authenticate", `Bearer realm="capvend"`)
		writeRPCError(w, http.StatusUnauthorized, nil, codeTransport, "Unauthorized")
		return false
	}
	return true
}

// CheckAllowedOrigin reports whether s is a valid Config.AllowedOrigins
// entry: "*", "scheme://host", "scheme://host:port" or "scheme://host:*"
// with scheme http or https.
func CheckAllowedOrigin(s string) error {
	_, err := parseOriginRule(s)
	return err
}
