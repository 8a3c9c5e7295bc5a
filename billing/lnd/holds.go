package lnd

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"google.golang.org/grpc/status"

	"github.com/capvend/capvend/vend"
)

// OpenHolds is how many hold invoices are open (see Bounds).
func (b *Backend) OpenHolds() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.holds)
}

// Watching is how many hold invoices have a SubscribeSingleInvoice stream
// open now.
func (b *Backend) Watching() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.watching)
}

// takeHold reserves room for the hold invoice ref: false when MaxHold are
// open. Until heldHold marks it recorded, countHolds keeps it: the ledger
// does not list it yet.
func (b *Backend) takeHold(ref string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.holds) >= b.cfg.MaxHold {
		return false
	}
	b.holds[ref] = time.Time{}
	return true
}

// heldHold marks the hold invoice ref recorded in the ledger: from now on a
// reconcile that does not find it unsettled there stops counting it.
func (b *Backend) heldHold(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.holds[ref]; ok {
		b.holds[ref] = time.Now()
	}
}

func (b *Backend) dropHold(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.holds, ref)
}

// countHolds makes the open hold invoices those of ps, the ledger's
// unsettled payments as of asked, plus those being issued or recorded
// since: a hold invoice of a previous run counts, and one whose end was
// missed stops counting.
func (b *Backend) countHolds(ps []vend.Payment, asked time.Time) {
	open := make(map[string]bool, len(ps))
	for _, p := range ps {
		if p.Kind == vend.KindHoldInvoice {
			open[p.Ref] = true
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for ref, taken := range b.holds {
		if !open[ref] && !taken.IsZero() && taken.Before(asked) {
			delete(b.holds, ref)
		}
	}
	for ref := range open {
		if _, ok := b.holds[ref]; !ok {
			b.holds[ref] = asked
		}
	}
}

// watchHold follows one hold invoice with SubscribeSingleInvoice until it
// is settled or canceled, while Run runs. Idempotent per ref.
func (b *Backend) watchHold(ref string) {
	hash, err := hex.DecodeString(ref)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watchCtx == nil || b.watching[ref] != nil {
		return // Run's reconcile starts it
	}
	// The stream ends with this watch: gRPC keeps a stream (and a
	// goroutine) until its context ends or Recv returns an error.
	ctx, cancel := context.WithCancel(b.watchCtx)
	w := &holdWatch{cancel: cancel}
	b.watching[ref] = w
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() {
			b.mu.Lock()
			if b.watching[ref] == w {
				delete(b.watching, ref)
			}
			b.mu.Unlock()
			cancel()
		}()
		// An invoice whose end is already recorded is not watched: LND
		// keeps the stream of a canceled invoice it has deleted open
		// forever, sending nothing. That happens when a cancel wins the
		// race with this goroutine, or a reconcile's listing is stale.
		// An end recorded from now on ends this watch (endWatch).
		if p, err := b.led.Payment(ctx, ref); err != nil || paymentOver(p.State) {
			return // on an error, the next reconcile retries
		}
		stream, err := b.inv.SubscribeSingleInvoice(ctx, &invoicesrpc.SubscribeSingleInvoiceRequest{RHash: hash})
		if err != nil {
			return // the next reconcile retries
		}
		for {
			inv, err := stream.Recv()
			if err != nil {
				return
			}
			b.apply(ctx, inv)
			if inv.State == lnrpc.Invoice_SETTLED || inv.State == lnrpc.Invoice_CANCELED {
				return
			}
		}
	}()
}

// endWatch ends the watch of hold invoice ref, if any: its end is
// recorded in the ledger.
func (b *Backend) endWatch(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.watching[ref]; w != nil {
		w.cancel()
	}
}

// SettleHeld implements vend.HoldSettler.
func (b *Backend) SettleHeld(ctx context.Context, ref string) (vend.Payment, error) {
	p, err := b.led.Payment(ctx, ref)
	if err != nil {
		return p, err
	}
	if p.State == vend.PaymentSettled {
		return p, nil
	}
	if p.Kind != vend.KindHoldInvoice || p.State != vend.PaymentAccepted {
		return p, &vend.TransitionError{What: "payment " + ref, From: string(p.State), To: string(vend.PaymentSettled)}
	}
	pre, err := b.led.HoldPreimage(ctx, ref)
	if err != nil {
		return p, err
	}
	if _, err := b.inv.SettleInvoice(ctx, &invoicesrpc.SettleInvoiceMsg{Preimage: pre}); err != nil &&
		!strings.Contains(strings.ToLower(status.Convert(err).Message()), "already settled") {
		return p, fmt.Errorf("lnd: settle hold invoice %s: %w", ref, rpcError(err))
	}
	hash, _ := hex.DecodeString(ref)
	inv, err := b.ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash})
	if err != nil {
		return p, fmt.Errorf("lnd: look up settled hold invoice %s: %w", ref, rpcError(err))
	}
	b.apply(ctx, inv)
	return b.led.Payment(ctx, ref)
}
