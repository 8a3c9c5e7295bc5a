package vend

import (
	"context"
	"encoding/json"
	"errors"
)

// RawToolSource is an optional ability of a ToolSource: a cheaper way to
// run a call on some upstreams (upstream.Manager forwards the request's
// bytes to an HTTP upstream instead of going through an MCP client's
// typed request and result). Vendor.CallFree uses it for free calls.
type RawToolSource interface {
	// CanCallRaw reports whether CallToolRaw can run t now (an upstream it
	// can reach that way). Cheap; no I/O.
	CanCallRaw(t Item) bool
	// CallToolRaw runs t like ToolSource.CallTool: the same arguments,
	// the same result bytes, the same errors, progress passed the same
	// way. It returns ErrNotRaw when the call needs CallTool after all:
	// the upstream asked for input (an elicitation; CallTool's client
	// answers such requests, starting the call again), or it can no
	// longer be reached raw (then nothing was sent). Not idempotent.
	CallToolRaw(ctx context.Context, t Item, args json.RawMessage, progressToken json.RawMessage, progress func(params json.RawMessage)) (json.RawMessage, error)
}

// ErrNotRaw is RawToolSource.CallToolRaw's answer when the call needs
// ToolSource.CallTool after all.
var ErrNotRaw = errors.New("call needs the full MCP client")

// CallFree serves a tools/call that is free outright: its tool exists, its
// arguments pass every check CallTool makes (parsing, schema, pricing),
// its price for these arguments is 0 (no daily free quota: nothing is
// recorded), and its upstream can be called through RawToolSource. Then
// the call is counted against the rate limit like any other and run, and
// ok is true: res and err are what CallTool would have answered.
//
// ok false means none of this holds, or a check failed: nothing was done
// (not even counted against the rate limit), and the caller serves the
// request with CallTool, which answers it exactly as always (errors
// included). A front may so try CallFree first on every tools/call.
func (v *Vendor) CallFree(ctx context.Context, req CallRequest) (res CallResult, ok bool, err error) {
	raw, isRaw := v.cfg.Tools.(RawToolSource)
	if !isRaw || req.Kind.Or() != ItemTool || req.CashuToken != "" || req.RefundInvoice != "" {
		return CallResult{}, false, nil
	}
	r := &req
	t, args, free := v.freeTool(r)
	if !free || !raw.CanCallRaw(t) {
		return CallResult{}, false, nil
	}
	// From here on this is CallTool's path for a free call, in its order.
	v.flight.n.Add(1)
	defer v.flight.n.Add(-1)
	ctx, err = v.enter(ctx, r)
	if err != nil {
		return CallResult{}, true, err
	}
	body, err := v.executeVia(ctx, 0, raw, &t, args, r)
	v.obs.FreeCall(t, err)
	if err != nil {
		return CallResult{}, true, err
	}
	return CallResult{Body: body, IsError: isErrorResult(body)}, true, nil
}

// freeTool runs admit's checks of a tools/call without side effects and
// reports whether the call is free outright (price 0, proof of work
// enough), with its tool and parsed arguments.
func (v *Vendor) freeTool(r *CallRequest) (Item, json.RawMessage, bool) {
	t, ok := v.item(ItemTool, r.Name)
	if !ok || t.Kind.Or() != ItemTool {
		return Item{}, nil, false
	}
	if _, hi := v.listed(&t, priceKey(&t)); hi > 0 {
		return Item{}, nil, false // priced: spare it the parsing CallTool does again
	}
	rc := *r // check takes a payment argument out into PaymentToken
	args, q, err := v.check(&t, &rc)
	if err != nil || q.Price > 0 || checkWork(r) != nil {
		return Item{}, nil, false
	}
	return t, args, true
}
