package mcpfront

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// DefaultElicitTimeout is how long a client has to answer an elicitation
// when Config.ElicitTimeout is 0.
const DefaultElicitTimeout = 10 * time.Minute

// Bounds of the parked elicitations when Config.MaxElicitsPerClient or
// Config.MaxElicits is 0.
const (
	DefaultMaxElicitsPerClient = 16
	DefaultMaxElicits          = 1024
)

// elicitKey is the key of capvend's one input request in an input_required
// result (the client echoes it in inputResponses).
const elicitKey = "capvend/elicit"

// errRequestState: a retry's requestState is not one this Server handed to
// this client, or it expired (-32602).
var errRequestState = errors.New("unknown or expired request state")

// errInputResponse: a retry lacks the answer to the elicitation (-32602).
var errInputResponse = errors.New("inputResponses lack the answer to " + elicitKey)

// errReused: a retry's requestState names a call of another tool or other
// arguments (vend's -32600): it must not continue, nor answer, that call.
var errReused = fmt.Errorf("request state: %w", vend.ErrRequestReused)

// errElicitLimit: too many elicitations are parked for the source, or in
// total; the upstream gets "cancel".
var errElicitLimit = errors.New("too many elicitations waiting for an answer")

var (
	answerCancel  = json.RawMessage(`{"action":"cancel"}`)
	answerDecline = json.RawMessage(`{"action":"decline"}`)
)

// vcall is one tools/call whose Vendor call runs on its own goroutine, so
// that the call can outlive one round trip of a client on protocol
// 2026-07-28 (the result asks for input; the client calls again).
type vcall struct {
	cr     vend.CallRequest
	hash   string         // canonical hash of cr.Arguments: a retry must match it
	asks   chan elicitAsk // the Vendor's Elicit to the waiting handler
	done   chan struct{}  // closed when the Vendor's CallTool returned
	res    vend.CallResult
	err    error
	cancel context.CancelFunc // ends the Vendor call's context

	mu        sync.Mutex
	notify    func(method string, params any) // the current round's stream
	abandoned chan struct{}                   // closed when no one will answer again
	closed    bool
}

// elicitAsk is one elicitation waiting for the client's answer.
type elicitAsk struct {
	params json.RawMessage
	answer chan json.RawMessage // buffered: one answer, never blocks
	// until is when a parked ask expires (the pay page's: its invoice's
	// expiry); zero: Config.ElicitTimeout after it is parked.
	until time.Time
}

// pendingAsk is an elicitation handed to a client on protocol 2026-07-28,
// waiting for its retry under token.
type pendingAsk struct {
	c     *vcall
	ask   elicitAsk
	by    string // the source it counts for (Config.MaxElicitsPerClient)
	timer *time.Timer
}

// startCall runs the Vendor call of cr on its own goroutine. Its context
// keeps ctx's values but not its cancellation: the first round's request
// ends when it asks the client for input. With payByURL (a client on
// protocol 2026-07-28 that declared URL-mode elicitation) the call asks
// for its pay page too (askPayPage).
func (s *Server) startCall(ctx context.Context, cr vend.CallRequest, payByURL bool) *vcall {
	c := &vcall{asks: make(chan elicitAsk), done: make(chan struct{}), abandoned: make(chan struct{})}
	c.notify = cr.Notify
	cr.Notify = func(method string, params any) {
		c.mu.Lock()
		n := c.notify
		c.mu.Unlock()
		n(method, params)
	}
	cr.Elicit = c.elicit
	c.cr = cr
	c.hash = argsHash(cr.Arguments)
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	if payByURL {
		cr.PayPage = s.askPayPage(cctx, c)
		c.cr.PayPage = cr.PayPage
	}
	go func() {
		defer close(c.done)
		defer cancel()
		defer c.abandon() // an Elicit racing the end gets "cancel"
		c.res, c.err = s.cfg.Vendor.CallItem(cctx, cr)
	}()
	return c
}

// elicit is the call's vend.ElicitFunc: it hands params to the handler
// waiting on the call and waits for the client's answer. An abandoned call
// is answered "cancel", so the upstream ends.
func (c *vcall) elicit(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
	return c.elicitUntil(ctx, params, time.Time{})
}

// elicitUntil is elicit with the ask's expiry once parked (elicitAsk.until).
func (c *vcall) elicitUntil(ctx context.Context, params json.RawMessage, until time.Time) (json.RawMessage, error) {
	ask := elicitAsk{params: params, answer: make(chan json.RawMessage, 1), until: until}
	select {
	case c.asks <- ask:
	case <-c.abandoned:
		return answerCancel, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case a := <-ask.answer:
		return a, nil
	case <-c.abandoned:
		return answerCancel, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// abandon says nobody will answer the call's elicitations any more.
// Idempotent.
func (c *vcall) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.abandoned)
	}
}

// await waits, for the request of ctx, for the call's result or its next
// elicitation. A client on protocol 2026-07-28 gets the elicitation as an
// input_required result under a fresh token; an older client is asked
// with elicitation/create at once, and await goes on waiting. If ctx ends
// first, the call is cancelled (a paid call still runs to its end in the
// Vendor) and its outcome returned.
func (s *Server) await(ctx context.Context, c *vcall) (*mcp.CallToolResult, error) {
	c.mu.Lock()
	c.notify = s.notifier(ctx)
	c.mu.Unlock()
	for {
		select {
		case <-c.done:
			return s.answer(ctx, c.cr, c.res, c.err)
		case <-ctx.Done():
			c.abandon()
			c.cancel()
			<-c.done
			return s.answer(ctx, c.cr, c.res, c.err)
		case ask := <-c.asks:
			var p mcp.ElicitationParams
			if err := json.Unmarshal(ask.params, &p); err != nil || p.Validate() != nil {
				s.log.Info("upstream elicitation invalid: declined", logKeyTool, c.cr.Name, logKeyErr, err)
				ask.answer <- answerDecline
				continue
			}
			if !clientCanElicit(ctx) {
				ask.answer <- answerDecline
				continue
			}
			if !mcp.IsModernProtocol(server.RequestProtocolVersion(ctx)) {
				ask.answer <- s.elicitNow(ctx, c.cr.Name, p)
				continue
			}
			tok, err := s.park(c, ask)
			if err != nil {
				// The call goes on (it may be paid): the upstream is
				// refused, the client gets the call's outcome.
				s.log.Warn("upstream elicitation cancelled", logKeyTool, c.cr.Name, logKeyErr, err)
				ask.answer <- answerCancel
				continue
			}
			return server.NewInputRequestBuilder(tok).Elicit(elicitKey, p).ToolResult(), nil
		}
	}
}

// elicitNow asks a client before protocol 2026-07-28 with a
// server-initiated elicitation/create and returns its answer, "cancel" if
// it could not be had. (mcp-go's own bridge would do this from an
// input_required result, but would answer a failure with its error text
// and leave the call waiting for a retry that never comes.)
func (s *Server) elicitNow(ctx context.Context, tool string, p mcp.ElicitationParams) json.RawMessage {
	res, err := s.mcp.RequestElicitation(ctx, mcp.ElicitationRequest{
		Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
		Params:  p,
	})
	if err != nil || res == nil {
		s.log.Info("elicitation not answered by the client", logKeyTool, tool, logKeyErr, err)
		return answerCancel
	}
	b, err := json.Marshal(res.ElicitationResponse)
	if err != nil {
		return answerCancel
	}
	return b
}

// clientCanElicit reports whether the client of ctx declared the
// elicitation capability (per request from protocol 2026-07-28, per
// session before).
func clientCanElicit(ctx context.Context) bool {
	if info := server.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		return info.ClientCapabilities != nil && info.ClientCapabilities.Elicitation != nil
	}
	if sess, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
		return sess.GetClientCapabilities().Elicitation != nil
	}
	return false
}

// park records ask under a new unguessable token until the client's retry
// or the timeout (Config.ElicitTimeout, or the ask's until), which answers
// it "cancel" and abandons the call.
// errElicitLimit when the call's source, or everyone, has as many parked
// as allowed.
func (s *Server) park(c *vcall, ask elicitAsk) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	by := c.cr.Source
	if by == "" {
		by = c.cr.Client
	}
	s.elicitMu.Lock()
	defer s.elicitMu.Unlock()
	if len(s.elicits) >= s.cfg.MaxElicits {
		return "", fmt.Errorf("%w: %d in total", errElicitLimit, len(s.elicits))
	}
	if s.elicitBy[by] >= s.cfg.MaxElicitsPerClient {
		return "", fmt.Errorf("%w: %d for the client", errElicitLimit, s.elicitBy[by])
	}
	wait := s.cfg.ElicitTimeout
	if !ask.until.IsZero() {
		wait = time.Until(ask.until)
	}
	s.elicitBy[by]++
	s.elicits[tok] = &pendingAsk{c: c, ask: ask, by: by, timer: time.AfterFunc(wait, func() {
		if p := s.take(tok); p != nil {
			p.ask.answer <- answerCancel
			p.c.abandon()
		}
	})}
	return tok, nil
}

// take removes and returns the pending ask of tok, nil if there is none.
// Exactly one of the retry and the timeout gets it.
func (s *Server) take(tok string) *pendingAsk {
	s.elicitMu.Lock()
	defer s.elicitMu.Unlock()
	p := s.elicits[tok]
	if p != nil {
		delete(s.elicits, tok)
		p.timer.Stop()
		if s.elicitBy[p.by]--; s.elicitBy[p.by] <= 0 {
			delete(s.elicitBy, p.by)
		}
	}
	return p
}

// resume continues the call a retry's requestState names, for the same
// client (and, an anonymous client, the same Source: every client without
// an identity shares one name), tool and canonical arguments only: the
// answer goes to the waiting elicitation, and no new Vendor call is made.
// A retry that names another tool or other arguments is refused and
// leaves the call waiting for the right one.
func (s *Server) resume(ctx context.Context, req mcp.CallToolRequest, cr vend.CallRequest) (*mcp.CallToolResult, error) {
	tok := req.Params.RequestState
	s.elicitMu.Lock()
	p := s.elicits[tok]
	s.elicitMu.Unlock()
	if p == nil || p.c.cr.Client != cr.Client || cr.Anonymous && p.c.cr.Source != cr.Source {
		s.log.Info("tool call retry refused", logKeyTool, req.Params.Name, logKeyErr, errRequestState)
		return nil, s.markError(errRequestState, req.Params.Name)
	}
	if p.c.cr.Name != cr.Name || p.c.hash == "" || p.c.hash != argsHash(cr.Arguments) {
		s.log.Info("tool call retry refused", logKeyTool, req.Params.Name, logKeyErr, errReused)
		return nil, s.markError(errReused, req.Params.Name)
	}
	ans := server.ElicitationResponse(req.Params.InputResponses, elicitKey)
	if ans == nil {
		return nil, s.markError(errInputResponse, req.Params.Name)
	}
	b, err := json.Marshal(ans.ElicitationResponse)
	if err != nil {
		return nil, s.markError(errInputResponse, req.Params.Name)
	}
	if p = s.take(tok); p == nil { // the timeout won
		return nil, s.markError(errRequestState, req.Params.Name)
	}
	p.ask.answer <- b
	return s.await(ctx, p.c)
}

// argsHash is the canonical hash of a call's arguments (key order, white
// space and number spelling do not matter), "" if they are not JSON.
func argsHash(args []byte) string {
	h, err := vend.CanonicalHash("tools/call", args)
	if err != nil {
		return ""
	}
	return h
}
