package redteam

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
)

// rpcMessage is any JSON-RPC message (request, notification, response).
type rpcMessage struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *rpcError       `json:"error,omitempty"`
}

type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (m rpcMessage) String() string {
	b, _ := json.Marshal(m)
	return string(b)
}

// payReq returns the bolt11 of a payment_required notification's params.
func (m rpcMessage) payReq() string {
	var p struct {
		PayReq string `json:"pay_req"`
		Amount int64  `json:"amount"`
	}
	json.Unmarshal(m.Params, &p)
	return p.PayReq
}

// Notification methods capvend sends about payment.
const (
	notePaymentRequired = "notifications/payment_required"
	notePaymentAccepted = "notifications/payment_accepted"
)

// protocolVersion is the MCP version the raw HTTP client speaks (one with
// sessions).
const protocolVersion = "2025-11-25"

// httpClient is a raw MCP Streamable HTTP client: it controls ids, headers
// and connections itself, as an attacker does. Each request is its own
// connection (no keep-alive), so dropping a stream drops exactly it.
type httpClient struct {
	t      testing.TB
	url    string
	header http.Header // added to every request (Origin, Authorization, ...)
	hc     *http.Client
}

func newHTTPClient(t testing.TB, sh *shop) *httpClient {
	return &httpClient{t: t, url: sh.url, header: http.Header{},
		hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
}

// needLoopback skips t (fails it under CI) unless every ip is a local
// address this machine can connect from (Linux routes all of 127.0.0.0/8
// to lo; other systems need aliases). Call it from the test's goroutine
// before newHTTPClientFrom.
func needLoopback(t testing.TB, ips ...string) {
	t.Helper()
	for _, ip := range ips {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			skip.Missing(t, fmt.Sprintf("loopback address %s is not usable here: %v", ip, err), "on systems other than Linux: sudo ifconfig lo0 alias "+ip)
		}
		ln.Close()
	}
}

// newHTTPClientFrom is newHTTPClient connecting from the loopback address
// ip (127.0.0.2 ...): another client by address, as capvend counts them.
// See needLoopback.
func newHTTPClientFrom(t testing.TB, sh *shop, ip string) *httpClient {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &httpClient{t: t, url: sh.url, header: http.Header{},
		hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}}
}

// stream is an open response: the messages it carries, in order.
type stream struct {
	resp   *http.Response
	msgs   chan rpcMessage
	done   chan struct{}
	cancel context.CancelFunc
}

// close drops the stream: the connection is closed under capvend's
// handler.
func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
	<-s.done
}

// next returns the stream's next message; false when it ended or after
// wait.
func (s *stream) next(wait time.Duration) (rpcMessage, bool) {
	select {
	case m, ok := <-s.msgs:
		return m, ok
	case <-time.After(wait):
		return rpcMessage{}, false
	}
}

// postRaw posts body (any bytes) with the session id (if any) and returns
// the open response. Non-2xx answers are returned as errors carrying the
// status (see statusOf).
func (c *httpClient) postRaw(session, body string, hdr http.Header) (*stream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("MCP-Protocol-Version", protocolVersion)
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		cancel()
		return nil, &statusError{code: resp.StatusCode, body: string(b), header: resp.Header}
	}
	s := &stream{resp: resp, msgs: make(chan rpcMessage, 64), done: make(chan struct{}), cancel: cancel}
	go s.read()
	return s, nil
}

// statusError is a non-2xx HTTP answer.
type statusError struct {
	code   int
	body   string
	header http.Header
}

func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.code, e.body) }

// statusOf returns the HTTP status of an error of postRaw (200 for nil).
func statusOf(err error) int {
	var se *statusError
	if errors.As(err, &se) {
		return se.code
	}
	if err == nil {
		return 200
	}
	return 0
}

func (s *stream) read() {
	defer close(s.done)
	defer close(s.msgs)
	defer s.resp.Body.Close()
	ct := s.resp.Header.Get("Content-Type")
	if !strings.HasPrefix(ct, "text/event-stream") {
		b, _ := io.ReadAll(s.resp.Body)
		if len(bytes.TrimSpace(b)) == 0 {
			return
		}
		var m rpcMessage
		if json.Unmarshal(b, &m) == nil {
			s.msgs <- m
		}
		return
	}
	sc := bufio.NewScanner(s.resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data.Len() > 0 {
				var m rpcMessage
				if json.Unmarshal([]byte(data.String()), &m) == nil {
					s.msgs <- m
				}
				data.Reset()
			}
			continue
		}
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			data.WriteString(strings.TrimPrefix(d, " "))
		}
	}
}

// request encodes a JSON-RPC request (id nil: a notification).
func request(id any, method string, params any) string {
	m := map[string]any{"jsonrpc": "2.0", "method": method}
	if id != nil {
		m["id"] = id
	}
	if params != nil {
		m["params"] = params
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// tryInitialize opens a session: initialize, then notifications/initialized.
func (c *httpClient) tryInitialize() (string, error) {
	st, err := c.postRaw("", request(0, "initialize", map[string]any{
		"protocolVersion": protocolVersion, "capabilities": payingCapabilities(),
		"clientInfo": map[string]any{"name": "redteam", "version": "1"}}), nil)
	if err != nil {
		return "", err
	}
	sess := st.resp.Header.Get("Mcp-Session-Id")
	m, ok := st.next(30 * time.Second)
	st.close()
	if !ok || m.Error != nil {
		return "", fmt.Errorf("initialize: %v", m)
	}
	if sess == "" {
		return "", errors.New("initialize: no Mcp-Session-Id")
	}
	if st, err := c.postRaw(sess, request(nil, "notifications/initialized", nil), nil); err == nil {
		st.close()
	}
	return sess, nil
}

func (c *httpClient) initialize() string {
	c.t.Helper()
	s, err := c.tryInitialize()
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// tryRPC sends one request and reads its stream to the response.
func (c *httpClient) tryRPC(session string, id any, method string, params any, hdr http.Header) (rpcMessage, error) {
	st, err := c.postRaw(session, request(id, method, params), hdr)
	if err != nil {
		return rpcMessage{}, err
	}
	defer st.close()
	for {
		m, ok := st.next(3 * time.Minute)
		if !ok {
			return rpcMessage{}, errors.New("the stream ended without a response")
		}
		if m.Method == "" {
			return m, nil
		}
	}
}

// untilResponse reads st to its response, paying every payment_required
// with pay (nil: not paid). It returns the response and the notification
// methods seen.
func untilResponse(t testing.TB, st *stream, pay func(bolt11 string)) (rpcMessage, []string) {
	t.Helper()
	var notes []string
	for {
		m, ok := st.next(3 * time.Minute) // a hang guard
		if !ok {
			t.Fatalf("the stream ended without a response (notifications %v)", notes)
		}
		if m.Method == "" {
			return m, notes
		}
		notes = append(notes, m.Method)
		if m.Method == notePaymentRequired && pay != nil {
			pay(m.payReq())
		}
	}
}

// untilNote reads st until a notification of method, failing on a
// response first.
func untilNote(t testing.TB, st *stream, method string) rpcMessage {
	t.Helper()
	for {
		m, ok := st.next(3 * time.Minute)
		if !ok {
			t.Fatalf("the stream ended before %s", method)
		}
		if m.Method == method {
			return m
		}
		if m.Method == "" {
			t.Fatalf("answered before %s: %s", method, m)
		}
	}
}

// callParams are tools/call params.
func callParams(tool string, args any, meta map[string]any) map[string]any {
	p := map[string]any{"name": tool, "arguments": args}
	if meta != nil {
		p["_meta"] = meta
	}
	return p
}

// payingCapabilities are the client capabilities of a capvend-aware
// client: it handles the payment notifications (capvend/payments), so it
// gets them unless it asks for explicit gating.
func payingCapabilities() map[string]any {
	return map[string]any{"experimental": map[string]any{"capvend/payments": map[string]any{}}}
}

// explicit is the _meta asking for explicit gating: an unpaid call is
// answered at once with the payment options (a tool result with isError
// on MCP, -32042 on Nostr) instead of waiting for the payment.
func explicit() map[string]any {
	return map[string]any{"capvend/payment_interaction": "explicit_gating"}
}

// resultText is the text of a CallToolResult.
func resultText(raw json.RawMessage) string {
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	json.Unmarshal(raw, &r)
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// modernProtocol is MCP's session-less protocol version: no initialize,
// no session; capvend counts such clients by address (or a client id
// header behind a trusted proxy).
const modernProtocol = "2026-07-28"

// tryModernCall sends one session-less tools/call with extra headers and
// reads its stream to the response.
func (c *httpClient) tryModernCall(id any, tool string, args, meta map[string]any, hdr http.Header) (rpcMessage, error) {
	m := map[string]any{
		"io.modelcontextprotocol/protocolVersion":    modernProtocol,
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "redteam", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": payingCapabilities(),
	}
	for k, v := range meta {
		m[k] = v
	}
	h := http.Header{}
	for k, vs := range hdr {
		h[k] = vs
	}
	h.Set("MCP-Protocol-Version", modernProtocol)
	h.Set("Mcp-Method", "tools/call")
	h.Set("Mcp-Name", tool)
	st, err := c.postRaw("", request(id, "tools/call", callParams(tool, args, m)), h)
	if err != nil {
		return rpcMessage{}, err
	}
	defer st.close()
	for {
		msg, ok := st.next(3 * time.Minute)
		if !ok {
			return rpcMessage{}, errors.New("the stream ended without a response")
		}
		if msg.Method == "" {
			return msg, nil
		}
	}
}
