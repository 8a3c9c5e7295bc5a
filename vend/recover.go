package vend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
)

// schemeRecover: no request presents anything. capvend itself runs (or
// refunds) a paid call no request waits for: one a previous run left, or
// one whose client left before its payment was reported. Its answer waits
// in the ledger for the call's own request key (SchemeReplay).
var schemeRecover = Scheme{Name: SchemeRecover, Credential: "none: capvend finishes a paid call no request waits for",
	Releases: ReleasesCall}

// recoverWorkers bounds how many calls Recover handles at once.
const recoverWorkers = 8

// recoverFull, if set (by tests, before Run), is told each time Recover
// finds every worker busy, with how many calls it had handed out so far:
// it then waits for a worker to finish.
var recoverFull func(started int)

// Recover finishes what a previous run of capvend left: paid calls that
// never ran are run, idempotent calls interrupted while running are run
// again, and other interrupted calls are refunded (a hold invoice is
// canceled); a paid call that cannot run as recorded (no recorded
// arguments, its tool not offered within Config.ToolWait) is refunded
// with the reason rather than left paid for the next start. Their answers
// wait in the ledger for the clients' replays. The calls this Vendor
// recorded (its run id, NewCall.Run) are left to the requests serving
// them, and so are those of runs still alive (with Config.Shared.Leases:
// another instance holds the run's lease). At most recoverWorkers calls
// are handled at once. Run calls it once the backends watch (sharing the
// ledger: on the holder of LeaseWork, every SharedConfig.Renew).
func (v *Vendor) Recover(ctx context.Context) error {
	ctx = withoutClient(ctx)
	calls, err := v.cfg.Ledger.CallsIn(ctx, CallQuoted, CallPaid, CallExecuting, CallFailed)
	if err != nil {
		return err
	}
	until := time.Now().Add(v.cfg.ToolWait) // one wait for the upstreams, not one per call
	var g errgroup.Group
	g.SetLimit(recoverWorkers)
	var stopped error
	started := 0 // calls handed to a worker so far
	live := liveRuns{v: v}
	for _, c := range calls {
		if c.Run == v.runID {
			continue // this run's own
		}
		if alive, err := live.alive(ctx, c.Run); err != nil || alive {
			continue // another instance's, serving it (or unknown: next time)
		}
		if c.State == CallQuoted {
			// Stopped before its payment request: nothing was asked
			// of the client.
			if err := v.cfg.Ledger.CancelQuote(ctx, c.ID, "interrupted before its payment request"); err != nil {
				v.cfg.Log.Warn("vend: recover: cancel quote", "call", int64(c.ID), "err", err)
			}
			continue
		}
		if stopped = ctx.Err(); stopped != nil {
			break // stopping: the next start goes on
		}
		work := func() error {
			if err := ctx.Err(); err != nil {
				return err // stopped while it waited
			}
			v.recoverCall(ctx, c, until)
			return nil
		}
		if !g.TryGo(work) {
			if recoverFull != nil {
				recoverFull(started)
			}
			g.Go(work) // waits for a free worker
		}
		started++
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return stopped
}

// recoverCall finishes one call a previous run left (see Recover).
func (v *Vendor) recoverCall(ctx context.Context, c Call, until time.Time) {
	switch {
	case c.State == CallFailed:
		v.refundFailed(ctx, c)
	case c.State == CallExecuting && !c.Idempotent:
		v.refundInterrupted(ctx, c)
	case c.State == CallPaid:
		if ps, err := v.cfg.Ledger.CallPayments(ctx, c.ID); err == nil && len(ps) > 0 &&
			ps[len(ps)-1].State == PaymentAccepted && v.running.done(c.ID) == nil {
			// A locked-in hold invoice whose client is gone.
			v.abandonHold(ps[len(ps)-1])
			return
		}
		v.runStored(ctx, c.ID, false, until)
	default:
		v.runStored(ctx, c.ID, true, until)
	}
}

// runStored runs a paid call from its recorded arguments (resume: a call
// left executing by a crash, idempotent) and stores the answer. It waits
// until until for an upstream to offer the call's tool; a call that
// cannot run as recorded (no recorded arguments, the tool not offered,
// its name now leading elsewhere) is refunded with the reason, so it is
// never left paid or executing to fail the same way at every start.
func (v *Vendor) runStored(ctx context.Context, id CallID, resume bool, until time.Time) {
	log := v.cfg.Log.With("call", int64(id))
	call, err := v.cfg.Ledger.Call(ctx, id)
	if err != nil {
		log.Error("vend: recover: load call", "err", err)
		return
	}
	name, args, explicit, aerr := v.cfg.Ledger.CallArguments(ctx, id)
	if explicit && !resume {
		return // a paid explicit-gating grant waits for its client's repeat
	}
	p, err := v.lastPayment(ctx, call)
	if err != nil {
		log.Error("vend: recover: no payment", "err", err)
		return
	}
	t := Item{Kind: call.Kind.Or(), Name: name}
	if aerr == nil {
		var ok bool
		if t, ok = v.awaitTool(ctx, call.Kind.Or(), name, until); !ok && ctx.Err() != nil {
			return // stopping: the next start takes it up
		}
	}
	r := CallRequest{Kind: call.Kind, Transport: call.Transport, Client: call.Client, RequestID: call.RequestID, Name: name, Arguments: args,
		Notify: func(string, any) {}}
	c := &pending{v: v, call: call, pay: &p, t: t, args: args, r: &r, scheme: SchemeRecover}
	if !resume {
		if _, err := c.run(ctx); err != nil && !errors.Is(err, ErrUpstream) {
			log.Warn("vend: recover: run", "err", err)
		}
		return
	}
	done := v.running.start(id)
	if done == nil {
		return
	}
	defer v.running.stop(id, done)
	t, args, bind, err := v.storedItem(ctx, &call)
	if err == nil {
		_, err = v.cfg.Ledger.ResumeExecution(ctx, id, bind, call.Released(SchemeRecover))
	}
	if err != nil && !errors.Is(err, errNoArguments) && !errors.Is(err, errItemGone) && !errors.Is(err, ErrExecutionMismatch) {
		log.Error("vend: recover: resume", "err", err)
		return
	}
	if err != nil {
		log.Error("vend: recover: an interrupted call cannot run again as recorded; refunding", "err", err)
		c.fail(ctx, nil, "interrupted by a restart, and "+unrunnable(err))
		return
	}
	log.Info("vend: recover: running an interrupted idempotent call again", "tool", name)
	c.finish(ctx, &t, args)
}

// Why a recorded call cannot run (storedItem's errors).
var (
	errNoArguments = errors.New("no recorded arguments")
	errItemGone    = errors.New("its tool (prompt, resource) is not offered")
)

// unrunnable says in a few words why a paid call could not run: the
// reason recorded with its refund.
func unrunnable(err error) string {
	switch {
	case errors.Is(err, errNoArguments):
		return "it cannot run: no arguments were recorded with it"
	case errors.Is(err, errItemGone):
		return "it cannot run: its tool is no longer offered"
	case errors.Is(err, ErrExecutionMismatch):
		return "it cannot run: its name now leads to another upstream tool"
	}
	return "it cannot run: " + err.Error()
}

// awaitTool waits until deadline for an upstream to offer the tool
// (prompt, resource).
func (v *Vendor) awaitTool(ctx context.Context, kind ItemKind, name string, deadline time.Time) (Item, bool) {
	for {
		if t, ok := v.item(kind, name); ok {
			return t, true
		}
		if time.Now().After(deadline) {
			return Item{}, false
		}
		select {
		case <-ctx.Done():
			return Item{}, false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// refundInterrupted refunds a non-idempotent call a crash interrupted: it
// may or may not have had its effect, so it is never run again.
func (v *Vendor) refundInterrupted(ctx context.Context, c Call) {
	p, err := v.lastPayment(ctx, c)
	if err != nil {
		return
	}
	v.cfg.Log.Warn("vend: recover: refunding a call interrupted while it ran", "call", int64(c.ID), "tool", c.Name)
	pc := &pending{v: v, call: c, pay: &p, r: &CallRequest{Transport: c.Transport, Client: c.Client, Notify: func(string, any) {}},
		scheme: SchemeRecover}
	pc.fail(ctx, nil, "interrupted by a restart while it ran; not run again")
}

// refundFailed completes the refund of a call that failed just before a
// crash.
func (v *Vendor) refundFailed(ctx context.Context, c Call) {
	p, err := v.lastPayment(ctx, c)
	if err != nil {
		return
	}
	if p.Kind == KindHoldInvoice && p.State == PaymentAccepted {
		if b := v.backend(p.Backend); b != nil {
			if err := b.Cancel(ctx, p.Ref); err != nil {
				return
			}
		}
	}
	if err := v.cfg.Ledger.Refund(ctx, c.ID, c.Reason); err != nil {
		v.cfg.Log.Warn("vend: recover: refund", "call", int64(c.ID), "err", err)
	}
}

func (v *Vendor) abandonHold(p Payment) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := v.refundPaid(ctx, p.CallID, "client left before the call ran; hold invoice canceled")
	switch {
	case errors.Is(err, ErrIllegalTransition):
		// The call had ended already (canceled by a ledger restore,
		// refunded meanwhile): its hold invoice is canceled, and
		// nothing is owed.
		v.cfg.Log.Info("vend: hold invoice of an ended call canceled", "call", int64(p.CallID), "payment_hash", p.Ref)
	case err != nil:
		v.cfg.Log.Warn("vend: refund of an abandoned call", "call", int64(p.CallID), "payment_hash", p.Ref, "err", err)
	}
}

// refundPaid gives back the money of a paid call that never ran: a
// locked-in hold invoice is canceled (Lightning returns the money), a
// settled payment is booked as owed; the call becomes refunded with
// reason.
func (v *Vendor) refundPaid(ctx context.Context, id CallID, reason string) error {
	ps, err := v.cfg.Ledger.CallPayments(ctx, id)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.Kind == KindHoldInvoice && p.State == PaymentAccepted {
			b := v.backend(p.Backend)
			if b == nil {
				return fmt.Errorf("hold invoice %s: no %s backend to cancel it", p.Ref, p.Backend)
			}
			if err := b.Cancel(ctx, p.Ref); err != nil {
				return fmt.Errorf("canceling hold invoice %s: %w", p.Ref, err)
			}
		}
	}
	return v.cfg.Ledger.Refund(ctx, id, reason)
}

// lastPayment is what paid call c: its newest payment, or its credit draw
// (a Payment of BackendCredit, in memory only).
func (v *Vendor) lastPayment(ctx context.Context, c Call) (Payment, error) {
	ps, err := v.cfg.Ledger.CallPayments(ctx, c.ID)
	if err != nil {
		return Payment{}, err
	}
	if len(ps) > 0 {
		return ps[len(ps)-1], nil
	}
	if account, err := v.cfg.Ledger.DrawOf(ctx, c.ID); err == nil {
		return creditPayment(c, account), nil
	}
	return Payment{}, fmt.Errorf("call %d has no payment: %w", c.ID, ErrNotFound)
}
