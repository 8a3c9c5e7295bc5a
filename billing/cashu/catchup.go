package cashu

import (
	"context"
	"errors"
	"time"

	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/wallet/storage"

	"github.com/capvend/capvend/vend"
)

// CaughtUp is closed once Run has caught up with what happened while
// capvend was not watching: the wallet reconciled with the ledger (lost
// quotes booked, interrupted swaps and payouts resolved) and every quote
// then watched checked at its mint once (a quote paid meanwhile booked).
// A reconciliation before it would report what the backend is about to
// book. A check that cannot reach the mint counts: it is closed after
// the first round either way.
func (b *Backend) CaughtUp() <-chan struct{} { return b.caughtUp }

// reconcile finds what happened while capvend was not watching: every
// unsettled mint quote of the ledger is watched again; mint quotes capvend
// expired or canceled whose mint expiry has not passed are found in the
// wallet's quote store and watched for a late payment; token swaps left
// unrecorded by a crash are settled from the mint's proof states
// (resolveSwapping).
func (b *Backend) reconcile(ctx context.Context) error {
	ps, err := b.ledger.UnsettledPayments(ctx, vend.BackendCashu)
	if err != nil {
		return err
	}
	sts, err := b.tl.SwappingTokens(ctx, nil)
	if err != nil {
		return err
	}
	swapping := map[vend.PaymentID]bool{}
	for _, st := range sts {
		swapping[st.Payment.ID] = true
	}
	var stored []storage.MintQuote
	b.wmu.RLock()
	if b.w != nil {
		stored = b.w.GetMintQuotes()
	}
	b.wmu.RUnlock()
	expiry := map[string]time.Time{}
	now := b.now()
	for _, q := range stored {
		if q.QuoteExpiry > 0 {
			expiry[q.QuoteId] = time.Unix(int64(q.QuoteExpiry), 0)
		}
	}
	for _, p := range ps {
		switch p.Kind {
		case vend.KindMintQuote:
			qe, ok := expiry[p.Ref]
			if !ok {
				qe = p.CreatedAt.Add(time.Hour)
			}
			b.watch(&watchedQuote{ref: p.Ref, mint: p.MintURL, callID: p.CallID, expiresAt: p.ExpiresAt, quoteExpiry: qe, created: p.CreatedAt})
		case vend.KindToken:
			if !p.CreatedAt.Before(b.born) || swapping[p.ID] {
				continue // AcceptToken is handling it right now; or resolved below
			}
			// Interrupted between claiming the proofs and recording the
			// settlement by a capvend from before the swapping state
			// (its proofs are not swapping): the outcome is unknown. The
			// proofs stay claimed (never accepted again); `capvend
			// cashu balance` shows any ecash the wallet got.
			if _, err := b.ledger.EndPayment(ctx, p.Ref, vend.PaymentCanceled, "interrupted before settlement"); err != nil && !errors.Is(err, vend.ErrIllegalTransition) {
				return err
			}
			b.log.Warn("token payment interrupted before settlement: ended canceled; reconcile with 'capvend cashu balance'", logRef, short(p.Ref), logCall, int64(p.CallID))
		}
	}
	// Token swaps a crash (or an unreachable mint) left unrecorded: the
	// mint's proof states say what happened (swap.go). One the mint
	// cannot tell yet is tried again while Run runs.
	if n := b.resolveSwapping(ctx); n > 0 {
		b.log.Warn("token swaps whose outcome the mint cannot tell yet; checked again later", "swaps", n)
	}
	// Payouts this wallet left in flight (payout.go); those the mint
	// cannot tell yet are tried again while Run runs.
	b.resolvePayouts(ctx)
	for _, q := range stored {
		qe := time.Unix(int64(q.QuoteExpiry), 0)
		if q.State == nut04.Issued {
			// Minted into the wallet: booked by its payment, or lost
			// with the ledger (minted before a crash that the ledger
			// was restored from a replica after, or minted for a lost
			// quote and not yet booked). Looked at for a day after
			// the mint's expiry.
			if q.QuoteExpiry == 0 || now.After(qe.Add(lostLookback)) {
				continue
			}
			if _, err := b.ledger.Payment(ctx, q.QuoteId); errors.Is(err, vend.ErrNotFound) {
				if err := b.settleLost(ctx, &watchedQuote{ref: q.QuoteId, mint: q.Mint, amount: q.Amount}); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			continue
		}
		if q.QuoteExpiry == 0 || now.After(qe.Add(time.Minute)) {
			continue
		}
		p, err := b.ledger.Payment(ctx, q.QuoteId)
		if errors.Is(err, vend.ErrNotFound) {
			// The wallet requested it and no payment names it: the
			// ledger lost it (restored from its replica), or capvend
			// failed to record it (its client never saw it). Money
			// paid for it is capvend's: watched, minted and booked
			// as lost.
			if q.State != nut04.Issued {
				b.watch(&watchedQuote{ref: q.QuoteId, mint: q.Mint, quoteExpiry: qe, ended: true, lost: true, amount: q.Amount,
					created: time.Unix(int64(q.CreatedAt), 0)})
			}
			continue
		}
		if err != nil {
			return err
		}
		if p.Backend != vend.BackendCashu || (p.State != vend.PaymentExpired && p.State != vend.PaymentCanceled) {
			continue
		}
		b.watch(&watchedQuote{ref: p.Ref, mint: p.MintURL, callID: p.CallID, expiresAt: p.ExpiresAt, quoteExpiry: qe, ended: true, created: p.CreatedAt})
	}
	// Every quote watched now is checked in Run's first round, not a
	// poll interval later: what was paid while capvend was down is
	// booked before CaughtUp, and so before serve reconciles.
	b.qmu.Lock()
	n := len(b.watched)
	for _, q := range b.watched {
		q.urgent = true
	}
	b.qmu.Unlock()
	b.log.Info("cashu backend reconciled", "watched_quotes", n)
	return nil
}

// lostLookback is how long after a mint quote's expiry reconcile still
// looks for its issued ecash among the books (a restore soon after the
// disaster finds the quotes the ledger lost).
const lostLookback = 24 * time.Hour

// settleLost books the ecash minted for a lost quote (watchedQuote.lost)
// once; booked before is done.
func (b *Backend) settleLost(ctx context.Context, q *watchedQuote) error {
	err := b.tl.BookLostPayment(ctx, vend.LostPayment{Backend: vend.BackendCashu, MintURL: q.mint, Ref: q.ref,
		Amount: vend.Msat(q.amount) * 1000, Note: "cashu: minted a paid quote of the wallet that no payment names"})
	if errors.Is(err, vend.ErrAlreadySettled) {
		return nil
	}
	if err != nil {
		return err
	}
	b.log.Warn("mint quote paid whose payment the ledger lost: minted and booked to liabilities:unattributed", logRef, short(q.ref),
		logMint, q.mint, logAmount, int64(q.amount)*1000)
	return nil
}
