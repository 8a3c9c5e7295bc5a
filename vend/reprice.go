package vend

import (
	"context"
	"errors"

	"github.com/capvend/capvend/pricing"
)

// RefundFreedGrants ends the explicit-gating grants that the current price
// book makes free (after SetPrices): a client's repeat of such a call now
// runs free and would never use its grant. A paid grant is refunded (the
// money is owed back, liabilities:refunds; a locked-in hold invoice is
// canceled), an unpaid one has its payment request withdrawn. Grants of
// items still priced, at any price, are left alone: they are honoured at
// the price they were quoted. It returns how many grants it ended; an
// error means some could not be looked at (the others were handled). Safe
// to call at any time, and again: a grant ends once.
func (v *Vendor) RefundFreedGrants(ctx context.Context) (int, error) {
	calls, err := v.cfg.Ledger.CallsIn(ctx, CallAwaitingPayment, CallPaid)
	if err != nil {
		return 0, err
	}
	book := v.book()
	var errs []error
	ended := 0
	for _, c := range calls {
		_, args, explicit, err := v.cfg.Ledger.CallArguments(ctx, c.ID)
		if err != nil || !explicit {
			continue
		}
		q, err := book.Quote(c.Server, callPriceKey(c), args)
		if err != nil || q.Price > 0 {
			continue
		}
		if err := v.endGrant(ctx, c); err != nil {
			v.cfg.Log.Warn("vend: a grant of an item that became free could not be ended", "call", int64(c.ID), "err", err)
			errs = append(errs, err)
			continue
		}
		v.cfg.Log.Info("vend: grant of an item that became free ended", "call", int64(c.ID), "kind", string(c.Kind.Or()),
			"tool", c.Name, "state", string(c.State))
		ended++
	}
	return ended, errors.Join(errs...)
}

// endGrant refunds a paid grant, or withdraws an unpaid one's payment
// request.
func (v *Vendor) endGrant(ctx context.Context, c Call) error {
	ps, err := v.cfg.Ledger.CallPayments(ctx, c.ID)
	if err != nil {
		return err
	}
	const why = "its price became 0 before the grant was used"
	for _, p := range ps {
		if p.State != PaymentOpen && p.State != PaymentAccepted {
			continue
		}
		if b := v.backend(p.Backend); b != nil {
			if err := b.Cancel(ctx, p.Ref); err != nil {
				return err
			}
		} else if _, err := v.cfg.Ledger.EndPayment(ctx, p.Ref, PaymentCanceled, why); err != nil {
			return err
		}
	}
	if c.State == CallPaid {
		return v.cfg.Ledger.Refund(ctx, c.ID, why)
	}
	return nil
}

// callPriceKey is the name a recorded call's price is looked up by.
func callPriceKey(c Call) string { return itemPriceKey(c.Kind, c.Name) }

// itemPriceKey is the name the price of the item of kind named name on its
// upstream (a tool or prompt name, a resource URI or URI template) is
// looked up by in the price book, and its daily free quota counted by.
func itemPriceKey(kind ItemKind, name string) string {
	switch kind {
	case ItemPrompt:
		return pricing.PromptKey(name)
	case ItemResource:
		return pricing.ResourceKey(name)
	}
	return name
}
