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
	// Preimage is the settled invoice's preimage (nil if not settled,
	// or not known): Config.OwnsPreimage tells capvend's invoices whose
	// payment a restored ledger lost.
	Preimage []byte
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

// source is a node or wallet whose invoices the reconciler compares with
// the ledger: LND (its add index), or an NWC connection (NWC).
type source struct {
	inv     LND
	backend vend.Backend // the backend its payments are recorded under
	cursor  string       // its cursor's name in the Store
	remote  string       // how a difference's detail names it: "LND", "the wallet"
	// owns reports whether a settled invoice's preimage is capvend's
	// (nil: none is known to be).
	owns func(preimage []byte) bool
}

// checkLND compares every invoice after the stored cursor with the
// ledger, and moves the cursor past the invoices that are final and agree.
func (r *Reconciler) checkLND(ctx context.Context, run int64, add func(Difference)) error {
	return r.checkInvoices(ctx, run, source{inv: r.cfg.LND, backend: vend.BackendLND, cursor: "lnd:" + r.cfg.Node, remote: "LND", owns: r.cfg.OwnsPreimage}, add)
}

// checkInvoices compares every invoice of src after its stored cursor with
// the ledger, and moves the cursor past the invoices that are final and
// agree.
func (r *Reconciler) checkInvoices(ctx context.Context, run int64, src source, add func(Difference)) error {
	cursor, err := r.cfg.Store.ReconcileCursor(ctx, src.cursor)
	if err != nil {
		return err
	}
	next, stable := cursor, true
	for after := cursor; ; {
		invs, err := src.inv.Invoices(ctx, after, invoicePage)
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
		lost, err := r.lostPayments(ctx, src, invs, payments)
		if err != nil {
			return err
		}
		for _, inv := range invs {
			var final bool
			if lost[inv.Ref] {
				final, err = r.repairLost(ctx, run, src, inv, add)
			} else {
				p, ok := payments[inv.Ref]
				if ok && p.Backend != src.backend {
					ok = false // another backend's payment of the same hash: not this source's
				}
				final, err = r.compareInvoice(ctx, run, src, inv, p, ok, add)
			}
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
		return r.cfg.Store.SaveReconcileCursor(ctx, src.cursor, next)
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

// lostPayments returns the settled invoices of a page that capvend made
// (their preimage carries its mark: src.owns), that no payment of the
// ledger names (a ledger restored from its replica lost their quotes)
// and that are not booked as lost already (they then agree).
// bookedPayments leaves out the payments settled on both sides, so the
// candidates are looked up again, in one query.
func (r *Reconciler) lostPayments(ctx context.Context, src source, invs []Invoice, payments map[string]vend.Payment) (map[string]bool, error) {
	if src.owns == nil {
		return nil, nil
	}
	var refs []string
	for _, inv := range invs {
		if _, ok := payments[inv.Ref]; !ok && inv.State == InvoiceSettled && src.owns(inv.Preimage) {
			refs = append(refs, inv.Ref)
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	known, err := r.cfg.Store.PaymentsByRef(ctx, refs, "")
	if err != nil {
		return nil, err
	}
	booked, err := r.cfg.Store.LostRefs(ctx, refs)
	if err != nil {
		return nil, err
	}
	lost := map[string]bool{}
	for _, ref := range refs {
		if _, ok := known[ref]; !ok && !booked[ref] {
			lost[ref] = true
		}
	}
	return lost, nil
}

// repairLost books a settlement of an invoice capvend made whose payment
// the ledger lost (lostPayments) to liabilities:unattributed, once.
func (r *Reconciler) repairLost(ctx context.Context, run int64, src source, inv Invoice, add func(Difference)) (final bool, err error) {
	d := Difference{Run: run, Kind: SettledUnbooked, Backend: src.backend, Ref: inv.Ref, Ledger: "lost", Remote: string(inv.State),
		Detail: fmt.Sprintf("%s settled %d msat of an invoice capvend made (its mark) that no payment of the ledger names: its quote was lost, as by a restore from a replica", src.remote, inv.AmountPaid)}
	if !r.cfg.Repair {
		add(d)
		return false, nil
	}
	d.Repair = RepairPrefix + ": booked to " + UnattributedAccount + " (owed until returned to its payer or booked as income)"
	d.FoundAt = r.cfg.Now()
	err = r.cfg.Store.RepairLost(ctx, d, vend.Settlement{Ref: inv.Ref, Amount: inv.AmountPaid, AddIndex: inv.AddIndex, SettleIndex: inv.SettleIndex})
	switch {
	case errors.Is(err, vend.ErrAlreadySettled):
		return true, nil // booked by an earlier run, or recorded meanwhile
	case err != nil:
		return false, err
	}
	add(d)
	return true, nil
}

// compareInvoice compares one invoice with the ledger's payment p (found:
// the ledger has one), repairs what is safe, and reports whether the
// invoice is final and agrees now.
func (r *Reconciler) compareInvoice(ctx context.Context, run int64, src source, inv Invoice, p vend.Payment, found bool, add func(Difference)) (final bool, err error) {
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
	d := Difference{Run: run, Backend: src.backend, Ref: p.Ref, CallID: p.CallID, Ledger: string(p.State), Remote: string(inv.State)}
	switch inv.State {
	case InvoiceSettled:
		if p.State == vend.PaymentSettled {
			return true, nil
		}
		d.Kind = SettledUnbooked
		d.Detail = fmt.Sprintf("%s settled %d msat the ledger has not booked", src.remote, inv.AmountPaid)
		return r.repairSettled(ctx, d, inv, add)
	case InvoiceCanceled:
		switch p.State {
		case vend.PaymentSettled:
			d.Kind, d.Detail = BookedUnsettled, "the ledger booked a settlement of an invoice "+src.remote+" canceled"
			add(d)
			return false, nil
		case vend.PaymentOpen, vend.PaymentAccepted:
			d.Kind, d.Detail = CanceledUnbooked, src.remote+" canceled an invoice the ledger holds "+string(p.State)
			return r.repairCanceled(ctx, d, src, add)
		}
		return true, nil
	case InvoiceAccepted:
		if p.State == vend.PaymentSettled {
			return r.bookedUnsettled(ctx, d, src, inv, "the ledger booked a settlement of a hold invoice "+src.remote+" only holds", add)
		}
		return false, r.checkHold(ctx, d, src, p, add)
	default: // open
		if p.State == vend.PaymentSettled {
			return r.bookedUnsettled(ctx, d, src, inv, "the ledger booked a settlement of an invoice open at "+src.remote, add)
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
func (r *Reconciler) bookedUnsettled(ctx context.Context, d Difference, src source, inv Invoice, detail string, add func(Difference)) (final bool, err error) {
	again, err := src.inv.Invoices(ctx, inv.AddIndex-1, 1)
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
func (r *Reconciler) repairCanceled(ctx context.Context, d Difference, src source, add func(Difference)) (bool, error) {
	if !r.cfg.Repair {
		add(d)
		return false, nil
	}
	d.Repair = RepairPrefix + ": ended the payment canceled at " + src.remote
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
func (r *Reconciler) checkHold(ctx context.Context, d Difference, src source, p vend.Payment, add func(Difference)) error {
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
	d.Kind, d.Detail = OrphanHold, "a hold invoice locked in at "+src.remote+" that no call will settle"
	if !r.cfg.Repair {
		add(d)
		return nil
	}
	if err := src.inv.CancelInvoice(ctx, p.Ref); err != nil {
		d.Detail += "; cancel at " + src.remote + " failed: " + err.Error()
		add(d)
		return nil
	}
	d.Repair = RepairPrefix + ": canceled the hold invoice at " + src.remote + " (the payer's money goes back)"
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

// NWC is an NWC connection as the reconciler sees it (billing/nwc's
// Reconciler implements it): its invoices, listed with list_transactions
// in the order the wallet created them (AddIndex is that order, made of
// the creation time), and canceling a hold invoice.
type NWC interface {
	LND
	// Backend is the backend its payments are recorded under.
	Backend() vend.Backend
}

// checkNWC compares an NWC connection's invoices with the ledger.
func (r *Reconciler) checkNWC(ctx context.Context, run int64, w NWC, add func(Difference)) error {
	return r.checkInvoices(ctx, run, source{inv: w, backend: w.Backend(), cursor: string(w.Backend()), remote: "the wallet"}, add)
}
