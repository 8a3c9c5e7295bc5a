package upstream

import (
	"context"
	"encoding/json"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// Elicitation: every upstream's client declares the elicitation capability
// and answers an upstream's request for input through the vend.ElicitFunc
// of the call it belongs to (vend.ElicitFrom of the call's context).
//
// mcp-go v1.2.1 hands the handler:
//   - with protocol 2026-07-28 (the upstream's tools/call result asks for
//     input, the client calls again): the CallTool context, so the call is
//     known;
//   - before it, over Streamable HTTP (a server-initiated elicitation/create
//     on the call's response stream): a context derived from the CallTool
//     context, with a 30 s timeout of mcp-go's own;
//   - before it, over stdio: the transport's context, which knows no call.
//     Then the elicitation goes to the upstream's only call in flight, if
//     there is exactly one; otherwise nobody can tell whose it is.
//
// With no ElicitFunc the answer is "decline", so the upstream can go on or
// fail gracefully; an ElicitFunc error (the client left, the front gave
// up) is answered "cancel".

// elicitHandler is an upstream client's mcp-go ElicitationHandler.
type elicitHandler struct{ u *upstream }

var _ client.ElicitationHandler = elicitHandler{}

func (h elicitHandler) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	fn := vend.ElicitFrom(ctx)
	if fn == nil {
		fn = h.u.soleElicit()
	}
	if fn == nil {
		return elicitAnswer(mcp.ElicitationResponseActionDecline), nil
	}
	params, err := json.Marshal(req.Params)
	if err != nil {
		return elicitAnswer(mcp.ElicitationResponseActionDecline), nil
	}
	out, err := fn(ctx, params)
	if err != nil {
		h.u.log.Debug("elicitation not answered", logKeyErr, err)
		return elicitAnswer(mcp.ElicitationResponseActionCancel), nil
	}
	var res mcp.ElicitationResult
	if err := json.Unmarshal(out, &res); err != nil || res.Action == "" {
		h.u.log.Debug("elicitation answer not an ElicitResult", logKeyErr, err)
		return elicitAnswer(mcp.ElicitationResponseActionCancel), nil
	}
	return &res, nil
}

func elicitAnswer(a mcp.ElicitationResponseAction) *mcp.ElicitationResult {
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: a}}
}

// inflightCall is a call in flight on an upstream: its context and
// ElicitFunc (nil: none).
type inflightCall struct {
	ctx context.Context
	fn  vend.ElicitFunc
}

// inflight records the call of ctx as in flight on u and returns the
// function that forgets it.
func (u *upstream) inflight(ctx context.Context) func() {
	id := u.seq.Add(1)
	u.callsMu.Lock()
	u.calls[id] = inflightCall{ctx: ctx, fn: vend.ElicitFrom(ctx)}
	u.callsMu.Unlock()
	return func() {
		u.callsMu.Lock()
		delete(u.calls, id)
		u.callsMu.Unlock()
	}
}

// soleElicit returns the ElicitFunc of u's only call in flight, bound to
// that call's context (the handler's is the transport's), or nil if there
// is not exactly one call or it has none.
func (u *upstream) soleElicit() vend.ElicitFunc {
	u.callsMu.Lock()
	defer u.callsMu.Unlock()
	if len(u.calls) != 1 {
		return nil
	}
	for _, c := range u.calls {
		if c.fn == nil {
			return nil
		}
		return func(_ context.Context, params json.RawMessage) (json.RawMessage, error) {
			return c.fn(c.ctx, params)
		}
	}
	return nil
}
