package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/jsonobj"
	"github.com/capvend/capvend/vend"
)

// The raw forwarder (vend.RawToolSource): a tools/call to an HTTP upstream
// on protocol 2026-07-28 is written as bytes and posted by capvend
// itself (with h1Client, or httpClient), skipping mcp-go's client and
// transport (which encode and decode the params three times, derive
// headers from a cached tool list, and decode every message twice); to a
// stdio upstream on that protocol, the request is written as one line to
// the child's stdin and its answer read off the child's stdout beside
// mcp-go's transport (stdioDemux, sendStdio), skipping mcp-go's client
// (the params encoded three times, Mcp-Param-* headers derived from the
// tool's schema for a hop that has no headers, the result decoded and
// encoded again) and its transport (the request encoded again, every
// answer decoded twice). The
// request is the one mcp-go's client would send: the same params, _meta
// (protocol version, capabilities, client info, our progress token),
// Mcp-Method, Mcp-Name, protocol version and configured headers; a progress notification on the
// response stream goes to the same router (onNotification) before the
// result is read. The result is passed on as the upstream's bytes, with
// only the hop's decorations cut out (passResult): a result mcp-go's
// client would refuse or normalise (unknown content, other _meta members)
// goes through call's decoding and encoding (resultBody) instead, so such
// results read as CallTool's. A client of capvend thus sees the
// upstream's result as a direct client would; it equals CallTool's as a
// JSON value (and byte for byte for an mcp-go upstream, whose encoding
// is the one resultBody uses).
//
// Not raw: upstreams before 2026-07-28 (their server-initiated
// elicitations are answered by the client's handler on the session),
// tools of an HTTP upstream whose schema mirrors arguments into
// Mcp-Param-* headers (x-mcp-header), and an upstream result asking for input
// (vend.ErrNotRaw: the caller runs the call through CallTool, whose
// client answers such requests; by the protocol, a round asking for input
// has not done the work yet). A request from the upstream on the call's
// stream (this protocol has none) fails the call.

var _ vend.RawToolSource = (*Manager)(nil)

// CanCallRaw reports whether t's upstream is connected on protocol
// 2026-07-28, over stdio, or over HTTP when t has no x-mcp-header
// parameters.
func (m *Manager) CanCallRaw(t vend.Item) bool {
	u := m.byName[t.Server]
	if u == nil || (u.cfg.URL != "" && bytes.Contains(t.InputSchema, []byte("x-mcp-header"))) {
		return false
	}
	_, ok := u.rawSession()
	return ok
}

// CallToolRaw runs t like CallTool, posting the request's bytes itself;
// see vend.RawToolSource.
func (m *Manager) CallToolRaw(ctx context.Context, t vend.Item, args json.RawMessage, progressToken json.RawMessage, progress func(params json.RawMessage)) (json.RawMessage, error) {
	u := m.byName[t.Server]
	if u == nil {
		return nil, fmt.Errorf("upstream %q is not configured: %w", t.Server, vend.ErrUpstream)
	}
	return u.callRaw(ctx, t.UpstreamName, args, progressToken, progress)
}

// rawSession returns the session's client when calls can be forwarded
// raw on it.
func (u *upstream) rawSession() (*client.Client, bool) {
	u.mu.Lock()
	c := u.sess
	u.mu.Unlock()
	if c == nil || !mcp.IsModernProtocol(c.ProtocolVersion()) {
		return nil, false
	}
	switch c.GetTransport().(type) {
	case *transport.StreamableHTTP, *transport.Stdio:
		return c, true
	}
	return nil, false
}

// rawMeta is the _meta mcp-go's client puts on every request on protocol
// version (the capabilities it declares: elicitation, see dial), with our
// progress token and the client's pubkey (CEP-16) if not "". Without
// either it is the same for every call of a version, so it is kept
// (metaCache).
func rawMeta(version, progressToken, clientPubkey string) (json.RawMessage, error) {
	plain := progressToken == "" && clientPubkey == ""
	if plain {
		if m, ok := metaCache.Load(version); ok {
			return m.(json.RawMessage), nil
		}
	}
	meta := map[string]any{
		mcp.MetaKeyProtocolVersion:    version,
		mcp.MetaKeyClientCapabilities: mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{}},
		mcp.MetaKeyClientInfo:         mcp.Implementation{Name: clientName, Version: "1"},
	}
	if progressToken != "" {
		meta["progressToken"] = progressToken
	}
	if clientPubkey != "" {
		meta[metaClientPubkey] = clientPubkey
	}
	b, err := json.Marshal(meta)
	if err == nil && plain {
		metaCache.Store(version, json.RawMessage(b))
	}
	return b, err
}

// metaCache holds rawMeta's answers without a token, by protocol version.
var metaCache sync.Map

// callRaw forwards one tools/call as bytes.
func (u *upstream) callRaw(ctx context.Context, name string, args, progressToken json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	c, ok := u.rawSession()
	if !ok {
		if c == nil {
			u.mu.Lock()
			down := u.sess == nil
			u.mu.Unlock()
			if down {
				return nil, fmt.Errorf("upstream %q is down: %w", u.cfg.Name, vend.ErrUpstream)
			}
		}
		return nil, vend.ErrNotRaw
	}
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	var tok string
	if progress != nil && len(progressToken) > 0 {
		var done func()
		tok, done = u.addProgressRoute(progressToken, progress)
		defer done()
	}
	version := c.ProtocolVersion()
	meta, err := rawMeta(version, tok, u.clientPubkey(ctx))
	if err != nil {
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	// The request in one buffer; the params' keys in the order mcp-go's
	// client sends them (a map, sorted), args as vend parsed them (compact).
	seq := strconv.FormatUint(u.seq.Add(1), 10)
	id := `"` + rawIDPrefix + seq + `"`
	msg := make([]byte, 0, 144+len(id)+len(meta)+len(args)+len(name))
	msg = append(msg, `{"jsonrpc":"2.0","id":`...)
	msg = append(msg, id...)
	msg = append(msg, `,"method":"tools/call","params":`...)
	msg = append(msg, `{"_meta":`...)
	msg = append(msg, meta...)
	msg = append(msg, `,"arguments":`...)
	msg = append(msg, args...)
	msg = append(msg, `,"name":`...)
	msg = jsonobj.AppendString(msg, name)
	msg = append(msg, "}}"...)

	defer u.inflight(ctx)()
	var result json.RawMessage
	if tr, ok := c.GetTransport().(*transport.Stdio); ok {
		result, err = u.sendStdio(ctx, tr, rawIDPrefix+seq, append(msg, '\n'))
	} else {
		result, err = u.post(ctx, version, name, msg, id)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("upstream %q: call %q: %w", u.cfg.Name, name, ctx.Err())
		}
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	if body, ok, err := passResult(result); ok || err != nil {
		return body, err
	}
	res, err := mcp.ParseCallToolResult(&result)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	if res.NeedsInput() {
		return nil, vend.ErrNotRaw
	}
	return u.resultBody(name, res)
}

// sendStdio writes a raw call's request line (its id unquoted) to a
// stdio upstream and waits for the answer on the session's stdioDemux, as
// mcp-go's client would (its notifications/cancelled too, when ctx ends
// first): the result; the JSON-RPC error as an error. A transport failure
// also asks the session to check the upstream (ping).
func (u *upstream) sendStdio(ctx context.Context, tr *transport.Stdio, id string, request []byte) (json.RawMessage, error) {
	d, ok := u.demuxes.Load(tr) // every stdio session has one (dial)
	if !ok {
		return nil, errors.New("the session ended")
	}
	result, rpcErr, err := d.(*stdioDemux).call(ctx, id, request)
	if err != nil {
		if ctx.Err() != nil {
			cancelStdio(ctx, tr, mcp.NewRequestId(id))
		} else {
			signal(u.check)
		}
		return nil, err
	}
	return result, rpcErr
}

// cancelStdio tells a stdio upstream that the request id was given up, as
// mcp-go's client does: best effort, off the caller's path (an upstream
// that does not read its stdin must not hold the caller up), within 5 s.
func cancelStdio(ctx context.Context, tr *transport.Stdio, id mcp.RequestId) {
	n := mcp.JSONRPCNotification{
		JSONRPC: mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{
			Method: string(mcp.MethodNotificationCancelled),
			Params: mcp.NotificationParams{AdditionalFields: map[string]any{"requestId": id, "reason": ctx.Err().Error()}},
		},
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = tr.SendNotification(ctx, n)
	}()
}

// passResult returns the upstream's result as it came, without the
// protocol's decorations of the hop (resultType "complete", _meta holding
// only serverInfo: the front adds its own), cut out of the bytes. ok
// false: the result needs the slow reading, which normalises it or
// refuses it (no content array, a content item whose type mcp-go does not
// know, a _meta with other members, another resultType, names the bytes
// do not show as they decode); ErrNotRaw: the result asks for input.
func passResult(result json.RawMessage) (json.RawMessage, bool, error) {
	ms, ok := jsonobj.Members(result)
	if !ok {
		return nil, false, nil
	}
	var cut []int
	content := false
	for i, m := range ms {
		v := result[m.ValueStart:m.End]
		switch m.Key {
		case "content":
			if content = knownContent(v); !content {
				return nil, false, nil
			}
			continue
		case "resultType":
			switch mcp.ResultType(unquote(v)) {
			case mcp.ResultTypeComplete:
			case mcp.ResultTypeInputRequired:
				return nil, false, vend.ErrNotRaw
			default:
				return nil, false, nil
			}
		case "_meta":
			inner, ok := jsonobj.Members(v)
			if !ok || len(inner) > 1 || (len(inner) == 1 && inner[0].Key != mcp.MetaKeyServerInfo) {
				return nil, false, nil
			}
		default:
			continue
		}
		cut = append(cut, i)
	}
	if !content {
		return nil, false, nil
	}
	return jsonobj.Without(result, ms, cut...), true, nil
}

// knownContent reports whether v is an array of objects whose "type" is
// one mcp-go's client reads as it is.
func knownContent(v []byte) bool {
	es, ok := jsonobj.Elements(v)
	if !ok {
		return false
	}
	for _, e := range es {
		item := v[e[0]:e[1]]
		ms, ok := jsonobj.Members(item)
		if !ok {
			return false
		}
		known := false
		for _, m := range ms {
			if m.Key == "type" {
				switch unquote(item[m.ValueStart:m.End]) {
				case "text", "image", "audio", "resource_link", "resource":
					known = true
				}
			}
		}
		if !known {
			return false
		}
	}
	return true
}

// unquote returns a JSON string's text if it has no escapes; "" for
// anything else.
func unquote(v []byte) string {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' || bytes.IndexByte(v, '\\') >= 0 {
		return ""
	}
	return string(v[1 : len(v)-1])
}

// post sends msg (a tools/call of name, id) to the upstream as mcp-go's transport
// does on protocol version (headers included) and returns the result of
// its response: a JSON body, or the response event of an SSE stream,
// whose notifications go to onNotification first, in order. A transport
// failure also asks the session to check the upstream (ping).
func (u *upstream) post(ctx context.Context, version, name string, msg []byte, id string) (json.RawMessage, error) {
	h := u.h1Client()
	if h != nil && h.line != "" {
		header, setsName, ok := u.plainHeader(version)
		nameValue := ""
		if ok && mcp.RequiresStandardHeaders(version) && !setsName && name != "" {
			if v, enc := mcp.EncodeHeaderValue(name); enc {
				nameValue, ok = v, plainHeaderValue(v)
			}
		}
		if ok {
			return u.postPlain(ctx, h, header, nameValue, msg, id)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.cfg.URL, bytes.NewReader(msg))
	if err != nil {
		return nil, err
	}
	u.setHeaders(req.Header, version)
	// mcp.StandardHeaders for a tools/call of name, without reading the
	// params again.
	if mcp.RequiresStandardHeaders(version) && req.Header.Get(mcp.HeaderName) == "" {
		if v, ok := mcp.EncodeHeaderValue(name); ok && name != "" {
			req.Header.Set(mcp.HeaderName, v)
		}
	}
	var resp *http.Response
	if h != nil {
		resp, err = h.do(req)
	} else {
		resp, err = httpClient.Do(req)
	}
	if err != nil {
		signal(u.check)
		return nil, err
	}
	return u.readResponse(resp, id)
}

// postPlain is post through h.postPlain (see there for header and
// nameValue).
func (u *upstream) postPlain(ctx context.Context, h *h1Client, header []byte, nameValue string, msg []byte, id string) (json.RawMessage, error) {
	a, err := h.postPlain(ctx, header, nameValue, msg)
	if err != nil {
		signal(u.check)
		return nil, err
	}
	if a.fast {
		return responseResult(a.body, id)
	}
	return u.readResponse(a.resp, id)
}

// setHeaders sets on h the headers of a tools/call on protocol version
// but Mcp-Name: those mcp-go's transport sets, then the configured ones.
func (u *upstream) setHeaders(h http.Header, version string) {
	if mcp.RequiresStandardHeaders(version) {
		h.Set(mcp.HeaderMethod, string(mcp.MethodToolsCall))
	}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json, text/event-stream")
	h.Set(transport.HeaderKeyProtocolVersion, version)
	for k, v := range u.cfg.Headers {
		h.Set(k, v)
	}
}

// plainHeader is setHeaders' header for version as postPlain writes it
// (headerBlock), kept per version; setsName: the configuration sets
// Mcp-Name. ok false: the request goes through http.Request.
func (u *upstream) plainHeader(version string) (block []byte, setsName, ok bool) {
	if v, found := u.plainHeaders.Load(version); found {
		p := v.(plainHeader)
		return p.block, p.setsName, p.ok
	}
	h := http.Header{}
	u.setHeaders(h, version)
	var p plainHeader
	_, p.setsName = h[mcp.HeaderName]
	p.block, p.ok = headerBlock(h)
	u.plainHeaders.Store(version, p)
	return p.block, p.setsName, p.ok
}

// plainHeader is a value of upstream.plainHeaders.
type plainHeader struct {
	block    []byte
	setsName bool
	ok       bool
}

// readResponse returns the result of the response to id (see post) and
// closes its body.
func (u *upstream) readResponse(resp *http.Response, id string) (json.RawMessage, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("request failed with status %d: %s", resp.StatusCode, b)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch mt {
	case "application/json":
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			signal(u.check)
			return nil, err
		}
		return responseResult(b, id)
	case "text/event-stream":
		return u.readEvents(resp.Body, id)
	}
	return nil, fmt.Errorf("unexpected content type: %s", resp.Header.Get("Content-Type"))
}

// responseResult returns the result of a JSON-RPC response to id; its
// error as an error. The usual answer (plainAnswer) is read off the
// bytes.
func responseResult(b []byte, id string) (json.RawMessage, error) {
	if json.Valid(b) {
		if rid, result, ok := plainAnswer(b); ok && string(rid) == id {
			return result, nil
		}
	}
	return decodeResponse(b, id)
}

// plainAnswer returns the id and result of the JSON-RPC response b (valid
// JSON) when its members are only jsonrpc, id and result, as written:
// json.Unmarshal would give the same id and result bytes. ok is false
// for any other member (an error, or a name the decoder may match
// without regard to case), a repeated name or an escaped one: the caller
// decodes b then.
func plainAnswer(b []byte) (id, result json.RawMessage, ok bool) {
	ms, ok := jsonobj.Members(b)
	if !ok {
		return nil, nil, false
	}
	for _, m := range ms {
		switch m.Key {
		case "jsonrpc":
		case "id":
			id = b[m.ValueStart:m.End]
		case "result":
			result = b[m.ValueStart:m.End]
		default:
			return nil, nil, false
		}
	}
	return id, result, id != nil && result != nil
}

// decodeResponse is responseResult through json.Unmarshal.
func decodeResponse(b []byte, id string) (json.RawMessage, error) {
	var r struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *mcp.JSONRPCErrorDetails
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("failed to decode response: %w", err)
	}
	if string(r.ID) != id {
		return nil, fmt.Errorf("response to %s, not to %s", r.ID, id)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("upstream error %d: %s", r.Error.Code, r.Error.Message)
	}
	return r.Result, nil
}

// readEvents reads an SSE response stream until the response to id:
// notifications go to onNotification, as the transport would pass them.
// A request from the upstream (none exist on this protocol) ends the call
// with an error.
func (u *upstream) readEvents(body io.Reader, id string) (json.RawMessage, error) {
	br := bufio.NewReader(body)
	var data []byte
	for {
		line, err := br.ReadBytes('\n')
		if err != nil && (err != io.EOF || len(line) == 0) {
			if err == io.EOF {
				err = errors.New("stream ended without a response")
			} else {
				signal(u.check)
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) > 0 {
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				if len(data) > 0 {
					data = append(data, '\n')
				}
				data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
			}
			if err == nil {
				continue
			}
		}
		if len(data) == 0 {
			continue
		}
		msg := data
		data = nil
		var probe struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(msg, &probe) != nil {
			continue // as the transport: skipped
		}
		switch {
		case len(probe.ID) == 0 || string(probe.ID) == "null":
			var n mcp.JSONRPCNotification
			if json.Unmarshal(msg, &n) == nil {
				u.onNotification(n)
			}
		case probe.Method != "":
			return nil, fmt.Errorf("upstream sent a %s request on the call's stream", probe.Method)
		default:
			return responseResult(msg, id)
		}
	}
}

// h1Client returns the upstream's h1Client; nil if its calls go through
// httpClient (see newH1Client).
func (u *upstream) h1Client() *h1Client {
	u.h1Once.Do(func() { u.h1 = newH1Client(u.cfg.URL) })
	return u.h1
}

// httpClient is the HTTP client of every HTTP upstream session. It keeps
// up to maxIdlePerUpstream idle connections per upstream: with
// http.DefaultTransport's 2, concurrent calls to one upstream open and
// close a TCP connection for nearly every call.
var httpClient = &http.Client{Transport: func() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = maxIdlePerUpstream
	return t
}()}

// maxIdlePerUpstream bounds the idle connections kept to one upstream.
const maxIdlePerUpstream = 64
