package vend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// run executes a paid call exactly once, with the tool and arguments
// recorded with it, and records its end: delivered (a hold invoice
// settled first), or failed and refunded (a hold invoice canceled,
// returning the money). c.t and c.args are the request's own: they only
// answer a request that finds the call running or run already, never
// execute. A call that cannot run as recorded is refunded (ErrUpstream).
func (c *pending) run(ctx context.Context) (CallResult, error) {
	ctx = Urgent(ctx) // paid
	// Requests for the same call in this process queue behind the first;
	// the ledger's claim keeps other processes out.
	done := c.v.running.start(c.call.ID)
	if done == nil {
		return c.resume(ctx)
	}
	// The money is in: the claim, the run and its records go ahead even
	// if the client leaves now (its answer waits for the replay).
	res, ranAlready, err := c.claimAndFinish(context.WithoutCancel(ctx))
	// Unregistered before resuming: resume waits for a running call's
	// channel, and this run's own would never close.
	c.v.running.stop(c.call.ID, done)
	if ranAlready != nil {
		c.call = *ranAlready
		return c.resume(ctx) // its stored answer
	}
	return res, err
}

// claimAndFinish claims the call for an execution of its recorded tool
// and arguments and runs it. A non-nil *Call is the call as it is now
// when it was not paid any more (it ran, or ended, elsewhere).
func (c *pending) claimAndFinish(ctx context.Context) (CallResult, *Call, error) {
	v := c.v
	t, args, bind, err := v.storedItem(ctx, &c.call)
	if err == nil {
		_, err = v.cfg.Ledger.StartExecution(ctx, c.call.ID, bind, c.release())
	}
	if err == nil {
		res, err := c.finish(ctx, &t, args)
		return res, nil, err
	}
	if cur, cerr := v.cfg.Ledger.Call(ctx, c.call.ID); cerr == nil && cur.State != CallPaid && cur.State != CallExecuting {
		return CallResult{}, &cur, nil
	}
	if !errors.Is(err, errNoArguments) && !errors.Is(err, errItemGone) && !errors.Is(err, ErrExecutionMismatch) {
		return CallResult{}, nil, err
	}
	v.cfg.Log.Error("vend: a paid call cannot run as recorded; refunding", "call", int64(c.call.ID), "err", err)
	if rerr := v.refundPaid(ctx, c.call.ID, unrunnable(err)); rerr != nil {
		return CallResult{}, nil, rerr
	}
	return CallResult{}, nil, fmt.Errorf("%w: the call could not run; the payment is refunded", ErrUpstream)
}

// finish runs a claimed call on its upstream, as t with args (what the
// ledger recorded), and records its end.
func (c *pending) finish(ctx context.Context, t *Item, args json.RawMessage) (CallResult, error) {
	v, call, p := c.v, &c.call, c.pay
	// The call runs to its end even if the client leaves: it is paid.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.cfg.ExecTimeout)
	defer cancel()
	start := time.Now()
	body, err := v.execute(ectx, call.ID, t, args, c.r)
	v.failpoint(FailDuringExecution)
	outcome := "delivered"
	defer func() {
		v.cfg.Log.Info("vend: priced call", "call", int64(call.ID), "kind", string(t.Kind.Or()), "tool", t.Name, "price_msat", int64(call.Price), "backend", p.Backend,
			"payment", p.Ref, "outcome", outcome, "duration", time.Since(start))
	}()
	if err == nil && !isErrorResult(body) {
		if p.Kind == KindHoldInvoice {
			if hs, ok := v.backend(p.Backend).(HoldSettler); ok {
				if _, err := hs.SettleHeld(ectx, p.Ref); err != nil {
					outcome = "settle failed"
					return c.fail(ectx, nil, "could not settle the hold invoice: "+err.Error())
				}
			}
		}
		if err := v.cfg.Ledger.Deliver(ectx, call.ID, Result{Body: body}); err != nil {
			outcome = "not recorded"
			return CallResult{}, err
		}
		v.failpoint(FailAfterResult)
		return CallResult{Body: body}, nil
	}
	reason := "the tool reported an error"
	if err != nil {
		reason = err.Error()
	}
	outcome = "failed: refunded"
	return c.fail(ectx, body, reason)
}

// fail records a failed call and gives the money back: a hold invoice is
// canceled (Lightning returns the money), anything else is booked as owed.
func (c *pending) fail(ctx context.Context, body json.RawMessage, reason string) (CallResult, error) {
	v, call, p := c.v, &c.call, c.pay
	stored := body
	if stored == nil {
		stored, _ = json.Marshal(map[string]any{"isError": true, "content": []map[string]string{{"type": "text",
			"text": "The tool could not run; your payment is refunded."}}})
	}
	if err := v.cfg.Ledger.Fail(ctx, call.ID, Result{IsError: true, Body: stored}, reason); err != nil {
		return CallResult{}, err
	}
	if p.Kind == KindHoldInvoice && p.State != PaymentSettled {
		if b := v.backend(p.Backend); b != nil {
			if err := b.Cancel(ctx, p.Ref); err != nil {
				v.cfg.Log.Error("vend: canceling the hold invoice of a failed call", "call", int64(call.ID), "err", err)
				return CallResult{}, fmt.Errorf("%w: refund pending", ErrUpstream)
			}
		}
	}
	if err := v.cfg.Ledger.Refund(ctx, call.ID, reason); err != nil {
		return CallResult{}, err
	}
	if body == nil {
		return c.refunded(ctx, CallResult{}, fmt.Errorf("%w: %s", ErrUpstream, "the tool could not run; the payment is refunded"))
	}
	return c.refunded(ctx, CallResult{Body: body, IsError: true}, nil)
}

// execute runs the tool on its upstream for the priced call id (0 for a
// free call), forwarding progress and passing the client's Elicit along
// (in ctx).
func (v *Vendor) execute(ctx context.Context, id CallID, t *Item, args json.RawMessage, r *CallRequest) (json.RawMessage, error) {
	return v.executeVia(ctx, id, nil, t, args, r)
}

// executeVia is execute, a tool call going through raw when it is not
// nil, and through ToolSource.CallTool when raw answers ErrNotRaw (the
// upstream asked for input).
func (v *Vendor) executeVia(ctx context.Context, id CallID, raw RawToolSource, t *Item, args json.RawMessage, r *CallRequest) (json.RawMessage, error) {
	ctx = WithElicit(ctx, r.Elicit)
	var progress func(json.RawMessage)
	if r.ProgressToken != nil {
		progress = func(params json.RawMessage) { r.Notify(NotifyProgress, params) }
	}
	var body json.RawMessage
	var err error
	start := time.Now()
	switch {
	case isTopUp(t):
		// The credit is booked by the ledger's Deliver, with the result.
		q, err := v.topUpQuote(args)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUpstream, err)
		}
		return topUpResult(q.Price), nil
	case t.Kind == ItemPrompt || t.Kind == ItemResource:
		items, _ := v.cfg.Tools.(ItemSource) // item() found t through it
		if t.Kind == ItemPrompt {
			m, _ := promptArgs(args) // checked in admit
			body, err = items.GetPrompt(ctx, t.Name, m)
		} else {
			body, err = items.ReadResource(ctx, t.Name)
		}
	default:
		if raw != nil {
			body, err = raw.CallToolRaw(ctx, *t, args, r.ProgressToken, progress)
		}
		if raw == nil || errors.Is(err, ErrNotRaw) {
			body, err = v.cfg.Tools.CallTool(ctx, *t, args, r.ProgressToken, progress)
		}
	}
	v.obs.UpstreamCall(*t, id, time.Since(start), err)
	if err != nil {
		v.cfg.Log.Warn("vend: upstream call failed", "tool", t.Name, "err", err)
		return nil, fmt.Errorf("%w: %s is unavailable", ErrUpstream, t.Server)
	}
	return body, nil
}
