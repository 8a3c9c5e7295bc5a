package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// InvoiceState is an LND invoice's state.
type InvoiceState string

// LND's invoice states.
const (
	InvoiceOpen     InvoiceState = "open"
	InvoiceAccepted InvoiceState = "accepted" // a hold invoice's HTLC is locked in
	InvoiceSettled  InvoiceState = "settled"
	InvoiceCanceled InvoiceState = "canceled"
)

// Invoice is one LND invoice as the reconciler compares it.
type Invoice struct {
	Ref         string // payment hash, hex
	State       InvoiceState
	AmountPaid  vend.Msat
	AddIndex    uint64
	SettleIndex uint64
	// Created is when LND added the invoice (zero: unknown).
	Created time.Time
}

// unrecordedGrace is how long after LND added an invoice the ledger may
// still be about to record it: capvend records a payment request right
// after its backend created it. An open invoice the ledger does not know
// after that is another application's on the same node (or one capvend
// created and crashed before recording, which it never will): the cursor
// passes it rather than stay pinned behind it until it expires.
const unrecordedGrace = 10 * time.Minute

// LND is the node as the reconciler uses it; billing/lnd's Node
// implements it.
type LND interface {
	// Invoices returns up to max invoices with an add index above after,
	// in add-index order.
	Invoices(ctx context.Context, after uint64, max int) ([]Invoice, error)
	// CancelInvoice cancels an open or accepted invoice (an accepted hold
	// invoice's HTLC goes back to the payer). Canceling a canceled one is
	// not an error; a settled one is.
	CancelInvoice(ctx context.Context, ref string) error
}

// invoicePage is how many invoices one Invoices call asks for.
const invoicePage = 500

// checkLND compares every invoice after the stored cursor with the
// ledger, and moves the cursor past the invoices that are final and agree.
func (r *Reconciler) checkLND(ctx context.Context, run int64, add func(Difference)) error {
	source := "lnd:" + r.cfg.Node
	cursor, err := r.cfg.Store.ReconcileCursor(ctx, source)
	if err != nil {
		return err
	}
	next, stable := cursor, true
	for after := cursor; ; {
		invs, err := r.cfg.LND.Invoices(ctx, after, invoicePage)
		if err != nil {
			return err
		}
		if len(invs) == 0 {
			break
		}
		payments, err := r.bookedPayments(ctx, invs)
		if err != nil {
			return err
		}
		for _, inv := range invs {
			p, ok := payments[inv.Ref]
			final, err := r.compareInvoice(ctx, run, inv, p, ok, add)
			if err != nil {
				return err
			}
			// The cursor only passes invoices that cannot change any
			// more and agree: the next run starts at the first one
			// that may.
			if stable && final {
				next = inv.AddIndex
			} else {
				stable = false
			}
			after = inv.AddIndex
		}
		if len(invs) < invoicePage {
			break
		}
	}
	if next > cursor {
		return r.cfg.Store.SaveReconcileCursor(ctx, source, next)
	}
	return nil
}

// bookedPayments reads the ledger's payments of a page of invoices, in
// one query per kind of invoice, not one per invoice: those of the
// invoices LND settled only when the ledger does not have them settled
// (the usual case, settled on both sides, then costs the ledger an index
// lookup and nothing more), all the others'.
func (r *Reconciler) bookedPayments(ctx context.Context, invs []Invoice) (map[string]vend.Payment, error) {
	var settled, other []string
	for _, inv := range invs {
		if inv.State == InvoiceSettled {
			settled = append(settled, inv.Ref)
		} else {
			other = append(other, inv.Ref)
		}
	}
	payments := map[string]vend.Payment{}
	for _, q := range []struct {
		refs []string
		skip vend.PaymentState
	}{{settled, vend.PaymentSettled}, {other, ""}} {
		if len(q.refs) == 0 {
			continue
		}
		ps, err := r.cfg.Store.PaymentsByRef(ctx, q.refs, q.skip)
		if err != nil {
			return nil, err
		}
		for ref, p := range ps {
			payments[ref] = p
		}
	}
	return payments, nil
}

// compareInvoice compares one invoice with the ledger's payment p (found:
// the ledger has one), repairs what is safe, and reports whether the
// invoice is final and agrees now.
func (r *Reconciler) compareInvoice(ctx context.Context, run int64, inv Invoice, p vend.Payment, found bool, add func(Difference)) (final bool, err error) {
	if !found {
		// Not capvend's (another application's invoice on the node, or
		// one capvend canceled before recording it), or settled on both
		// sides (see bookedPayments). One still open is final once the
		// ledger can no longer be about to record it; an accepted one
		// (an HTLC locked in) is looked at again until it ends.
		switch inv.State {
		case InvoiceSettled, InvoiceCanceled:
			return true, nil
		case InvoiceOpen:
			return !inv.Created.IsZero() && r.cfg.Now().Sub(inv.Created) > unrecordedGrace, nil
		}
		return false, nil
	}
	d := Difference{Run: run, Backend: vend.BackendLND, Ref: p.Ref, CallID: p.CallID, Ledger: string(p.State), Remote: string(inv.State)}
	switch inv.State {
	case InvoiceSettled:
		if p.State == vend.PaymentSettled {
			return true, nil
		}
		d.Kind = SettledUnbooked
		d.Detail = fmt.Sprintf("LND settled %d msat the ledger has not booked", inv.AmountPaid)
		return r.repairSettled(ctx, d, inv, add)
	case InvoiceCanceled:
		switch p.State {
		case vend.PaymentSettled:
			d.Kind, d.Detail = BookedUnsettled, "the ledger booked a settlement of an invoice LND canceled"
			add(d)
			return false, nil
		case vend.PaymentOpen, vend.PaymentAccepted:
			d.Kind, d.Detail = CanceledUnbooked, "LND canceled an invoice the ledger holds "+string(p.State)
			return r.repairCanceled(ctx, d, add)
		}
		return true, nil
	case InvoiceAccepted:
		if p.State == vend.PaymentSettled {
			return r.bookedUnsettled(ctx, d, inv, "the ledger booked a settlement of a hold invoice LND only holds", add)
		}
		return false, r.checkHold(ctx, d, p, add)
	default: // open
		if p.State == vend.PaymentSettled {
			return r.bookedUnsettled(ctx, d, inv, "the ledger booked a settlement of an invoice open at LND", add)
		}
		return false, nil
	}
}

// bookedUnsettled reports d, a settlement the ledger booked of invoice inv
// that LND had not settled when listed, unless LND has settled it since.
// The invoices are listed before the ledger is read, and capvend books a
// settlement once LND made it: an invoice paid between the two reads
// looks settled in the ledger only (seen under load: a paid call every
// few milliseconds). An invoice's state only moves forward, so LND asked
// again, after the ledger was read, says whether the difference is real.
func (r *Reconciler) bookedUnsettled(ctx context.Context, d Difference, inv Invoice, detail string, add func(Difference)) (final bool, err error) {
	again, err := r.cfg.LND.Invoices(ctx, inv.AddIndex-1, 1)
	if err != nil {
		return false, err
	}
	if len(again) == 1 && again[0].Ref == inv.Ref && again[0].State == InvoiceSettled {
		return true, nil
	}
	d.Kind, d.Detail = BookedUnsettled, detail
	add(d)
	return false, nil
}

// repairSettled books a settlement LND made and the ledger missed.
func (r *Reconciler) repairSettled(ctx context.Context, d Difference, inv Invoice, add func(Difference)) (bool, error) {
	if !r.cfg.Repair {
		add(d)
		return false, nil
	}
	d.Repair = RepairPrefix + ": booked the late settlement"
	d.FoundAt = r.cfg.Now()
	p, err := r.cfg.Store.RepairSettlement(ctx, d, vend.Settlement{Ref: inv.Ref, Amount: inv.AmountPaid,
		AddIndex: inv.AddIndex, SettleIndex: inv.SettleIndex})
	switch {
	case errors.Is(err, vend.ErrAlreadySettled):
		return true, nil // the backend's watcher booked it meanwhile: they agree
	case err != nil:
		// Refused by the ledger's rules (underpaid, a kind that cannot
		// be paid late): the operator decides.
		d.Repair, d.Detail = "", d.Detail+"; not booked: "+err.Error()
		add(d)
		return false, nil
	}
	add(d)
	r.report(p)
	return true, nil
}

// repairCanceled ends a payment LND canceled.
func (r *Reconciler) repairCanceled(ctx context.Context, d Difference, add func(Difference)) (bool, error) {
	if !r.cfg.Repair {
		add(d)
		return false, nil
	}
	d.Repair = RepairPrefix + ": ended the payment canceled at LND"
	d.FoundAt = r.cfg.Now()
	p, err := r.cfg.Store.RepairCanceled(ctx, d)
	if err != nil {
		if errors.Is(err, vend.ErrIllegalTransition) {
			return false, nil // settled meanwhile: the next run compares again
		}
		return false, err
	}
	add(d)
	r.report(p)
	return true, nil
}

// checkHold looks for an orphan hold invoice: locked in at LND while its
// payment is ended in the ledger, or its call ended without settling it
// (failed, refunded, expired, canceled). Such an invoice is never settled
// by vend: it is canceled, which returns the money to the payer. A hold
// invoice whose call is paid or executing is live (vend settles or cancels
// it); one the ledger has open is left to the backend's watcher.
func (r *Reconciler) checkHold(ctx context.Context, d Difference, p vend.Payment, add func(Difference)) error {
	orphan := p.State == vend.PaymentCanceled || p.State == vend.PaymentExpired
	if !orphan && p.State == vend.PaymentAccepted {
		c, err := r.cfg.Store.Call(ctx, p.CallID)
		if err != nil {
			return err
		}
		switch c.State {
		case vend.CallFailed, vend.CallRefunded, vend.CallExpired, vend.CallCanceled:
			orphan = true
			d.Ledger += ", call " + string(c.State)
		}
	}
	if !orphan {
		return nil
	}
	d.Kind, d.Detail = OrphanHold, "a hold invoice locked in at LND that no call will settle"
	if !r.cfg.Repair {
		add(d)
		return nil
	}
	if err := r.cfg.LND.CancelInvoice(ctx, p.Ref); err != nil {
		d.Detail += "; cancel at LND failed: " + err.Error()
		add(d)
		return nil
	}
	d.Repair = RepairPrefix + ": canceled the hold invoice at LND (the payer's money goes back)"
	d.FoundAt = r.cfg.Now()
	np, err := r.cfg.Store.RepairCanceled(ctx, d)
	if err != nil {
		return err
	}
	add(d)
	if np.State != p.State {
		r.report(np)
	}
	return nil
}
