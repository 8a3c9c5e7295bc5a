package vend

import (
	"context"
	"errors"
	"fmt"
)

// schemeReplay: the request key (transport, client, request id) of a call
// recorded before. The ledger binds a key to its call's Binding
// (ErrRequestReused otherwise), so a replay is its own client's, and gets
// what its call has come to: the wait for its payment again, the run of
// a paid call, or the stored answer.
var schemeReplay = Scheme{Name: SchemeReplay, Credential: "the request key (transport, client, request id) of a recorded call",
	Releases: ReleasesCall}

// resume answers a call the ledger knows already: a replayed request, or
// an explicit-gating grant being used.
func (c *pending) resume(ctx context.Context) (CallResult, error) {
	v := c.v
	if done := v.running.done(c.call.ID); done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return CallResult{}, ctx.Err()
		}
		if cur, err := v.cfg.Ledger.Call(ctx, c.call.ID); err == nil {
			c.call = cur
		}
	}
	switch c.call.State {
	case CallDelivered, CallFailed, CallRefunded, CallExecuting:
		if c.byToken { // ran, runs or ended for another request
			return CallResult{}, ErrTokenUsed
		}
	}
	switch c.call.State {
	case CallDelivered, CallFailed, CallRefunded:
		res, err := v.cfg.Ledger.Result(ctx, c.call.ID)
		if errors.Is(err, ErrResultExpired) {
			// Its answer was pruned after the retention period: said so,
			// never answered empty, never run again (a refund still
			// travels with the error).
			if c.call.State == CallRefunded {
				return c.refunded(ctx, CallResult{}, err)
			}
			return CallResult{}, err
		}
		if err != nil {
			return c.refunded(ctx, CallResult{}, fmt.Errorf("%w: the call was refunded before it ran", ErrPaymentFailed))
		}
		if c.call.State == CallRefunded {
			return c.refunded(ctx, CallResult{Body: res.Body, IsError: res.IsError}, nil)
		}
		return CallResult{Body: res.Body, IsError: res.IsError}, nil
	case CallExpired, CallCanceled:
		// Paid after all (late, or a swap learned late): owed back.
		return c.refunded(ctx, CallResult{}, ErrPaymentExpired)
	case CallQuoted:
		return c.quote(ctx, nil, nil)
	case CallExecuting:
		return CallResult{}, &PaymentPendingError{RetryAfter: 5}
	}
	ps, err := v.cfg.Ledger.CallPayments(ctx, c.call.ID)
	if err != nil || len(ps) == 0 {
		return CallResult{}, fmt.Errorf("call %d has no payment: %w", c.call.ID, ErrPaymentFailed)
	}
	c.pay = &ps[len(ps)-1]
	if c.call.State == CallPaid {
		return c.run(ctx)
	}
	// awaiting_payment (as the call read; its payment, read after it, may
	// be settled by now: awaitProven takes either on)
	if c.proven {
		return c.awaitProven(ctx)
	}
	if c.r.Explicit {
		if c.pay.State == PaymentOpen && c.r.L402 && c.r.Macaroon == nil {
			// An L402 client's repeat without a credential: the same
			// invoice again, with a macaroon (and MPP, x402 challenges)
			// of its own.
			e := c.required()
			if err := c.addChallenges(ctx, e); err != nil {
				return CallResult{}, err
			}
			return CallResult{}, e
		}
		if c.pay.State == PaymentOpen {
			return CallResult{}, &PaymentPendingError{RetryAfter: 2, Token: c.r.PaymentToken, ExpiresAt: c.pay.ExpiresAt}
		}
		return CallResult{}, c.required()
	}
	return c.awaitPayment(ctx)
}
