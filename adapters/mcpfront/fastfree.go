package mcpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/jsonobj"
	"github.com/capvend/capvend/vend"
)

// FreeCaller is an optional ability of a Vendor (vend's Vendor has it): it
// serves a free tools/call without the work a priced one needs, if the call
// is one (see vend.Vendor.CallFree). ok false: nothing was done; the call
// is served by CallTool. A free call is never answered with a payment
// error, so the fast path has no gating results to write.
type FreeCaller interface {
	CallFree(ctx context.Context, r vend.CallRequest) (res vend.CallResult, ok bool, err error)
}

// The fast path of free calls over Streamable HTTP.
//
// A tools/call of protocol 2026-07-28 that mcp-go would serve without
// complaint, from a client that did not declare the elicitation
// capability, is handed to the Vendor's CallFree before mcp-go sees it.
// If the Vendor serves it (a free tool on an HTTP upstream, every check
// passed, see vend.Vendor.CallFree), the answer is written here, as the
// bytes mcp-go and the rewriting writer would have written: the same
// status, headers, envelope, decorations (resultType, _meta.serverInfo),
// errors and progress notifications on the call's stream. Anything else
// goes the usual way, untouched: other methods, batches, requests before
// protocol 2026-07-28 (their session state is mcp-go's), a client that
// can elicit (its elicitations go through the parked-call machinery), any
// params or _meta member the fast path does not know (requestState,
// task, capvend/* keys, logLevel), a request mcp-go would refuse (bad
// content type, headers that do not match the body, a Host header its
// DNS rebinding check refuses, a tool it does not list), and every call
// the Vendor does not take (priced, a free quota, invalid arguments, a
// stdio upstream...). The tests in fastfree_test.go compare both paths'
// bytes for the same requests.

// fastCall is a tools/call the fast path may serve.
type fastCall struct {
	id       json.RawMessage // as mcp-go would echo it
	name     string
	args     json.RawMessage
	progress json.RawMessage // the progress token as mcp-go would decode and encode it; nil if none
	payments bool            // the client declared CapabilityPayments
}

// serveFree serves r on the fast path if it can (see above) and reports
// whether it did; if not, nothing was written.
func (s *Server) serveFree(rw *rewriteWriter, r *http.Request, body []byte, modern bool) bool {
	fc, ok := s.cfg.Vendor.(FreeCaller)
	if !ok || !modern || r.Method != http.MethodPost {
		return false
	}
	call, ok := s.fastRequest(r, body)
	if !ok {
		return false
	}
	cr := vend.CallRequest{
		Name:      call.name,
		RequestID: string(call.id),
		Arguments: call.args,
		Explicit:  s.cfg.ExplicitGating,
		Transport: TransportHTTP,
		Source:    s.source(r),
	}
	if s.cfg.ClientID != nil {
		cr.Client = s.cfg.ClientID(r)
	}
	if cr.Client == "" {
		cr.Client = anonClient
	}
	cr.Anonymous = cr.Client == anonClient
	cr.ProgressToken = call.progress
	s.gateAs(&cr, call.payments)
	ctx := r.Context()
	cr.Notify = func(method string, params any) {
		msg := s.encodeNotification(method, params)
		if msg == nil {
			return
		}
		if !rw.notify(msg) {
			s.log.Debug("notification not sent: response finished", logKeyMethod, method)
		}
	}
	// The client cannot elicit: the slow path would decline every
	// elicitation of the upstream too.
	cr.Elicit = func(context.Context, json.RawMessage) (json.RawMessage, error) { return answerDecline, nil }
	res, ok, err := fc.CallFree(ctx, cr)
	if !ok {
		return false
	}
	s.writeFree(ctx, rw, call, cr, res, err)
	return true
}

// writeFree writes the outcome of a fast call as mcp-go's handler and the
// rewriting writer would have.
func (s *Server) writeFree(ctx context.Context, rw *rewriteWriter, call fastCall, cr vend.CallRequest, res vend.CallResult, err error) {
	var msg []byte
	var code int // the error's, 0 for a result
	if err == nil && !json.Valid(res.Body) {
		s.log.Error("vendor returned an invalid result body", logKeyTool, cr.Name)
		err = errors.New("invalid result body")
	}
	if err != nil {
		w := s.logCallError(ctx, cr, err)
		code = w.Code
		b, _ := json.Marshal(w)
		msg = envelope(call.id, "error", b)
	} else {
		body, ok := s.decorate(res.Body)
		if !ok {
			s.log.Error("vendor returned an invalid result body", logKeyTool, cr.Name)
			b, _ := json.Marshal(toWire(errors.New("invalid result body"), cr.Name))
			msg = envelope(call.id, "error", b)
		} else {
			msg = envelope(call.id, "result", body)
		}
	}
	if ctx.Err() != nil {
		return // mcp-go writes nothing once the client left
	}
	rw.mu.Lock()
	sse := rw.sse
	rw.mu.Unlock()
	if sse {
		var b bytes.Buffer
		b.WriteString("event: message\ndata: ")
		b.Write(msg)
		b.WriteString("\n\n")
		_, _ = rw.Write(b.Bytes())
		rw.Flush()
		return
	}
	// The status commitPending would give (this is a request of protocol
	// 2026-07-28), without reading the message again.
	status := http.StatusOK
	if code == rpcerr.CodeInvalidParams || code == rpcerr.CodeInvalidRequest {
		status = http.StatusBadRequest
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.mu.Lock()
	rw.wroteHeader = true
	rw.w.WriteHeader(status) // buffered: Write moves the deadline before it writes
	rw.mu.Unlock()
	_, _ = rw.Write(append(msg, '\n'))
}

// decorate adds to a result body what mcp-go adds to a result of protocol
// 2026-07-28 when the body lacks it (resultType, then _meta with
// serverInfo), as restoreResult keeps it.
func (s *Server) decorate(body json.RawMessage) (json.RawMessage, bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) < 2 || trimmed[0] != '{' || trimmed[len(trimmed)-1] != '}' {
		return nil, false // not an object (body is valid JSON)
	}
	var hasType, hasMeta, empty bool
	if !bytes.Contains(body, []byte(`"resultType"`)) && !bytes.Contains(body, []byte(`"_meta"`)) {
		// Neither name anywhere: no need to read the members.
		empty = len(bytes.TrimSpace(trimmed[1:len(trimmed)-1])) == 0
	} else {
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil {
			return nil, false
		}
		_, hasType = fields["resultType"]
		_, hasMeta = fields["_meta"]
		empty = len(fields) == 0
	}
	if hasType && hasMeta {
		return body, true
	}
	trimmed = bytes.TrimRight(body, " \t\r\n")
	// Sized at once for both members.
	out := make([]byte, 0, len(trimmed)+len(`,"resultType":"complete","_meta":`)+len(s.serverInfoMeta())+1)
	out = append(out, trimmed[:len(trimmed)-1]...)
	if !hasType {
		out = appendMember(out, "resultType", json.RawMessage(`"`+mcp.ResultTypeComplete+`"`), &empty)
	}
	if !hasMeta {
		out = appendMember(out, "_meta", s.serverInfoMeta(), &empty)
	}
	return append(out, '}'), true
}

// serverInfoMeta is the _meta mcp-go gives a result: {"serverInfo": ...}.
func (s *Server) serverInfoMeta() json.RawMessage {
	s.infoOnce.Do(func() {
		s.info, _ = json.Marshal(map[string]any{mcp.MetaKeyServerInfo: mcp.Implementation{Name: s.cfg.Name, Version: s.cfg.Version}})
	})
	return s.info
}

// fastRequest reads r as a tools/call the fast path may serve: see the
// comment at the top of the file for what it refuses.
func (s *Server) fastRequest(r *http.Request, body []byte) (fastCall, bool) {
	var none fastCall
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return none, false
		}
	}
	if r.Header.Get(mcp.HeaderLastEventID) != "" || rebindingRefused(r) {
		return none, false
	}
	// One validity scan, then the members read off the bytes (no maps):
	// names as the decoder would read them (jsonobj refuses escaped and
	// repeated names, which go the usual way).
	if !json.Valid(body) {
		return none, false
	}
	top, ok := members(body, "jsonrpc", "id", "method", "params")
	if !ok || string(top[0]) != `"2.0"` || string(top[2]) != `"tools/call"` {
		return none, false
	}
	id, ok := echoID(top[1])
	if !ok {
		return none, false
	}
	rawParams := top[3]
	params, ok := members(rawParams, "name", "arguments", "_meta")
	if !ok {
		return none, false
	}
	name, ok := decodeString(params[0])
	if !ok || name == "" {
		return none, false
	}
	meta, ok := members(params[2], "progressToken", mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientInfo, mcp.MetaKeyClientCapabilities)
	if !ok {
		return none, false
	}
	version := r.Header.Get(mcp.HeaderProtocolVersion)
	if !quotes(meta[1], version) { // else the header's string is the version's
		v, ok := decodeString(meta[1])
		if !ok || v != version {
			return none, false
		}
	}
	if !mcp.IsModernProtocol(version) {
		return none, false
	}
	client, ok := s.clientMeta(meta[3], meta[2])
	if !ok || !standardHeadersMatch(r.Header, version, name) {
		return none, false
	}
	tool := s.mcp.GetTool(name)
	if tool == nil || bytes.Contains(tool.Tool.RawInputSchema, []byte("x-mcp-header")) || tool.Tool.Execution != nil {
		return none, false
	}
	call := fastCall{id: id, name: name, args: params[1], payments: client.payments}
	if len(call.args) == 0 || string(call.args) == "null" {
		call.args = json.RawMessage(`{}`)
	}
	if raw := meta[0]; raw != nil {
		var tok any
		if json.Unmarshal(raw, &tok) != nil {
			return none, false
		}
		switch tok.(type) {
		case string, float64:
		default:
			return none, false
		}
		call.progress, _ = json.Marshal(tok)
	}
	return call, true
}

// members returns the values of the members of the object b named
// names, in that order (nil for a member b lacks); false if b is not an
// object, has a member not in names, or names one the bytes do not show
// as they decode (an escape) or twice. b is valid JSON. An absent or null
// b is an empty object, as json.Unmarshal into a map reads it.
func members(b json.RawMessage, names ...string) ([]json.RawMessage, bool) {
	out := make([]json.RawMessage, len(names))
	if len(b) == 0 || string(b) == "null" {
		return out, true
	}
	ms, ok := jsonobj.Members(b)
	if !ok {
		return nil, false
	}
next:
	for _, m := range ms {
		for i, n := range names {
			if m.Key == n {
				out[i] = b[m.ValueStart:m.End]
				continue next
			}
		}
		return nil, false
	}
	return out, true
}

// echoID returns a JSON-RPC id (a string or a number) as mcp-go echoes
// it: decoded to a Go value and encoded again. An id that reads back as
// it is (a string of printable ASCII that json.Marshal does not escape, a
// positive integer below 2^53 without leading zeros) is returned as it is.
func echoID(raw json.RawMessage) (json.RawMessage, bool) {
	if len(raw) == 0 {
		return nil, false
	}
	if sameEchoID(raw) {
		return raw, true
	}
	switch raw[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
	default:
		return nil, false
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	b, err := json.Marshal(mcp.NewRequestId(v))
	if err != nil {
		return nil, false
	}
	return b, true
}

// rebindingRefused reports whether mcp-go's DNS rebinding protection
// refuses r (a loopback listener, a Host that is not loopback): then
// mcp-go answers it, not the fast path.
func rebindingRefused(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || local == nil {
		return false
	}
	if ta, ok := local.(*net.TCPAddr); ok { // without local.String()'s allocations
		return ta.IP.IsLoopback() && !isLoopback(r.Host)
	}
	return isLoopback(local.String()) && !isLoopback(r.Host)
}

// isLoopback is mcp-go's isLoopbackHost: localhost or a loopback IP,
// with or without a port.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// sameEchoID reports whether echoID's decoding and encoding give raw
// back: a string of printable ASCII but for what json.Marshal escapes
// (quote, backslash, <, >, &), or an integer of 1 to 15 digits without a
// leading zero (exact as a float64, and printed without an exponent).
func sameEchoID(raw []byte) bool {
	if raw[0] == '"' {
		if len(raw) < 2 || raw[len(raw)-1] != '"' {
			return false
		}
		return jsonobj.Plain(raw[1 : len(raw)-1])
	}
	if len(raw) > 15 || (raw[0] == '0' && len(raw) > 1) {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// decodeString decodes raw, a JSON string, as json.Unmarshal into a string
// does: without the decoder if it has no escape and is valid UTF-8.
func decodeString(raw []byte) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		in := raw[1 : len(raw)-1]
		if bytes.IndexByte(in, '\\') < 0 && bytes.IndexByte(in, '"') < 0 && utf8.Valid(in) {
			ok := true
			for _, c := range in {
				ok = ok && c >= 0x20
			}
			if ok {
				return string(in), true
			}
		}
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// quotes reports whether raw is the JSON string of s as s quoted (s is
// jsonobj.Plain): then raw decodes to s.
func quotes(raw []byte, s string) bool {
	return len(raw) == len(s)+2 && raw[0] == '"' && raw[len(raw)-1] == '"' && string(raw[1:len(raw)-1]) == s && jsonobj.Plain(s)
}

// standardHeadersMatch is mcp.ValidateStandardHeaders(...) == nil for a
// tools/call of name (the params' name, as the request's body gives it),
// without decoding the params again.
func standardHeadersMatch(h http.Header, version, name string) bool {
	if !mcp.RequiresStandardHeaders(version) {
		return true
	}
	if h.Get(mcp.HeaderMethod) != string(mcp.MethodToolsCall) {
		return false
	}
	v := h.Get(mcp.HeaderName)
	if v == "" {
		return false
	}
	decoded, ok := mcp.DecodeHeaderValue(v)
	return ok && decoded == name
}

// clientFacts is what the fast path reads of a request's
// clientCapabilities and clientInfo.
type clientFacts struct {
	payments bool // CapabilityPayments declared
}

// clientMeta reads a tools/call's _meta clientCapabilities (caps) and
// clientInfo (info, nil if absent) as mcp-go decodes them: false if
// either does not decode, caps is null or absent, or the client can
// elicit. A client sends the same bytes on every call: the answers for
// up to maxClientMetas of them are kept.
func (s *Server) clientMeta(caps, info json.RawMessage) (clientFacts, bool) {
	key := clientMetaHash(caps, info)
	if v, ok := s.clientMetas.Load(key); ok {
		if a := v.(clientMetaAnswer); a.caps == string(caps) && a.info == string(info) && a.hasInfo == (info != nil) {
			return a.facts, a.ok
		}
	}
	var a clientMetaAnswer
	var c *mcp.ClientCapabilities
	if json.Unmarshal(caps, &c) == nil && c != nil && c.Elicitation == nil {
		a.ok, a.facts.payments = true, hasPayments(c.Experimental)
	}
	if info != nil {
		var impl *mcp.Implementation
		if json.Unmarshal(info, &impl) != nil {
			a.ok = false
		}
	}
	if s.clientMetaN.Load() < maxClientMetas && len(caps)+len(info) <= maxClientMetaBytes {
		a.caps, a.info, a.hasInfo = string(caps), string(info), info != nil
		if _, loaded := s.clientMetas.LoadOrStore(key, a); !loaded {
			s.clientMetaN.Add(1)
		}
	}
	return a.facts, a.ok
}

// clientMetaHash is the key of caps and info (nil or not) in
// Server.clientMetas: the bytes are compared with the answer's, so a
// lookup makes no string of them.
func clientMetaHash(caps, info []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(clientMetaSeed)
	h.Write(caps)
	if info != nil {
		h.WriteByte(0)
		h.Write(info)
	}
	return h.Sum64()
}

var clientMetaSeed = maphash.MakeSeed()

// clientMetaAnswer is a value of Server.clientMetas: the answer for the
// members caps and info.
type clientMetaAnswer struct {
	caps, info string
	hasInfo    bool
	facts      clientFacts
	ok         bool
}

// The bounds of Server.clientMetas: how many answers, for _meta members
// up to how long.
const (
	maxClientMetas     = 1024
	maxClientMetaBytes = 4096
)
