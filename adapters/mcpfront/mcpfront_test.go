package mcpfront

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

var update = flag.Bool("update", false, "rewrite golden files")

// waitLimit bounds waits for events; a deadlock guard, not a speed check.
const waitLimit = 30 * time.Second

// fakeVendor answers by tool name and records the requests it got.
type fakeVendor struct {
	mu    sync.Mutex
	calls []vend.CallRequest
}

var fakeTools = []vend.Item{
	{Name: "free", Description: "costs nothing", InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
		Annotations: json.RawMessage(`{"readOnlyHint":true,"title":"Free"}`)},
	{Name: "paid", Title: "Paid echo", Description: "costs 21 sats", Price: 21000},
	{Name: "ranged", Description: "10 to 50 sats", Price: 10000},
	{Name: "explicit", Price: 5000},
	{Name: "pending", Price: 5000},
	{Name: "invalid", Price: 1000},
	{Name: "unknown"},
	{Name: "expired", Price: 1},
	{Name: "failed", Price: 1},
	{Name: "nomethod", Price: 1},
	{Name: "limit", Price: 1},
	{Name: "upstream", Price: 1},
	{Name: "boom"},
	{Name: "iserror"},
}

func (f *fakeVendor) Tools() []vend.Item { return fakeTools }

func (f *fakeVendor) ListedPrice(t vend.Item) (lo, hi vend.Msat) {
	if t.Name == "ranged" {
		return 10000, 50000
	}
	return t.Price, t.Price
}

// leaky wraps a sentinel with details that must never reach a client.
func leaky(err error) error {
	return fmt.Errorf("/home/op/capvend/vend/engine.go:42: payment_hash=deadbeef preimage=cafebabe: %w", err)
}

func (f *fakeVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	f.mu.Lock()
	rr := r
	rr.Notify = nil
	f.calls = append(f.calls, rr)
	f.mu.Unlock()
	switch r.Name {
	case "free", "ranged":
		txt, _ := json.Marshal("free " + string(r.Arguments))
		return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":` + string(txt) + `}],"structuredContent":{"big":12345678901234567890}}`)}, nil
	case "paid":
		r.Notify(vend.NotifyPaymentRequired, map[string]any{"amount": 21, "pay_req": "lnbcrt210n1fake", "pmi": vend.PMILightning, "description": "paid echo call", "ttl": 600})
		r.Notify(vend.NotifyPaymentAccepted, map[string]any{"amount": 21, "pmi": vend.PMILightning, "_meta": map[string]any{"payment_hash": "ab"}})
		return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"paid:hi"}]}`)}, nil
	case "explicit":
		if !r.Explicit {
			return vend.CallResult{}, errors.New("expected explicit gating")
		}
		pr := &vend.PaymentRequiredError{Options: []vend.PaymentOption{
			{Amount: 5, PayReq: "lnbcrt50n1fake", PMI: vend.PMILightning, Description: "explicit call", TTL: 600},
			{Amount: 5, PMI: vend.PMICashu, Description: "explicit call", TTL: 600},
		}, Amount: 5000, Invoice: "lnbcrt50n1fake", ExpiresAt: fakeExpiry}
		if r.PaymentTokens { // as vend: a token only when the front hands them out
			pr.Token = fakeToken
		}
		return vend.CallResult{}, fmt.Errorf("quote q1: %w", pr)
	case "pending":
		tok := r.PaymentToken
		var args map[string]any
		if json.Unmarshal(r.Arguments, &args) == nil && tok == "" { // vend takes it out of the arguments
			tok, _ = args[vend.PaymentArg].(string)
		}
		return vend.CallResult{}, &vend.PaymentPendingError{RetryAfter: 5, Token: tok, ExpiresAt: fakeExpiry}
	case "invalid":
		return vend.CallResult{}, &vend.InvalidParamsError{Tool: r.Name, Reason: "text: is required"}
	case "unknown":
		return vend.CallResult{}, leaky(vend.ErrUnknownTool)
	case "expired":
		return vend.CallResult{}, leaky(vend.ErrPaymentExpired)
	case "failed":
		return vend.CallResult{}, leaky(vend.ErrPaymentFailed)
	case "nomethod":
		return vend.CallResult{}, leaky(vend.ErrNoPaymentMethod)
	case "limit":
		return vend.CallResult{}, leaky(vend.ErrLimit)
	case "upstream":
		return vend.CallResult{}, leaky(vend.ErrUpstream)
	case "iserror":
		return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"tool failed"}],"isError":true}`), IsError: true}, nil
	default:
		return vend.CallResult{}, leaky(errors.New("database is locked"))
	}
}

// fakeExpiry and fakeToken are the invoice expiry and payment token of the
// fake explicit-gating answers.
var (
	fakeExpiry = time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	fakeToken  = "cvp_0123456789abcdef0123456789abcdef01234567"
)

// payingInit is the initialize of a capvend-aware client: it declares
// that it handles payment notifications (CapabilityPayments).
func payingInit() mcp.InitializeRequest {
	var r mcp.InitializeRequest
	r.Params.Capabilities.Experimental = map[string]any{CapabilityPayments: map[string]any{}}
	return r
}

func (f *fakeVendor) last() vend.CallRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

func newServer(t *testing.T, cfg Config) (*Server, *fakeVendor) {
	t.Helper()
	fv := &fakeVendor{}
	cfg.Vendor = fv
	return newServerOf(t, cfg), fv
}

// newServerOf is New(cfg) with a silent logger.
func newServerOf(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func startHTTP(t *testing.T, s *Server) string {
	mux := http.NewServeMux()
	mux.Handle("/mcp", s.Handler())
	ts := httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	return ts.URL + "/mcp"
}

// golden compares got with testdata/golden/name, rewriting it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Indent(&buf, got, "", "  "); err != nil {
		t.Fatalf("%s: not JSON: %s", name, got)
	}
	buf.WriteByte('\n')
	path := filepath.Join("testdata", "golden", name+".json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("%s differs from golden:\n got: %s\nwant: %s", name, buf.Bytes(), want)
	}
}

// notes collects notification methods a client received.
type notes struct {
	mu      sync.Mutex
	methods []string
	params  []json.RawMessage
	ch      chan string
}

func newNotes() *notes { return &notes{ch: make(chan string, 100)} }

func (n *notes) add(note mcp.JSONRPCNotification) {
	p, _ := json.Marshal(note.Params)
	n.mu.Lock()
	n.methods = append(n.methods, note.Method)
	n.params = append(n.params, p)
	n.mu.Unlock()
	n.ch <- note.Method
}

func (n *notes) payment() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, m := range n.methods {
		if strings.HasPrefix(m, "notifications/payment_") {
			out = append(out, m)
		}
	}
	return out
}

func checkListedTools(t *testing.T, c *client.Client) {
	t.Helper()
	res, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]mcp.Tool{}
	for _, tl := range res.Tools {
		byName[tl.Name] = tl
	}
	if len(byName) != len(fakeTools) {
		t.Fatalf("listed %d tools, want %d", len(byName), len(fakeTools))
	}
	price := func(name string) string {
		tl := byName[name]
		if tl.Meta == nil {
			return ""
		}
		b, _ := json.Marshal(tl.Meta.AdditionalFields[MetaPrice])
		return string(b)
	}
	for name, want := range map[string]string{
		"free":    "",
		"paid":    `{"amount":21,"unit":"sats"}`,
		"ranged":  `{"amount":10,"max_amount":50,"unit":"sats"}`,
		"expired": `{"amount":1,"unit":"sats"}`, // 1 msat rounds up
	} {
		if got := price(name); got != want {
			t.Errorf("%s price meta %s, want %s", name, got, want)
		}
	}
	free := byName["free"]
	if free.Description != "costs nothing" || free.InputSchema.Required[0] != "text" ||
		free.Annotations.ReadOnlyHint == nil || !*free.Annotations.ReadOnlyHint || free.Annotations.Title != "Free" {
		t.Errorf("free tool listed as %+v", free)
	}
	if byName["paid"].Title != "Paid echo" {
		t.Errorf("paid title %q", byName["paid"].Title)
	}
}

func callText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("content %+v", res.Content)
	}
	tc, ok := res.Content[0].(mcp.TextContent)
	if !ok {
		t.Fatalf("content %T", res.Content[0])
	}
	return tc.Text
}

// clientSuite runs the checks every transport must pass with a real mcp-go
// client.
func clientSuite(t *testing.T, c *client.Client, n *notes, fv *fakeVendor, transportName string) {
	ctx := context.Background()
	checkListedTools(t, c)

	t.Run("free", func(t *testing.T) {
		req := mcp.CallToolRequest{}
		req.Params.Name = "free"
		req.Params.Arguments = map[string]any{"text": "hi"}
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if got := callText(t, res); got != `free {"text":"hi"}` {
			t.Errorf("text %q", got)
		}
		if b, _ := json.Marshal(res.StructuredContent); !strings.Contains(string(b), "big") {
			t.Errorf("structuredContent %s", b)
		}
		got := fv.last()
		if got.Transport != transportName || got.Client == "" || got.RequestID == "" || got.Explicit || got.ProgressToken != nil {
			t.Errorf("call request %+v", got)
		}
	})

	t.Run("paid with notifications", func(t *testing.T) {
		req := mcp.CallToolRequest{}
		req.Params.Name = "paid"
		req.Params.Meta = &mcp.Meta{ProgressToken: "p1", AdditionalFields: map[string]any{vend.MetaCashuToken: "cashuBxyz", MetaPMI: []any{vend.PMICashu}}}
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if got := callText(t, res); got != "paid:hi" {
			t.Errorf("text %q", got)
		}
		// Both transports deliver a call's notifications before its result.
		got := n.payment()
		if want := []string{vend.NotifyPaymentRequired, vend.NotifyPaymentAccepted}; strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("notifications %v, want %v", got, want)
		}
		cr := fv.last()
		if string(cr.ProgressToken) != `"p1"` || cr.CashuToken != "cashuBxyz" || len(cr.PMIs) != 1 || cr.PMIs[0] != vend.PMICashu || string(cr.Arguments) != `{}` {
			t.Errorf("call request %+v", cr)
		}
	})

	t.Run("iserror kept", func(t *testing.T) {
		req := mcp.CallToolRequest{}
		req.Params.Name = "iserror"
		res, err := c.CallTool(ctx, req)
		if err != nil || !res.IsError || callText(t, res) != "tool failed" {
			t.Fatalf("res %+v err %v", res, err)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			tool string
			is   error
			text string
		}{
			{"invalid", mcp.ErrInvalidParams, "Invalid params: text: is required"},
			{"unknown", mcp.ErrInvalidParams, "Unknown tool: unknown"},
			{"expired", nil, "Payment expired"},
			{"upstream", nil, "Upstream server failed"},
			{"boom", mcp.ErrInternalError, "Internal error"},
		} {
			req := mcp.CallToolRequest{}
			req.Params.Name = tc.tool
			_, err := c.CallTool(ctx, req)
			if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("%s: err %v", tc.tool, err)
			}
			if err != nil && (strings.Contains(err.Error(), "deadbeef") || strings.Contains(err.Error(), "/home")) {
				t.Errorf("%s: leaks: %v", tc.tool, err)
			}
		}
		// Explicit gating asked for in _meta is a tool result, not
		// -32042 (MCP's URLElicitationRequired code).
		req := mcp.CallToolRequest{}
		req.Params.Name = "explicit"
		req.Params.Meta = &mcp.Meta{AdditionalFields: map[string]any{MetaPaymentInteraction: ExplicitGating}}
		res, err := c.CallTool(ctx, req)
		if err != nil || !res.IsError || !strings.Contains(callText(t, res), "lnbcrt50n1fake") {
			t.Errorf("explicit: %+v %v", res, err)
		} else if b, _ := json.Marshal(res.StructuredContent); !strings.Contains(string(b), `"capvend_payment":"`+fakeToken+`"`) {
			t.Errorf("explicit: structuredContent %s", b)
		}
		if !fv.last().Explicit {
			t.Error("explicit not passed on")
		}
	})
}

// statusRecorder records the HTTP status of each tools/call by tool name.
type statusRecorder struct {
	mu     sync.Mutex
	status map[string]int
}

func (sr *statusRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	var m struct {
		Params struct{ Name string } `json:"params"`
	}
	if err == nil && json.Unmarshal(body, &m) == nil && m.Params.Name != "" {
		sr.mu.Lock()
		sr.status[m.Params.Name] = resp.StatusCode
		sr.mu.Unlock()
	}
	return resp, err
}

func TestHTTPWithMCPGoClient(t *testing.T) {
	s, fv := newServer(t, Config{})
	url := startHTTP(t, s)
	rec := &statusRecorder{status: map[string]int{}}
	c, err := client.NewStreamableHttpClient(url, transport.WithHTTPBasicClient(&http.Client{Transport: rec}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := newNotes()
	c.OnNotification(n.add)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, payingInit()); err != nil {
		t.Fatal(err)
	}
	if !mcp.IsModernProtocol(c.ProtocolVersion()) {
		t.Fatalf("protocol %s", c.ProtocolVersion())
	}
	clientSuite(t, c, n, fv, TransportHTTP)
	if got := fv.last().Client; got != anonClient {
		t.Errorf("client id %q without session", got)
	}
	// Protocol 2026-07-28 maps -32602 to HTTP 400, as mcp-go does for its
	// own errors.
	rec.mu.Lock()
	for tool, want := range map[string]int{"invalid": 400, "unknown": 400, "upstream": 200, "free": 200, "paid": 200} {
		if got := rec.status[tool]; got != want {
			t.Errorf("%s: HTTP %d, want %d", tool, got, want)
		}
	}
	rec.mu.Unlock()

	t.Run("list_changed on Refresh", func(t *testing.T) {
		stop, err := c.ListenAsync(ctx, mcp.SubscriptionFilter{ToolsListChanged: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		waitListChanged(t, s, n)
	})
}

func TestCloseStreams(t *testing.T) {
	s, _ := newServer(t, Config{})
	url := startHTTP(t, s)
	ctx := context.Background()
	modern, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	defer modern.Close()
	if err := modern.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := modern.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	n := newNotes()
	modern.OnNotification(n.add)
	listened := make(chan error, 1)
	go func() { listened <- modern.Listen(ctx, mcp.SubscriptionFilter{ToolsListChanged: true}) }()
	waitListChanged(t, s, n) // the stream is open
	s.CloseStreams()
	select {
	case <-listened:
	case <-time.After(waitLimit):
		t.Fatal("listen stream still open after CloseStreams")
	}
	// Calls still work.
	req := mcp.CallToolRequest{}
	req.Params.Name = "free"
	if _, err := modern.CallTool(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// waitListChanged calls Refresh until the client got a list_changed: the
// client's listen stream is opened asynchronously, so the first Refresh
// may come before it.
func waitListChanged(t *testing.T, s *Server, n *notes) {
	t.Helper()
	deadline := time.After(waitLimit)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case m := <-n.ch:
			if m == string(mcp.MethodNotificationToolsListChanged) {
				return
			}
		case <-tick.C:
			s.Refresh()
		case <-deadline:
			t.Fatal("no tools/list_changed")
		}
	}
}

func TestHTTPLegacyClientWithGETStream(t *testing.T) {
	s, fv := newServer(t, Config{ClientID: func(*http.Request) string { return "unused" }})
	url := startHTTP(t, s)
	//lint:ignore SA1019 the test speaks the legacy protocol (sessions, the standalone GET stream) on purpose
	tr, err := transport.NewStreamableHTTP(url, transport.WithContinuousListening())
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr)
	defer c.Close()
	n := newNotes()
	c.OnNotification(n.add)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, payingInit()); err != nil {
		t.Fatal(err)
	}
	if mcp.IsModernProtocol(c.ProtocolVersion()) {
		t.Fatalf("protocol %s", c.ProtocolVersion())
	}
	waitListChanged(t, s, n) // over the GET stream
	req := mcp.CallToolRequest{}
	req.Params.Name = "free"
	if _, err := c.CallTool(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := fv.last().Client; got != c.GetSessionId() || !strings.HasPrefix(got, "mcp-session-") {
		t.Errorf("client %q, session %q", got, c.GetSessionId())
	}
	// Payment notifications go on the call's POST stream, not the GET
	// stream, so they are in before the result.
	req.Params.Name = "paid"
	if _, err := c.CallTool(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := n.payment(); len(got) != 2 {
		t.Errorf("notifications %v", got)
	}
}

func TestStdioWithMCPGoClient(t *testing.T) {
	s, fv := newServer(t, Config{})
	c, stop := startStdio(t, s)
	defer stop()
	n := newNotes()
	c.OnNotification(n.add)
	if _, err := c.Initialize(context.Background(), payingInit()); err != nil {
		t.Fatal(err)
	}
	clientSuite(t, c, n, fv, TransportStdio)
	if got := fv.last().Client; got != stdioClient {
		t.Errorf("client %q", got)
	}
}

// startStdio serves s over in-memory pipes to a started mcp-go client.
func startStdio(t *testing.T, s *Server, opts ...client.ClientOption) (*client.Client, func()) {
	t.Helper()
	c2sR, c2sW := io.Pipe()
	s2cR, s2cW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeStdio(ctx, c2sR, s2cW) }()
	c := client.NewClient(transport.NewIO(s2cR, c2sW, nil), opts...)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c, func() {
		_ = c.Close()
		cancel()
		c2sW.Close()
		select {
		case <-done:
		case <-time.After(waitLimit):
			t.Error("ServeStdio did not return")
		}
		s2cW.Close()
	}
}

// rawSession is a hand-driven legacy (2025-11-25) Streamable HTTP session,
// to see the exact bytes.
type rawSession struct {
	t   *testing.T
	url string
	sid string
}

func newRawSession(t *testing.T, url string) *rawSession {
	r := &rawSession{t: t, url: url}
	msgs, resp := r.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if len(msgs) != 1 || resp.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %s", msgs)
	}
	r.sid = resp.Header.Get("Mcp-Session-Id")
	r.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return r
}

// post sends body, with the headers h (name, value, ...) if any, and
// returns the JSON-RPC messages of the answer (JSON or SSE).
func (r *rawSession) post(body string, h ...string) ([]json.RawMessage, *http.Response) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if r.sid != "" {
		req.Header.Set("Mcp-Session-Id", r.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	for i := 0; i+1 < len(h); i += 2 {
		req.Header.Set(h[i], h[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var msgs []json.RawMessage
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				msgs = append(msgs, json.RawMessage(d))
			}
		}
	} else {
		b, _ := io.ReadAll(resp.Body)
		if len(bytes.TrimSpace(b)) > 0 {
			msgs = append(msgs, bytes.TrimSpace(b))
		}
	}
	return msgs, resp
}

func call(id, tool, extra string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + tool + `"` + extra + `}}`
}

func TestHTTPWireGolden(t *testing.T) {
	s, fv := newServer(t, Config{})
	r := newRawSession(t, startHTTP(t, s))

	for _, tc := range []struct{ name, tool, extra string }{
		{"invalid_params", "invalid", ``},
		{"unknown_tool", "unknown", ``},
		{"payment_required", "explicit", ``}, // a client without the capability
		{"payment_required_asked", "explicit", `,"_meta":{"capvend/payment_interaction":"explicit_gating"}`},
		{"payment_pending", "pending", `,"arguments":{"capvend_payment":"` + fakeToken + `"}`},
		{"payment_expired", "expired", ``},
		{"payment_failed", "failed", ``},
		{"no_payment_method", "nomethod", ``},
		{"limit", "limit", ``},
		{"upstream", "upstream", ``},
		{"internal", "boom", ``},
		{"result_verbatim", "free", `,"arguments":{"text":"hi"}`},
		{"result_is_error", "iserror", ``},
		{"paid_stream", "paid", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, resp := r.post(call(`"id-`+tc.name+`"`, tc.tool, tc.extra))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			all, _ := json.Marshal(msgs)
			for _, bad := range []string{"deadbeef", "cafebabe", "/home", "engine.go", "capvend-error", "capvend/verbatim"} {
				if bytes.Contains(all, []byte(bad)) {
					t.Errorf("answer contains %q: %s", bad, all)
				}
			}
			golden(t, "http_"+tc.name, all)
		})
	}

	t.Run("request fields", func(t *testing.T) {
		r.post(call(`7`, "free", `,"arguments":{"n":12345678901234567890,"s":"x"},"_meta":{"progressToken":3,"capvend/cashu":"cashuAabc","capvend/refund_invoice":"lnbcrt1refund"}`))
		got := fv.last()
		if got.RequestID != `7` || got.Client != r.sid || got.Transport != TransportHTTP ||
			string(got.Arguments) != `{"n":12345678901234567890,"s":"x"}` || string(got.ProgressToken) != `3` || got.CashuToken != "cashuAabc" ||
			got.RefundInvoice != "lnbcrt1refund" {
			t.Errorf("%+v", got)
		}
		r.post(call(`"7"`, "free", ``))
		if got := fv.last(); got.RequestID != `"7"` || string(got.Arguments) != `{}` {
			t.Errorf("%+v", got)
		}
	})
}

func TestHTTPServerWideExplicit(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		s, fv := newServer(t, Config{ExplicitGating: true, LegacyGatingCode: legacy})
		r := newRawSession(t, startHTTP(t, s))
		msgs, _ := r.post(call(`1`, "explicit", ``))
		want := `"isError":true`
		if legacy {
			want = `"code":-32042`
		}
		if len(msgs) != 1 || !bytes.Contains(msgs[0], []byte(want)) || !fv.last().Explicit {
			t.Fatalf("legacy %v: %s", legacy, msgs)
		}
	}
}

// TestHTTPLegacyGatingWireGolden: with payments.legacy_gating_code the
// old form stays: explicit gating only when asked, -32042 / -32043.
func TestHTTPLegacyGatingWireGolden(t *testing.T) {
	s, fv := newServer(t, Config{LegacyGatingCode: true})
	r := newRawSession(t, startHTTP(t, s))
	for _, tc := range []struct{ name, tool, extra string }{
		{"payment_required", "explicit", `,"_meta":{"capvend/payment_interaction":"explicit_gating"}`},
		{"payment_pending", "pending", ``},
	} {
		msgs, _ := r.post(call(`"id-`+tc.name+`"`, tc.tool, tc.extra))
		all, _ := json.Marshal(msgs)
		golden(t, "http_legacy_"+tc.name, all)
		if got := fv.last(); got.PaymentTokens {
			t.Errorf("%s: payment tokens asked for under legacy gating", tc.name)
		}
	}
	r.post(call(`1`, "free", ``))
	if fv.last().Explicit {
		t.Error("legacy gating made a client without the capability explicit")
	}
}

func TestHTTPMaxBody(t *testing.T) {
	s, _ := newServer(t, Config{MaxBodyBytes: 1024})
	url := startHTTP(t, s)
	body := call(`1`, "free", `,"arguments":{"text":"`+strings.Repeat("x", 2048)+`"}`)
	for _, chunked := range []bool{false, true} {
		var rd io.Reader = strings.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // hides the length: chunked encoding
		}
		req, _ := http.NewRequest(http.MethodPost, url, rd)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked=%v: status %d", chunked, resp.StatusCode)
		}
	}
}

func TestStdioWireGolden(t *testing.T) {
	s, _ := newServer(t, Config{})
	//lint:ignore SA1019 the test speaks the legacy protocol (sessions, the standalone GET stream) on purpose
	c, stop := startStdio(t, s, client.WithLegacyProtocolOnly())
	defer stop()
	if _, err := c.Initialize(context.Background(), mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, tool string }{
		{"payment_required", "explicit"},
		{"payment_pending", "pending"},
		{"upstream", "upstream"},
		{"result_verbatim", "free"},
	} {
		resp, err := c.GetTransport().SendRequest(context.Background(), transport.JSONRPCRequest{
			JSONRPC: "2.0", ID: mcp.NewRequestId("id-" + tc.name), Method: "tools/call",
			Params: map[string]any{"name": tc.tool},
		})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(resp)
		golden(t, "stdio_"+tc.name, b)
	}
	n := newNotes()
	c.OnNotification(n.add)
	waitListChanged(t, s, n)
}

// TestStdioLegacyGatingWireGolden: over stdio too, legacy gating keeps
// the old -32043 bytes (the golden file is the one before payment tokens).
func TestStdioLegacyGatingWireGolden(t *testing.T) {
	s, _ := newServer(t, Config{LegacyGatingCode: true})
	//lint:ignore SA1019 the test speaks the legacy protocol (sessions, the standalone GET stream) on purpose
	c, stop := startStdio(t, s, client.WithLegacyProtocolOnly())
	defer stop()
	if _, err := c.Initialize(context.Background(), mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.GetTransport().SendRequest(context.Background(), transport.JSONRPCRequest{
		JSONRPC: "2.0", ID: mcp.NewRequestId("id-payment_pending"), Method: "tools/call",
		Params: map[string]any{"name": "pending"},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(resp)
	golden(t, "stdio_legacy_payment_pending", b)
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("nil vendor accepted")
	}
	if _, err := New(Config{Vendor: &fakeVendor{}, MaxBodyBytes: -1}); err == nil {
		t.Error("negative body limit accepted")
	}
}
