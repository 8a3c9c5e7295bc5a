package reconcile

import (
	"context"
	"errors"
	"fmt"

	"github.com/capvend/capvend/vend"
)

// Holding is the ecash the wallet holds at one mint.
type Holding struct {
	Mint    string // normalized mint URL
	Account string // the ledger's account of it, assets:cashu:<mint>
	// Unspent is what the wallet holds that the mint says is unspent
	// (NUT-07); with Checked false, what the wallet holds (the mint was
	// not asked).
	Unspent vend.Msat
	// Spent is what the wallet holds that the mint says is spent (or
	// pending): ecash spent elsewhere, worth nothing to capvend.
	Spent   vend.Msat
	Checked bool
}

// Quote states at the mint (NUT-04).
const (
	QuoteUnpaid  = "UNPAID"
	QuotePaid    = "PAID"
	QuoteIssued  = "ISSUED"
	QuoteUnknown = "UNKNOWN" // the mint does not know the quote
)

// Wallet is the Cashu wallet and its mints as the reconciler sees them;
// billing/cashu implements it.
type Wallet interface {
	// Holdings returns the wallet's ecash per configured mint.
	Holdings(ctx context.Context) ([]Holding, error)
	// QuoteState returns a mint quote's state at its mint: one of the
	// Quote* constants.
	QuoteState(ctx context.Context, mint, ref string) (string, error)
}

// checkCashu compares the wallet's ecash per mint with the ledger's
// assets:cashu:<mint>, and the ledger's open mint quotes with their mints.
// Neither is repaired: the ledger cannot tell whose ecash moved.
func (r *Reconciler) checkCashu(ctx context.Context, add func(Difference)) error {
	var errs []error
	if err := r.checkHoldings(ctx, add); err != nil {
		errs = append(errs, err)
	}
	if err := r.checkQuotes(ctx, add); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (r *Reconciler) checkHoldings(ctx context.Context, add func(Difference)) error {
	hs, err := r.cfg.Wallet.Holdings(ctx)
	if err != nil {
		return err
	}
	assets, err := r.cfg.Store.CashuAssets(ctx)
	if err != nil {
		return err
	}
	for _, h := range hs {
		booked := assets[h.Account]
		if h.Unspent == booked {
			continue
		}
		d := Difference{Kind: CashuBalance, Backend: vend.BackendCashu, MintURL: h.Mint,
			Ledger: fmt.Sprintf("%s %d msat", h.Account, booked), Remote: fmt.Sprintf("wallet %d msat unspent", h.Unspent)}
		switch {
		case h.Spent > 0:
			d.Detail = fmt.Sprintf("the mint says %d msat of the wallet's ecash is spent: spent elsewhere (a copied wallet?)", h.Spent)
		case h.Unspent > booked:
			d.Detail = "the wallet holds ecash the ledger has not booked"
		default:
			d.Detail = "the ledger books ecash the wallet does not hold"
		}
		if !h.Checked {
			d.Detail += " (wallet only: the mint was not asked)"
		}
		add(d)
	}
	return nil
}

// checkQuotes asks each open mint quote's mint for its state. A quote the
// mint says is paid or issued while the ledger still has it open (re-read
// after the mint answered, so a settlement the backend booked meanwhile is
// not a difference), or that the mint does not know, is a difference.
func (r *Reconciler) checkQuotes(ctx context.Context, add func(Difference)) error {
	ps, err := r.cfg.Store.UnsettledPayments(ctx, vend.BackendCashu)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range ps {
		if p.Kind != vend.KindMintQuote {
			continue
		}
		st, err := r.cfg.Wallet.QuoteState(ctx, p.MintURL, p.Ref)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st == QuoteUnpaid {
			continue
		}
		if cur, err := r.cfg.Store.Payment(ctx, p.Ref); err != nil || (cur.State != vend.PaymentOpen && cur.State != vend.PaymentAccepted) {
			continue
		}
		d := Difference{Kind: MintQuote, Backend: vend.BackendCashu, Ref: shortRef(p.Ref), CallID: p.CallID, MintURL: p.MintURL,
			Ledger: string(p.State), Remote: st}
		if st == QuoteUnknown {
			d.Detail = "the mint does not know a quote the ledger holds open"
		} else {
			d.Detail = "the mint says the quote is " + st + "; the ledger has not booked it"
		}
		add(d)
	}
	return errors.Join(errs...)
}

// shortRef abbreviates a mint quote id: until it is minted, whoever knows
// it can mint the paid ecash, so logs and difference rows carry a prefix,
// enough to find the ledger row.
func shortRef(ref string) string {
	if len(ref) > 8 {
		return ref[:8] + "…"
	}
	return ref
}
