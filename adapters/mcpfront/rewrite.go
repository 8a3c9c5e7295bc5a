package mcpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/jsonobj"
)

// rewrite returns msg (one JSON-RPC message) with this Server's
// placeholders replaced: a marked -32603 error by the wire error it
// encodes, a placeholder result by the Vendor's body. Any other message is
// returned unchanged.
func (s *Server) rewrite(msg []byte) []byte {
	if !bytes.Contains(msg, []byte(s.nonce)) {
		return msg
	}
	var top struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg, &top); err != nil || len(top.ID) == 0 {
		return msg
	}
	switch {
	case top.Error != nil:
		w, ok := s.unmarkError(top.Error.Message)
		if !ok || top.Error.Code != rpcerr.CodeInternal {
			return msg
		}
		return envelope(top.ID, "error", w)
	case len(top.Result) > 0:
		body, ok := s.restoreResult(top.Result)
		if !ok {
			return msg
		}
		return envelope(top.ID, "result", body)
	}
	return msg
}

func envelope(id json.RawMessage, key string, value json.RawMessage) []byte {
	// Sized at once, with room for the newline writeFree adds.
	b := make([]byte, 0, len(`{"jsonrpc":"2.0","id":,"":}`)+len(id)+len(key)+len(value)+1)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":`...)
	b = append(b, value...)
	return append(b, '}')
}

// restoreResult turns mcp-go's rendering of a placeholder back into the
// Vendor's body, keeping what mcp-go added that the body lacks (resultType,
// _meta.serverInfo with protocol 2026-07-28).
func (s *Server) restoreResult(result json.RawMessage) (json.RawMessage, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(result, &fields) != nil {
		return nil, false
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(fields["_meta"], &meta) != nil {
		return nil, false
	}
	var nonce string
	if json.Unmarshal(meta[metaVerbatim], &nonce) != nil || nonce != s.nonce {
		return nil, false
	}
	var content []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(fields["content"], &content) != nil || len(content) != 1 {
		return nil, false
	}
	body := []byte(content[0].Text)
	var bodyFields map[string]json.RawMessage
	if json.Unmarshal(body, &bodyFields) != nil {
		return nil, false
	}
	delete(meta, metaVerbatim)
	extra := map[string]json.RawMessage{}
	if _, ok := bodyFields["_meta"]; !ok && len(meta) > 0 {
		extra["_meta"], _ = json.Marshal(meta)
	}
	for k, v := range fields {
		switch k {
		case "_meta", "content", "isError", "structuredContent":
			continue
		}
		if _, ok := bodyFields[k]; !ok {
			extra[k] = v
		}
	}
	if len(extra) == 0 {
		return body, true
	}
	// Append the extra members to the body's object, leaving its bytes as
	// they are.
	trimmed := bytes.TrimRight(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[len(trimmed)-1] != '}' {
		return nil, false
	}
	out := append([]byte(nil), trimmed[:len(trimmed)-1]...)
	empty := len(bodyFields) == 0
	for _, k := range []string{"resultType", "_meta"} { // stable order first
		if v, ok := extra[k]; ok {
			out = appendMember(out, k, v, &empty)
			delete(extra, k)
		}
	}
	for k, v := range extra {
		out = appendMember(out, k, v, &empty)
	}
	return append(out, '}'), true
}

func appendMember(out []byte, k string, v json.RawMessage, empty *bool) []byte {
	if !*empty {
		out = append(out, ',')
	}
	*empty = false
	out = jsonobj.AppendString(out, k)
	out = append(out, ':')
	return append(out, v...)
}

// lineWriter sits under mcp-go's stdio server: every Write is one message
// and its newline. It rewrites placeholders and serialises writes with the
// direct notifications of Notify.
type lineWriter struct {
	s  *Server
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	out := p
	if bytes.Contains(p, []byte(l.s.nonce)) {
		msg := bytes.TrimRight(p, "\r\n")
		out = append(l.s.rewrite(msg), '\n')
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// serveHTTP bounds the body, then hands the request to mcp-go with a
// response writer that rewrites placeholders.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.guard(w, r) {
		return
	}
	var body []byte
	if r.Method == http.MethodPost {
		if r.ContentLength > s.cfg.MaxBodyBytes {
			tooLarge(w)
			return
		}
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				tooLarge(w)
				return
			}
			http.Error(w, "cannot read request body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	r.Header.Del(rpcIDHeader) // only the BeforeCallTool hook sets it
	modern := isModern(r, body)
	if !modern {
		var done func()
		var ok bool
		if r, done, ok = s.serveSession(w, r, body); !ok {
			return
		}
		defer done()
	}
	rw := &rewriteWriter{s: s, w: w, modern: modern, rc: http.NewResponseController(w),
		xcashu: strings.TrimSpace(r.Header.Get(HeaderCashu)), want402: s.wants402(r.Header)}
	rw.extend()
	defer rw.finish()
	if s.serveFree(rw, r, body, modern) {
		return
	}
	ctx := context.WithValue(r.Context(), keyHTTPWriter, rw)
	if r.Method == http.MethodGet || isListen(body) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.streams, cancel)
		defer stop()
	}
	s.http.ServeHTTP(rw, r.WithContext(ctx))
}

// isListen reports whether body is a subscriptions/listen request.
func isListen(body []byte) bool {
	if !bytes.Contains(body, []byte(mcp.MethodSubscriptionsListen)) {
		return false
	}
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == string(mcp.MethodSubscriptionsListen)
}

// isModern reports whether a request uses protocol 2026-07-28 or later, as
// mcp-go decides it (header or params._meta).
func isModern(r *http.Request, body []byte) bool {
	if mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion)) {
		return true
	}
	var m struct {
		Params struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	if len(body) == 0 || json.Unmarshal(body, &m) != nil {
		return false
	}
	var v string
	_ = json.Unmarshal(m.Params.Meta[mcp.MetaKeyProtocolVersion], &v)
	return mcp.IsModernProtocol(v)
}

func tooLarge(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Request too large"}}`+"\n")
}

// rewriteWriter sits under mcp-go's Streamable HTTP server. mcp-go writes a
// JSON response as one Write (message + newline) and each SSE event as one
// Write ("event: message\ndata: <message>\n\n"); only writes holding a
// placeholder are rewritten. It also lets Notify write events on the
// request's own stream (see notify), so every write is serialised.
type rewriteWriter struct {
	s  *Server
	w  http.ResponseWriter
	rc *http.ResponseController // moves the write deadline (Config.WriteTimeout)

	// modern requests (protocol 2026-07-28) map error codes to HTTP
	// statuses; their status is held until the body shows the real code.
	modern  bool
	pending int

	// What the request said about payment (xcashu.go): its X-Cashu
	// value, whether it wants HTTP 402 answers (wants402).
	xcashu  string
	want402 bool

	mu          sync.Mutex
	wroteHeader bool
	sse         bool // this writer upgraded the response to SSE
	finished    bool // the handler returned: the writer is dead
	replaced    bool // the answer was written by replace (HTTP 402/401): mcp-go's is dropped
}

// Header is the response's header until it is written; after, a
// detached map: mcp-go's forwarder of server-to-client requests (an
// elicitation/create) sets SSE headers on a response notify upgraded
// already, from its own goroutine, and those changes would do nothing
// but race with this writer's.
func (rw *rewriteWriter) Header() http.Header {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.wroteHeader {
		return http.Header{}
	}
	return rw.w.Header()
}
func (rw *rewriteWriter) Unwrap() http.ResponseWriter { return rw.w }

func (rw *rewriteWriter) WriteHeader(status int) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.wroteHeader {
		return // notify upgraded the response already, or replace answered
	}
	if rw.modern && rw.pending == 0 && status == http.StatusOK &&
		strings.HasPrefix(rw.w.Header().Get("Content-Type"), "application/json") {
		rw.pending = status
		return
	}
	rw.wroteHeader = true
	rw.w.WriteHeader(status)
}

// Flush is always offered: mcp-go streams only to writers that can flush.
func (rw *rewriteWriter) Flush() {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.flush()
}

// extend moves the connection's write deadline to now + WriteTimeout,
// before a write: only a client that stops reading runs into it, not a
// stream that is quiet while its call waits. Never once the handler
// returned: the connection may serve the next request by then. Called
// with rw.mu held (or before any other use of rw).
func (rw *rewriteWriter) extend() {
	if d := rw.s.cfg.WriteTimeout; d > 0 && !rw.finished {
		_ = rw.rc.SetWriteDeadline(time.Now().Add(d)) // ErrNotSupported: nothing to move
	}
}

func (rw *rewriteWriter) flush() {
	rw.extend()
	rw.commitPending(nil)
	if f, ok := rw.w.(http.Flusher); ok && !rw.finished {
		f.Flush()
	}
}

// commitPending writes a held status, as 400 if msg is an invalid-request
// or invalid-params error (as mcp-go does for its own errors on modern
// requests).
func (rw *rewriteWriter) commitPending(msg []byte) {
	if rw.pending == 0 || rw.wroteHeader {
		return
	}
	status := rw.pending
	var e struct {
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if msg != nil && json.Unmarshal(msg, &e) == nil && e.Error != nil &&
		(e.Error.Code == rpcerr.CodeInvalidParams || e.Error.Code == rpcerr.CodeInvalidRequest) {
		status = http.StatusBadRequest
	}
	rw.pending = 0
	rw.wroteHeader = true
	rw.w.WriteHeader(status)
}

func (rw *rewriteWriter) finish() {
	rw.mu.Lock()
	rw.finished = true
	rw.mu.Unlock()
}

func (rw *rewriteWriter) Write(p []byte) (int, error) {
	rw.mu.Lock()
	replaced := rw.replaced
	rw.mu.Unlock()
	if replaced {
		return len(p), nil // mcp-go's answer to a request replace answered
	}
	out := p
	if bytes.Contains(p, []byte(rw.s.nonce)) {
		if bytes.HasPrefix(p, []byte("event:")) || bytes.HasPrefix(p, []byte("id:")) || bytes.HasPrefix(p, []byte("data:")) {
			lines := bytes.Split(p, []byte("\n"))
			for i, line := range lines {
				if data, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
					lines[i] = append([]byte("data: "), rw.s.rewrite(data)...)
				}
			}
			out = bytes.Join(lines, []byte("\n"))
		} else {
			msg := bytes.TrimRight(p, "\r\n")
			out = append(rw.s.rewrite(msg), p[len(msg):]...)
		}
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.extend()
	rw.commitPending(bytes.TrimSpace(out))
	rw.wroteHeader = true
	if _, err := rw.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// notify writes msg as an SSE event on this request's response, upgrading
// it to SSE if nothing was written yet. It reports false if the response
// can no longer carry it (finished, or already a plain JSON response).
//
// mcp-go's own path (the session's notification channel, read by a
// forwarder goroutine) can drop a notification queued just before the
// handler returns, and, before protocol 2026-07-28, can put it on the
// session's GET stream instead; this path does neither.
func (rw *rewriteWriter) notify(msg []byte) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.finished || rw.replaced {
		return false
	}
	rw.extend()
	if !rw.wroteHeader {
		h := rw.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		rw.w.WriteHeader(http.StatusOK)
		rw.wroteHeader = true
		rw.sse = true
	}
	if !rw.sse && !strings.HasPrefix(rw.w.Header().Get("Content-Type"), "text/event-stream") {
		return false
	}
	rw.sse = true
	if _, err := fmt.Fprintf(rw.w, "event: message\ndata: %s\n\n", msg); err != nil {
		return false
	}
	rw.flush()
	return true
}
