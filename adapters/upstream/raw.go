package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// The raw forwarder (vend.RawToolSource): a tools/call to an HTTP upstream
// on protocol 2026-07-28 is written as bytes and posted through the
// session's transport, skipping mcp-go's client layers (which encode and
// decode the params three times and derive headers from a cached tool
// list). The request is the one the client would send: the same params,
// _meta (protocol version, capabilities, client info, our progress
// token), Mcp-Method and Mcp-Name headers. The result goes through the
// same decoding and encoding as call's (rawResultBody), so the bytes are
// the same. Only the request side is raw.
//
// Not raw: stdio upstreams, upstreams before 2026-07-28 (their server-
// initiated elicitations are answered by the client's handler on the
// session), tools whose schema mirrors arguments into Mcp-Param-*
// headers (x-mcp-header), and an upstream result asking for input
// (vend.ErrNotRaw: the caller runs the call through CallTool, whose
// client answers such requests; by the protocol, a round asking for input
// has not done the work yet).

var _ vend.RawToolSource = (*Manager)(nil)

// CanCallRaw reports whether t's upstream is an HTTP upstream connected on
// protocol 2026-07-28 and t has no x-mcp-header parameters.
func (m *Manager) CanCallRaw(t vend.Tool) bool {
	u := m.byName[t.Server]
	if u == nil || u.cfg.URL == "" || bytes.Contains(t.InputSchema, []byte("x-mcp-header")) {
		return false
	}
	_, ok := u.rawSession()
	return ok
}

// CallToolRaw runs t like CallTool, posting the request's bytes itself;
// see vend.RawToolSource.
func (m *Manager) CallToolRaw(ctx context.Context, t vend.Tool, args json.RawMessage, progressToken json.RawMessage, progress func(params json.RawMessage)) (json.RawMessage, error) {
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
	if _, ok := c.GetTransport().(*transport.StreamableHTTP); !ok {
		return nil, false
	}
	return c, true
}

// rawMeta is the _meta mcp-go's client puts on every request on protocol
// version (the capabilities it declares: elicitation, see dial), with our
// progress token if not "". Without a token it is the same for every call
// of a version, so it is kept (metaCache).
func rawMeta(version string, progressToken string) (json.RawMessage, error) {
	if progressToken == "" {
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
	b, err := json.Marshal(meta)
	if err == nil && progressToken == "" {
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
		tok = "capvend-" + strconv.FormatUint(u.seq.Add(1), 10)
		route := &progressRoute{callerToken: progressToken, fn: progress}
		u.progressMu.Lock()
		u.progress[tok] = route
		u.progressMu.Unlock()
		defer func() {
			u.progressMu.Lock()
			delete(u.progress, tok)
			u.progressMu.Unlock()
			route.mu.Lock()
			route.done = true
			route.mu.Unlock()
		}()
	}
	version := c.ProtocolVersion()
	meta, err := rawMeta(version, tok)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	nameJSON, _ := json.Marshal(name)
	// The keys in the order mcp-go's client sends them (a map, sorted);
	// the transport's encoding compacts args, as the client's does.
	params := make([]byte, 0, 64+len(meta)+len(args)+len(nameJSON))
	params = append(params, `{"_meta":`...)
	params = append(params, meta...)
	params = append(params, `,"arguments":`...)
	params = append(params, args...)
	params = append(params, `,"name":`...)
	params = append(params, nameJSON...)
	params = append(params, '}')

	header := http.Header{}
	for k, v := range mcp.StandardHeaders(version, mcp.MethodToolsCall, params) {
		header.Set(k, v)
	}
	req := transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION,
		ID:      mcp.NewRequestId("capvend-raw-" + strconv.FormatUint(u.seq.Add(1), 10)),
		Method:  string(mcp.MethodToolsCall),
		Params:  json.RawMessage(params),
		Header:  header,
	}
	defer u.inflight(ctx)()
	resp, err := c.GetTransport().SendRequest(ctx, req)
	if err == nil && resp.Error != nil {
		err = resp.Error.AsError()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("upstream %q: call %q: %w", u.cfg.Name, name, ctx.Err())
		}
		if resp == nil {
			err = transport.NewError(err)
			signal(u.check)
		}
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	res, err := mcp.ParseCallToolResult(&resp.Result)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	if res.NeedsInput() {
		return nil, vend.ErrNotRaw
	}
	return u.resultBody(name, res)
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
