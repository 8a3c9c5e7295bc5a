package vend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Config wires a Vendor.
type Config struct {
	Ledger Ledger
	// Backends take payments, in order of preference for Lightning
	// invoices (an LND backend first, a Cashu mint-quote backend second).
	// A backend that is also a TokenAcceptor takes Cashu tokens.
	Backends []PaymentBackend
	Tools    ToolSource
	// Prices is the initial price book; SetPrices replaces it.
	Prices PriceBook
	// TTL is how long a payment request stays payable (default 10 min).
	TTL time.Duration
	// Heartbeat is how often a call waiting for payment sends a progress
	// notification when the client gave a progressToken (default 10 s).
	Heartbeat time.Duration
	// ExecTimeout bounds one upstream execution (default 10 min).
	ExecTimeout time.Duration
	// ToolWait is how long a paid call run from the ledger (at start,
	// or paid after its client left) waits for an upstream to offer its
	// tool (prompt, resource) before it is refunded (default 1 min).
	ToolWait time.Duration
	// MaxUnpaidPerClient and MaxUnpaidTotal bound the open unpaid
	// payment requests of one client and of all (see the package doc,
	// Limits; defaults DefaultMaxUnpaidPerClient, DefaultMaxUnpaidTotal).
	MaxUnpaidPerClient, MaxUnpaidTotal int
	// RequestsPerMinute bounds the calls (free or priced) of one client
	// (Source, else Client); 0: unlimited.
	RequestsPerMinute int
	Log               *slog.Logger
	// Failpoint, if set, is called at the named steps of a priced call
	// (FailAfterQuote, FailAfterInvoice, FailAfterSettlement,
	// FailDuringExecution, FailAfterResult). Crash tests make it kill the
	// process; production leaves it nil.
	Failpoint func(step string)
}

// The steps of a priced call a Failpoint is called at.
const (
	FailAfterQuote      = "after_quote"      // the call is recorded, no payment requested yet
	FailAfterInvoice    = "after_invoice"    // the payment request is recorded, not yet sent to the client
	FailAfterSettlement = "after_settlement" // the payment is recorded, the call has not started
	FailDuringExecution = "during_execution" // the call is claimed and its upstream call under way
	FailAfterResult     = "after_result"     // the result is stored, the answer not yet sent
)

func (v *Vendor) failpoint(step string) {
	if v.cfg.Failpoint != nil {
		v.cfg.Failpoint(step)
	}
}

// Vendor is capvend's vending runtime: it prices a tools/call, takes the
// payment through a backend, runs the tool exactly once on its upstream,
// and records every step in the ledger. Fronts (MCP HTTP, stdio, Nostr)
// call Tools and CallTool; Run must be running for payments to be seen.
type Vendor struct {
	cfg     Config
	schemas schemaCache
	prices  atomic.Pointer[bookRef] // the current price book; cfg.Prices is only the first

	unpaid *unpaidBook  // open unpaid payment requests (limits.go)
	issue  *issueQueue  // turns to issue a payment request (issue.go)
	payers payerSet     // limit keys that paid in this run (issue.go)
	rate   *rateLimiter // calls per client and minute (limits.go)

	mu      sync.Mutex
	waiters map[string][]chan PaymentEvent // by payment ref
	running map[CallID]chan struct{}       // calls executing in this process; closed when done
	bg      context.Context                // Run's context, for work started by payment reports
	bgWG    sync.WaitGroup                 // that work; Run waits for it
	started time.Time                      // calls created before this are a previous run's
}

// New checks cfg and returns a Vendor. It starts nothing.
func New(cfg Config) (*Vendor, error) {
	if cfg.Ledger == nil || cfg.Tools == nil || cfg.Prices == nil {
		return nil, errors.New("vend: a ledger, a tool source and a price book are required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Minute
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.ExecTimeout <= 0 {
		cfg.ExecTimeout = 10 * time.Minute
	}
	if cfg.ToolWait <= 0 {
		cfg.ToolWait = time.Minute
	}
	if cfg.MaxUnpaidPerClient <= 0 {
		cfg.MaxUnpaidPerClient = DefaultMaxUnpaidPerClient
	}
	if cfg.MaxUnpaidTotal <= 0 {
		cfg.MaxUnpaidTotal = DefaultMaxUnpaidTotal
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	v := &Vendor{cfg: cfg, waiters: map[string][]chan PaymentEvent{},
		unpaid: newUnpaidBook(cfg.MaxUnpaidPerClient, cfg.MaxUnpaidTotal), issue: newIssueQueue(maxIssuing, maxWaiting),
		rate: &rateLimiter{perMinute: cfg.RequestsPerMinute, maxKeys: DefaultMaxRateKeys},
		// The ledger stamps milliseconds: a call of this run is stamped at
		// or after the millisecond New runs in.
		running: map[CallID]chan struct{}{}, started: time.Now().Truncate(time.Millisecond).Add(-time.Millisecond)}
	v.SetPrices(cfg.Prices)
	return v, nil
}

// bookRef holds a PriceBook for atomic.Pointer.
type bookRef struct{ b PriceBook }

// SetPrices makes b the price book, atomically, for a configuration
// reload: calls quoted from now on, Tools and ListedPrice use b at once;
// calls already quoted keep the price they were recorded with. b must not
// be nil (SetPrices panics).
func (v *Vendor) SetPrices(b PriceBook) {
	if b == nil {
		panic("vend: SetPrices(nil)")
	}
	v.prices.Store(&bookRef{b})
}

func (v *Vendor) book() PriceBook { return v.prices.Load().b }

// Run runs every backend's watcher until ctx ends, routing what they
// report to the calls waiting for it. It returns ctx's error, or the first
// backend error that makes watching impossible.
func (v *Vendor) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v.mu.Lock()
	v.bg = ctx
	v.mu.Unlock()
	defer v.bgWG.Wait() // after cancel: background work sees ctx end
	errs := make(chan error, len(v.cfg.Backends))
	var wg sync.WaitGroup
	for _, b := range v.cfg.Backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.Run(ctx, v.onPayment)
			if ctx.Err() == nil {
				errs <- fmt.Errorf("%s backend: %w", b.Backend(), err)
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := v.Recover(ctx); err != nil && ctx.Err() == nil {
			v.cfg.Log.Error("vend: recover", "err", err)
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// onPayment routes a backend's report to the call waiting for it. A hold
// invoice locked in for a call nobody waits for any more (the client left)
// is canceled at once: the money goes back to the client by Lightning.
func (v *Vendor) onPayment(e PaymentEvent) {
	if e.Payment.State != PaymentOpen {
		v.unpaid.end(e.Payment.Ref)
	}
	// Delivered under the lock (the sends never block): a waiter is
	// either still registered and gets the event in its channel, or has
	// unwaited and the event takes the orphan path below. A waiter that
	// leaves looks in its channel after unwaiting (waitPaid), so an event
	// is never dropped between the two.
	v.mu.Lock()
	waiting := len(v.waiters[e.Payment.Ref])
	for _, ch := range v.waiters[e.Payment.Ref] {
		select {
		case ch <- e:
		default: // the waiter has what it needs already
		}
	}
	v.mu.Unlock()
	if waiting > 0 {
		return
	}
	switch {
	case e.Payment.State == PaymentAccepted && e.Payment.Kind == KindHoldInvoice:
		v.background(func(ctx context.Context) { v.abandonHold(e.Payment) })
	case e.Payment.State == PaymentSettled && e.Payment.Kind != KindHoldInvoice:
		// Paid, and nobody waits (the client left, or capvend restarted):
		// run it now and keep the answer for the client's replay.
		v.background(func(ctx context.Context) { v.runStored(ctx, e.Payment.CallID, false, time.Now().Add(v.cfg.ToolWait)) })
	}
}

// background runs fn in a goroutine tracked by Run, with Run's context
// (reports only arrive while Run runs).
func (v *Vendor) background(fn func(ctx context.Context)) {
	v.mu.Lock()
	ctx := v.bg
	v.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	v.bgWG.Add(1)
	go func() {
		defer v.bgWG.Done()
		fn(withoutClient(ctx))
	}()
}

// resume answers a call the ledger knows already: a replayed request, or
// an explicit-gating grant being used.
func (v *Vendor) resume(ctx context.Context, call *Call, t *Tool, args json.RawMessage, r *CallRequest) (CallResult, error) {
	if done := v.runningDone(call.ID); done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return CallResult{}, ctx.Err()
		}
		if c, err := v.cfg.Ledger.Call(ctx, call.ID); err == nil {
			call = &c
		}
	}
	switch call.State {
	case CallDelivered, CallFailed, CallRefunded:
		res, err := v.cfg.Ledger.Result(ctx, call.ID)
		if err != nil {
			return v.refunded(ctx, call, CallResult{}, fmt.Errorf("%w: the call was refunded before it ran", ErrPaymentFailed))
		}
		if call.State == CallRefunded {
			return v.refunded(ctx, call, CallResult{Body: res.Body, IsError: res.IsError}, nil)
		}
		return CallResult{Body: res.Body, IsError: res.IsError}, nil
	case CallExpired, CallCanceled:
		// Paid after all (late, or a swap learned late): owed back.
		return v.refunded(ctx, call, CallResult{}, ErrPaymentExpired)
	case CallQuoted:
		return v.quote(ctx, call, t, args, r, nil, nil)
	case CallExecuting:
		return CallResult{}, &PaymentPendingError{RetryAfter: 5}
	}
	ps, err := v.cfg.Ledger.CallPayments(ctx, call.ID)
	if err != nil || len(ps) == 0 {
		return CallResult{}, fmt.Errorf("call %d has no payment: %w", call.ID, ErrPaymentFailed)
	}
	p := ps[len(ps)-1]
	if call.State == CallPaid {
		return v.run(ctx, call, &p, t, args, r)
	}
	// awaiting_payment
	if r.Explicit {
		if p.State == PaymentOpen {
			return CallResult{}, &PaymentPendingError{RetryAfter: 2}
		}
		return CallResult{}, &PaymentRequiredError{Options: v.options(t, &p, r)}
	}
	return v.awaitPayment(ctx, call, &p, t, args, r)
}

// run executes a paid call exactly once, with the tool and arguments
// recorded with it, and records its end: delivered (a hold invoice
// settled first), or failed and refunded (a hold invoice canceled,
// returning the money). live and liveArgs are the request's own: they only
// answer a request that finds the call running or run already, never
// execute. A call that cannot run as recorded is refunded (ErrUpstream).
func (v *Vendor) run(ctx context.Context, call *Call, p *Payment, live *Tool, liveArgs json.RawMessage, r *CallRequest) (CallResult, error) {
	ctx = Urgent(ctx) // paid
	// Requests for the same call in this process queue behind the first;
	// the ledger's claim keeps other processes out.
	done := v.startRunning(call.ID)
	if done == nil {
		return v.resume(ctx, call, live, liveArgs, r)
	}
	// The money is in: the claim, the run and its records go ahead even
	// if the client leaves now (its answer waits for the replay).
	res, ranAlready, err := v.claimAndFinish(context.WithoutCancel(ctx), call, p, r)
	// Unregistered before resuming: resume waits for a running call's
	// channel, and this run's own would never close.
	v.stopRunning(call.ID, done)
	if ranAlready != nil {
		return v.resume(ctx, ranAlready, live, liveArgs, r) // its stored answer
	}
	return res, err
}

// claimAndFinish claims the call for an execution of its recorded tool
// and arguments and runs it. A non-nil *Call is the call as it is now
// when it was not paid any more (it ran, or ended, elsewhere).
func (v *Vendor) claimAndFinish(ctx context.Context, call *Call, p *Payment, r *CallRequest) (CallResult, *Call, error) {
	t, args, bind, err := v.storedItem(ctx, call)
	if err == nil {
		_, err = v.cfg.Ledger.StartExecution(ctx, call.ID, bind)
	}
	if err == nil {
		res, err := v.finish(ctx, call, p, &t, args, r)
		return res, nil, err
	}
	if c, cerr := v.cfg.Ledger.Call(ctx, call.ID); cerr == nil && c.State != CallPaid && c.State != CallExecuting {
		return CallResult{}, &c, nil
	}
	if !errors.Is(err, errNoArguments) && !errors.Is(err, errItemGone) && !errors.Is(err, ErrExecutionMismatch) {
		return CallResult{}, nil, err
	}
	v.cfg.Log.Error("vend: a paid call cannot run as recorded; refunding", "call", int64(call.ID), "err", err)
	if rerr := v.refundPaid(ctx, call.ID, unrunnable(err)); rerr != nil {
		return CallResult{}, nil, rerr
	}
	return CallResult{}, nil, fmt.Errorf("%w: the call could not run; the payment is refunded", ErrUpstream)
}

// finish runs a claimed call on its upstream and records its end.
func (v *Vendor) finish(ctx context.Context, call *Call, p *Payment, t *Tool, args json.RawMessage, r *CallRequest) (CallResult, error) {
	// The call runs to its end even if the client leaves: it is paid.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.cfg.ExecTimeout)
	defer cancel()
	start := time.Now()
	body, err := v.execute(ectx, t, args, r)
	v.failpoint(FailDuringExecution)
	outcome := "delivered"
	defer func() {
		v.cfg.Log.Info("vend: priced call", "kind", string(t.Kind.Or()), "tool", t.Name, "price_msat", int64(call.Price), "backend", p.Backend,
			"payment", p.Ref, "outcome", outcome, "duration", time.Since(start))
	}()
	if err == nil && !isErrorResult(body) {
		if p.Kind == KindHoldInvoice {
			if hs, ok := v.backend(p.Backend).(HoldSettler); ok {
				if _, err := hs.SettleHeld(ectx, p.Ref); err != nil {
					outcome = "settle failed"
					return v.fail(ectx, call, p, nil, "could not settle the hold invoice: "+err.Error())
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
	return v.fail(ectx, call, p, body, reason)
}

// fail records a failed call and gives the money back: a hold invoice is
// canceled (Lightning returns the money), anything else is booked as owed.
func (v *Vendor) fail(ctx context.Context, call *Call, p *Payment, body json.RawMessage, reason string) (CallResult, error) {
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
		return v.refunded(ctx, call, CallResult{}, fmt.Errorf("%w: %s", ErrUpstream, "the tool could not run; the payment is refunded"))
	}
	return v.refunded(ctx, call, CallResult{Body: body, IsError: true}, nil)
}

// execute runs the tool on its upstream, forwarding progress and passing
// the client's Elicit along (in ctx).
func (v *Vendor) execute(ctx context.Context, t *Tool, args json.RawMessage, r *CallRequest) (json.RawMessage, error) {
	ctx = WithElicit(ctx, r.Elicit)
	var progress func(json.RawMessage)
	if r.ProgressToken != nil {
		progress = func(params json.RawMessage) { r.Notify(NotifyProgress, params) }
	}
	var body json.RawMessage
	var err error
	switch t.Kind {
	case KindPrompt, KindResource:
		items, _ := v.cfg.Tools.(ItemSource) // item() found t through it
		if t.Kind == KindPrompt {
			m, _ := promptArgs(args) // checked in admit
			body, err = items.GetPrompt(ctx, t.Name, m)
		} else {
			body, err = items.ReadResource(ctx, t.Name)
		}
	default:
		body, err = v.cfg.Tools.CallTool(ctx, *t, args, r.ProgressToken, progress)
	}
	if err != nil {
		v.cfg.Log.Warn("vend: upstream call failed", "tool", t.Name, "err", err)
		return nil, fmt.Errorf("%w: %s is unavailable", ErrUpstream, t.Server)
	}
	return body, nil
}
