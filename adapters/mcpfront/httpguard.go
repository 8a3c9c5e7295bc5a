package mcpfront

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/netip"
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
