package vend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// schemeInvoice: the request waits for its own invoice. A new call is
// quoted and the request is told what to pay (notifications/payment_required,
// and progress heartbeats) on its own stream, then answered once the
// backend reports the payment: a hold invoice where the backend can, so
// that a failed call's money returns by itself. Nothing is presented:
// the call is released to the request that is waiting for it.
var schemeInvoice = Scheme{Name: SchemeInvoice, Credential: "none: the request waits for its invoice to be paid",
	Releases: ReleasesCall}

func (v *Vendor) backend(name Backend) PaymentBackend {
	for _, b := range v.cfg.Backends {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

// quote asks a backend for a payment and waits for it (or, with explicit
// gating, answers with the ways to pay).
func (c *pending) quote(ctx context.Context, slot *unpaidQuote, turn *ticket) (CallResult, error) {
	p, res, err := c.requestPayment(ctx, slot, turn)
	if p == nil {
		return res, err
	}
	c.pay = p
	// The request stays counted (limits.go) until it is paid or ends.
	return c.awaitPayment(ctx)
}

// requestPayment asks a backend for the call's payment. A nil payment
// means the call is answered by res and err (explicit gating, a limit, no
// backend). The request holds an unpaid slot (slot, held by admit, or
// taken here when nil) until it is paid or ends.
func (c *pending) requestPayment(ctx context.Context, slot *unpaidQuote, turn *ticket) (*Payment, CallResult, error) {
	v, call, r := c.v, &c.call, c.r
	v.failpoint(FailAfterQuote)
	b := v.chooseBackend(r.PMIs, r.InvoiceFrom)
	if b == nil {
		v.leaveIssuing(turn)
		c.endUnpaid(ctx, "no payment method")
		return nil, CallResult{}, ErrNoPaymentMethod
	}
	if slot == nil {
		var err error
		if slot, err = v.holdUnpaid(ctx, r); err != nil {
			v.leaveIssuing(turn)
			c.endUnpaid(ctx, "too many unpaid requests")
			return nil, CallResult{}, err
		}
	}
	turn, err := v.startIssuing(ctx, r, turn)
	if err != nil {
		v.unpaid.release(slot)
		c.endUnpaid(context.WithoutCancel(ctx), "client left")
		return nil, CallResult{}, err
	}
	defer v.leaveIssuing(turn)
	if err := v.enterUnpaid(slot); err != nil {
		v.unpaid.release(slot)
		c.endUnpaid(ctx, "too many unpaid requests")
		return nil, CallResult{}, err
	}
	hs, canHold := b.(HoldSettler)
	p, err := b.Request(ctx, PaymentRequest{
		CallID: call.ID, Amount: call.Price, Memo: describe(&c.t, call.Price), Expiry: v.cfg.TTL,
		Hold: canHold && hs.CanHold() && !r.Explicit,
	})
	if err != nil {
		v.unpaid.release(slot)
		c.endUnpaid(ctx, "payment request failed")
		v.cfg.Log.Error("vend: payment request failed", "tool", c.t.Name, "backend", b.Name(), "err", err)
		return nil, CallResult{}, fmt.Errorf("%w: the payment backend is unavailable", ErrPaymentFailed)
	}
	v.unpaid.bind(slot, &p)
	if r.Explicit { // a grant waits in the ledger, not in memory
		c.pay = &p
		e := c.required()
		if r.PaymentTokens && r.secretsAllowed() {
			if e.Token, err = c.issueToken(ctx); err != nil {
				// The client never sees this invoice: it expires unpaid.
				v.cfg.Log.Error("vend: issuing a payment token failed", "tool", c.t.Name, "call", int64(call.ID), "err", err)
				return nil, CallResult{}, fmt.Errorf("payment token of call %d: %w", call.ID, err)
			}
		}
		if err := c.addChallenges(ctx, e); err != nil {
			return nil, CallResult{}, err
		}
		return nil, CallResult{}, e
	}
	return &p, CallResult{}, nil
}

// options are the ways to pay for a call: its payment request, and a Cashu
// token when a backend takes tokens. Their description says how the price
// was computed.
func (c *pending) options() []PaymentOption {
	v, p := c.v, c.pay
	ttl := int64(time.Until(p.ExpiresAt).Seconds())
	desc := v.describe(&c.t, c.r.Arguments, p.Amount)
	opts := []PaymentOption{{Amount: p.Amount.SatsCeil(), PayReq: p.Bolt11, PMI: PMILightning, Description: desc, TTL: ttl}}
	for _, b := range v.cfg.Backends {
		if _, ok := b.(TokenAcceptor); ok {
			opts = append(opts, PaymentOption{Amount: p.Amount.SatsCeil(), PMI: PMICashu,
				Description: desc + "; send a Cashu token in _meta[\"" + MetaCashuToken + "\"]", TTL: ttl})
			break
		}
	}
	return opts
}

// required is explicit gating's answer for the call's payment c.pay: the
// ways to pay, the amount, invoice and expiry, and the token the request
// presented (a new call's is issued by requestPayment).
func (c *pending) required() *PaymentRequiredError {
	p := c.pay
	return &PaymentRequiredError{Options: c.options(), Amount: p.Amount, Invoice: p.Bolt11, ExpiresAt: p.ExpiresAt,
		Token: c.r.PaymentToken}
}

// awaitPayment tells the client what to pay and waits for the backend to
// report the payment, then runs the call.
func (c *pending) awaitPayment(ctx context.Context) (CallResult, error) {
	p, err := c.waitPaid(ctx)
	if err != nil {
		return CallResult{}, err // the client left (the request stays payable), or it was withdrawn
	}
	if p.State != PaymentOpen {
		c.v.unpaid.end(p.Ref)
	}
	c.pay = p
	return c.afterPayment(ctx)
}

// waitPaid sends payment_required and waits for the payment's next state,
// sending progress heartbeats meanwhile. It returns ctx's error if the
// client leaves first: the request then stays payable, and a replay of
// the same request (or the orphan path of onPayment) picks it up. A
// payment reported by the time the client leaves is returned as if the
// client had stayed: the caller runs (or refunds) the call.
//
// Every call waiting for payment is parked in this loop, on a stack that
// also holds its front's and CallTool's frames: the loop keeps only
// channels in its frame, with one deferred call, and what each wake-up
// does is in functions that have returned by the time it parks again
// (BenchmarkPendingQuotesRSS: 2 KB more here doubled every waiting
// goroutine's stack, to 16 KB).
func (c *pending) waitPaid(ctx context.Context) (*Payment, error) {
	v, p := c.v, c.pay
	w := c.startWaiting()
	defer w.stop(v, p.Ref)
	// The payment may have arrived already (a replay after a restart).
	if cur := c.reported(ctx, w.events); cur != nil {
		return cur, nil
	}
	v.failpoint(FailAfterInvoice)
	c.notifyRequired()
	c.showPayPage(ctx) // after: the front's elicitation goes on the stream notifyRequired opened
	events, poll, beat, expiry, shed := w.events, w.poll.c(), w.beat.c(), w.expiry.C, w.shed
	beats := 0
	for {
		select {
		case paid := <-events:
			return paid, nil
		case <-poll:
			if cur := c.reported(ctx, events); cur != nil {
				return cur, nil
			}
		case <-beat:
			beats++
			notifyHeartbeat(c.r, beats)
		case <-expiry:
			return v.expireUnreported(ctx, p), nil
		case <-shed:
			return v.withdrawn(ctx, p, c.r)
		case <-ctx.Done():
			return leftWaiting(ctx, v, p, events)
		}
	}
}

// waiting is what a call waiting for its payment holds (waitPaid).
type waiting struct {
	events chan *Payment // its report (waiterSet)
	// poll reads the ledger now and then when sharing it: another
	// instance may record the payment (it saw LND's report first).
	poll *ticker
	beat *ticker // progress heartbeats, when the client gave a progressToken
	// expiry is a backstop: the backend reports expiry.
	expiry *time.Timer
	shed   <-chan struct{} // closed when the request is withdrawn (unpaidBook)
}

// startWaiting registers c as waiting for its payment's report, and
// starts its timers.
func (c *pending) startWaiting() *waiting {
	v, p := c.v, c.pay
	w := &waiting{events: v.waiters.add(p.Ref), shed: v.unpaid.shedOf(p.Ref),
		expiry: time.NewTimer(time.Until(p.ExpiresAt) + time.Minute)}
	if v.cfg.Shared.Leases != nil {
		w.poll = newTicker(v.cfg.Shared.Poll)
	}
	if c.r.ProgressToken != nil { // nobody to send heartbeats to otherwise
		w.beat = newTicker(v.cfg.Heartbeat)
	}
	return w
}

// stop ends what startWaiting started.
func (w *waiting) stop(v *Vendor, ref string) {
	v.waiters.remove(ref, w.events)
	w.expiry.Stop()
	w.poll.stop()
	w.beat.stop()
}

// ticker is a time.Ticker whose nil value never ticks.
type ticker time.Ticker

func newTicker(d time.Duration) *ticker { return (*ticker)(time.NewTicker(d)) }

func (t *ticker) c() <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

func (t *ticker) stop() {
	if t != nil {
		(*time.Ticker)(t).Stop()
	}
}

// reported reads c's payment from the ledger: nil while it is open, else
// its state, which the waiter events takes on (see waiterSet.take).
func (c *pending) reported(ctx context.Context, events chan *Payment) *Payment {
	ref := c.pay.Ref
	cur := c.v.currentPayment(ctx, ref)
	if cur == nil || cur.State == PaymentOpen {
		return nil
	}
	c.v.waiters.take(ref, events, time.Now())
	return cur
}

// leftWaiting ends the wait of a client that left, perhaps at the instant
// its payment was reported: once unwaited, a report either is in events
// already (then this call takes it on, as if the client stayed) or finds
// nobody waiting (the orphan path). Sharing the ledger, the change may be
// recorded by another instance, with no report here: the payment is then
// watched in the ledger (watchOrphans).
func leftWaiting(ctx context.Context, v *Vendor, p *Payment, events chan *Payment) (*Payment, error) {
	shared := v.cfg.Shared.Leases != nil
	if paid, ok := v.waiters.leave(p.Ref, events, shared, p.ExpiresAt.Add(time.Minute)); ok {
		return paid, nil
	}
	return nil, ctx.Err()
}

func (v *Vendor) currentPayment(ctx context.Context, ref string) *Payment {
	p, err := v.cfg.Ledger.Payment(ctx, ref)
	if err != nil {
		return nil
	}
	return &p
}

func (c *pending) notifyRequired() {
	c.r.Notify(NotifyPaymentRequired, c.options()[0])
}

func notifyHeartbeat(r *CallRequest, beats int) {
	r.Notify(NotifyProgress, map[string]any{"progressToken": r.ProgressToken, "progress": beats,
		"message": "waiting for payment"})
}

// expireUnreported handles a payment whose expiry passed without a report
// from its backend: it takes what the ledger says, else withdraws the
// request and calls it expired.
func (v *Vendor) expireUnreported(ctx context.Context, p *Payment) *Payment {
	if cur := v.currentPayment(ctx, p.Ref); cur != nil && cur.State != PaymentOpen {
		return cur
	}
	if b := v.backend(p.Backend); b != nil {
		b.Cancel(context.WithoutCancel(ctx), p.Ref)
	}
	expired := *p
	expired.State = PaymentExpired
	return &expired
}

// afterPayment runs a paid call, or tells the client its payment request
// expired.
func (c *pending) afterPayment(ctx context.Context) (CallResult, error) {
	v, p, r := c.v, c.pay, c.r
	ctx = Urgent(ctx) // the money is in
	switch p.State {
	case PaymentAccepted, PaymentSettled:
		v.failpoint(FailAfterSettlement)
		v.paid(r)
		r.Notify(NotifyPaymentAccepted, map[string]any{"amount": p.Amount.SatsCeil(), "pmi": PMILightning,
			"_meta": map[string]any{"payment_hash": p.Ref}})
		return c.run(ctx)
	default:
		r.Notify(NotifyPaymentRejected, map[string]any{"amount": p.Amount.SatsCeil(), "pmi": PMILightning,
			"message": "the payment request expired unpaid"})
		return CallResult{}, ErrPaymentExpired
	}
}

// endUnpaid ends a call that never got a payment request, or whose token
// was refused (its backend ended the payment; the call is no longer
// quoted then, which is fine).
func (c *pending) endUnpaid(ctx context.Context, reason string) {
	v := c.v
	if err := v.cfg.Ledger.CancelQuote(ctx, c.call.ID, reason); err != nil && !errors.Is(err, ErrIllegalTransition) {
		v.cfg.Log.Warn("vend: ending an unpaid call", "call", int64(c.call.ID), "err", err)
	}
}

// chooseBackend returns the backend that issues a call's invoice: the one
// the client asked for if the server has it and it is available, else the
// first available in the configured order (an Availability that says no
// is passed over: an NWC wallet out of reach falls back to the next), else
// the first; nil when the client cannot pay a Lightning invoice or there
// is no backend.
func (v *Vendor) chooseBackend(pmis []string, from Backend) PaymentBackend {
	if len(pmis) > 0 && !contains(pmis, PMILightning) {
		return nil
	}
	if len(v.cfg.Backends) == 0 {
		return nil
	}
	for _, b := range v.cfg.Backends {
		if from != "" && b.Name() == from && available(b) {
			return b
		}
	}
	for _, b := range v.cfg.Backends {
		if available(b) {
			return b
		}
	}
	return v.cfg.Backends[0]
}

func available(b PaymentBackend) bool {
	a, ok := b.(Availability)
	return !ok || a.Available()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
