package cashu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/elnosh/gonuts/cashu/nuts/nut05"
	"github.com/elnosh/gonuts/cashu/nuts/nut07"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/vend"
)

// Payouts: money leaving the wallet (a refund, a credit balance paid
// back, a withdrawal) is reserved in the ledger before it leaves, then
// booked or released (vend.Payout):
//
//   - a token: reserve; make the token (the wallet sets its proofs
//     aside); record it on the reservation; book; only then is it handed
//     over. Not booked, the reservation is released and the token taken
//     back into the wallet.
//   - a bolt11: ask the mint for a melt quote (nothing moves); reserve
//     with the quote; melt; book what the mint paid, or release what it
//     did not. A melt the mint reports pending stays reserved.
//
// A reservation left in flight (a process killed between paying and
// booking, a mint that did not answer) belongs to the wallet that made
// it, and only a process holding that wallet resolves it, from the mint's
// word: a melt quote PAID is booked, UNPAID released; a token whose
// proofs are spent is booked, unspent taken back and released; a token
// payout with no token recorded never handed anything over and is
// released. capvend serve resolves its wallet's at start (and every
// SafetyPoll while any is left), and when a refund it pays is found
// reserved; each operator payout command (refunds pay, credit refund,
// cashu melt) resolves its wallet's before it pays.

// FailAfterPayout is the Config.Failpoint step (and the operator
// commands' test hook) between a payout's money leaving (its token made
// and recorded, its melt paid) and its booking.
const FailAfterPayout = "after_payout"

// cliFailpoint is the operator commands' FailAfterPayout hook; nil but in
// tests.
var cliFailpoint func(step string)

// PayoutBook is the part of the ledger payouts use; *ledger.Ledger
// implements it (see its methods for their contracts).
type PayoutBook interface {
	// ReservePayout reserves a payout before its money leaves.
	ReservePayout(ctx context.Context, np vend.NewPayout) (vend.Payout, error)
	// SetPayoutToken records a reserved token payout's token, once.
	SetPayoutToken(ctx context.Context, id vend.PayoutID, token string, fee vend.Msat) (vend.Payout, error)
	// BookPayout books a reserved payout whose money left, once.
	BookPayout(ctx context.Context, id vend.PayoutID, fee vend.Msat) (vend.Payout, error)
	// ReleasePayout ends a reserved payout whose money did not leave.
	ReleasePayout(ctx context.Context, id vend.PayoutID, reason string) (vend.Payout, error)
	// Payouts lists the payouts in flight (all: every payout).
	Payouts(ctx context.Context, all bool) ([]vend.Payout, error)
}

// errNotTakenBack: a token made for a payout that was then released
// could not be taken back into the wallet: it is still good ecash.
var errNotTakenBack = errors.New("taking the token back into the wallet failed")

// walletID identifies a wallet by its seed: the first 16 hex digits of
// the SHA-256 of its receive public key (public, and the same wherever
// its directory is).
func walletID(w *wallet.Wallet) string {
	sum := sha256.Sum256(w.GetReceivePubkey().SerializeCompressed())
	return "w" + hex.EncodeToString(sum[:8])
}

// payer pays out of one wallet, and resolves what it left in flight.
type payer struct {
	// with runs fn holding the wallet.
	with   func(fn func(w *wallet.Wallet) error) error
	book   PayoutBook
	wallet string   // walletID
	mint   *Backend // its calls to the mint (proof and quote states); its own wallet is never used
	fail   func(step string)
}

// cliPayer is the payer of an operator command holding w.
func cliPayer(w *wallet.Wallet, book PayoutBook) *payer {
	return &payer{with: func(fn func(w *wallet.Wallet) error) error { return fn(w) }, book: book, wallet: walletID(w),
		mint: &Backend{http: &http.Client{Timeout: 30 * time.Second}}, fail: cliFailpoint}
}

func (p *payer) failpoint(step string) {
	if p.fail != nil {
		p.fail(step)
	}
}

// payToken reserves np (a token payout; Amount whole sats, or 0 for all
// of a credit account's), makes its token, records it on the payout and
// books it: the booked payout, with its token. On error nothing was paid:
// the payout (if reserved) is released and the token (if made) taken
// back; if the release fails the payout stays in flight with its token
// recorded, to be resolved; errNotTakenBack if the token could not be
// taken back (the released payout keeps it).
func (p *payer) payToken(ctx context.Context, np vend.NewPayout) (vend.Payout, error) {
	np.Method, np.Wallet = vend.RefundCashu, p.wallet
	po, err := p.book.ReservePayout(ctx, np)
	if err != nil {
		return po, err
	}
	ctx = context.WithoutCancel(ctx) // reserved: it must end, booked or released
	var token string
	var fee uint64
	err = p.with(func(w *wallet.Wallet) error {
		var err error
		token, fee, err = makeToken(w, po.MintURL, uint64(po.Amount/vend.MsatPerSat))
		return err
	})
	if err != nil {
		if _, rerr := p.book.ReleasePayout(ctx, po.ID, "no token was made: "+err.Error()); rerr != nil {
			return po, fmt.Errorf("cashu: payout %d: %w; releasing it failed too (%v): it stays in flight until the wallet is opened again", po.ID, err, rerr)
		}
		return po, fmt.Errorf("cashu: payout %d: %w", po.ID, err)
	}
	rec, err := p.book.SetPayoutToken(ctx, po.ID, token, vend.Msat(fee*vend.MsatPerSat))
	if err != nil {
		return po, p.undoToken(ctx, po, token, err)
	}
	p.failpoint(FailAfterPayout)
	booked, err := p.book.BookPayout(ctx, rec.ID, rec.Fee)
	if err != nil {
		return rec, p.undoToken(ctx, rec, token, err)
	}
	return booked, nil
}

// undoToken ends a token payout that could not be booked: released, then
// the token taken back (in that order: a token taken back is spent, and
// a spent token of a payout in flight would be booked).
func (p *payer) undoToken(ctx context.Context, po vend.Payout, token string, cause error) error {
	if _, err := p.book.ReleasePayout(ctx, po.ID, "not booked: "+cause.Error()); err != nil {
		return fmt.Errorf("cashu: payout %d: %w; releasing it failed too (%v): it stays in flight until the wallet is opened again", po.ID, cause, err)
	}
	if err := p.with(func(w *wallet.Wallet) error { return takeBack(w, token) }); err != nil {
		return fmt.Errorf("cashu: payout %d: %w (released); %w: %v", po.ID, cause, errNotTakenBack, err)
	}
	return fmt.Errorf("cashu: payout %d: %w (released; the token was taken back)", po.ID, cause)
}

// payInvoice pays invoice (meltableInvoice's) from the wallet's ecash at
// np.MintURL through a melt (NUT-05): it asks for the melt quote, reserves
// np (Amount the invoice's) with it, melts, and books what the mint paid
// (the fee: what left the wallet beyond the amount) or releases what it
// did not pay. A melt the mint reports pending, or whose outcome it
// cannot tell, stays reserved and is resolved later (the error says so).
func (p *payer) payInvoice(ctx context.Context, np vend.NewPayout, invoice string) (vend.Payout, MeltResult, error) {
	mint := np.MintURL
	res := MeltResult{Mint: mint}
	var quote *nut05.PostMeltQuoteBolt11Response
	err := p.with(func(w *wallet.Wallet) error {
		var err error
		if quote, err = w.RequestMeltQuote(invoice, mint); err != nil {
			return fmt.Errorf("cashu: melt quote at %s: %w", mint, err)
		}
		if held := w.GetBalanceByMints()[mint]; held < quote.Amount+quote.FeeReserve {
			return fmt.Errorf("%w: %s holds %d sat, the melt needs %d sat + %d sat fee reserve", ErrInsufficientFunds, mint, held, quote.Amount, quote.FeeReserve)
		}
		return nil
	})
	if err != nil {
		return vend.Payout{}, res, err
	}
	res.Quote, res.Amount = quote.Quote, vend.Msat(quote.Amount*vend.MsatPerSat)
	if res.Amount != np.Amount {
		return vend.Payout{}, res, fmt.Errorf("cashu: melt quote %s is for %s, the invoice for %s", quote.Quote, res.Amount, np.Amount)
	}
	np.Method, np.Wallet, np.Invoice, np.Quote, np.FeeReserve = vend.RefundBolt11, p.wallet, invoice, quote.Quote, vend.Msat(quote.FeeReserve*vend.MsatPerSat)
	po, err := p.book.ReservePayout(ctx, np)
	if err != nil {
		return po, res, err
	}
	ctx = context.WithoutCancel(ctx) // reserved: it must end, booked or released
	var before, after uint64
	var paid *nut05.PostMeltQuoteBolt11Response
	meltErr := p.with(func(w *wallet.Wallet) error {
		before = w.GetBalanceByMints()[mint]
		var err error
		paid, err = w.Melt(quote.Quote)
		after = w.GetBalanceByMints()[mint]
		if err == nil && paid == nil {
			err = errors.New("no answer")
		}
		return err
	})
	state, spent := nut05.Unknown, po.Amount+po.FeeReserve // the most it took, unless the wallet tells
	switch {
	case meltErr == nil:
		state = paid.State
		res.Preimage = paid.Preimage
	case errors.Is(meltErr, wallet.ErrInsufficientMintBalance): // refused before anything was sent
		state = nut05.Unpaid
	default:
		// The mint may have paid with its answer lost: ask it.
		if st, sp, err := p.meltState(ctx, po); err == nil {
			state = st
			if sp > 0 {
				spent = sp
			}
		}
	}
	switch state {
	case nut05.Paid:
		p.failpoint(FailAfterPayout)
		if meltErr == nil {
			spent = vend.Msat(0)
			if before > after {
				spent = vend.Msat((before - after) * vend.MsatPerSat)
			}
			spent = max(spent, po.Amount) // the mint paid: never book less than the invoice
		}
		res.Fee = spent - po.Amount
		booked, err := p.book.BookPayout(ctx, po.ID, res.Fee)
		if err != nil {
			return po, res, fmt.Errorf("cashu: the invoice was PAID (melt quote %s, %s + %s fee) but booking it failed: %w; payout %d stays reserved and is booked when the wallet is opened again",
				res.Quote, res.Amount, res.Fee, err, po.ID)
		}
		return booked, res, nil
	case nut05.Unpaid:
		why := fmt.Sprintf("the mint did not pay the invoice (melt quote %s is UNPAID)", quote.Quote)
		if meltErr != nil {
			why += ": " + meltErr.Error()
		}
		if _, err := p.book.ReleasePayout(ctx, po.ID, why); err != nil {
			return po, res, fmt.Errorf("cashu: %s; releasing payout %d failed (%v): it stays in flight until the wallet is opened again", why, po.ID, err)
		}
		if errors.Is(meltErr, wallet.ErrInsufficientMintBalance) {
			return po, res, fmt.Errorf("%w: %v", ErrInsufficientFunds, meltErr)
		}
		return po, res, fmt.Errorf("cashu: %s; the proofs were returned to the wallet and nothing is booked", why)
	}
	return po, res, fmt.Errorf("cashu: melt quote %s is %s at the mint (%v): payout %d stays reserved; it is booked or released when the wallet is opened again",
		quote.Quote, state, meltErr, po.ID)
}

// meltState asks the mint for the state of a melt payout's quote, through
// the wallet (which then moves the quote's proofs: back if UNPAID, out if
// PAID) or, for a quote the wallet does not know, directly. spent is what
// the wallet's proofs set aside for the quote came to (0 if it had none
// left: it had dealt with the mint's answer before).
func (p *payer) meltState(ctx context.Context, po vend.Payout) (st nut05.State, spent vend.Msat, err error) {
	err = p.with(func(w *wallet.Wallet) error {
		pending := w.PendingBalance()
		r, err := w.CheckMeltQuoteState(po.Quote)
		if err != nil {
			return err
		}
		st = r.State
		if now := w.PendingBalance(); st == nut05.Paid && pending > now {
			spent = vend.Msat((pending - now) * vend.MsatPerSat)
		}
		return nil
	})
	if errors.Is(err, wallet.ErrQuoteNotFound) {
		var q nut05.PostMeltQuoteBolt11Response
		if err = p.mint.getJSON(ctx, po.MintURL+"/v1/melt/quote/bolt11/"+url.PathEscape(po.Quote), &q); err == nil {
			st = q.State
		}
	}
	if err != nil {
		return nut05.Unknown, 0, fmt.Errorf("melt quote %s at %s: %w", short(po.Quote), po.MintURL, err)
	}
	return st, spent, nil
}

// resolve ends the payouts this wallet left in flight (see the comment at
// the top of the file) and returns those it ended and how many it could
// not end yet (a melt pending, the mint unreachable), with why.
func (p *payer) resolve(ctx context.Context) (ended []vend.Payout, left int, err error) {
	ps, err := p.book.Payouts(ctx, false)
	if err != nil {
		return nil, 0, err
	}
	var errs []error
	for _, po := range ps {
		if po.Wallet == "" || po.Wallet != p.wallet {
			continue // another wallet's: its holder resolves it
		}
		e, err := p.resolveOne(ctx, po)
		if err != nil {
			errs = append(errs, fmt.Errorf("payout %d: %w", po.ID, err))
		}
		if e.State != vend.PayoutBooked && e.State != vend.PayoutReleased {
			left++
			continue
		}
		ended = append(ended, e)
	}
	return ended, left, errors.Join(errs...)
}

// resolveOne ends one payout this wallet left in flight, from the mint's
// word.
func (p *payer) resolveOne(ctx context.Context, po vend.Payout) (vend.Payout, error) {
	ctx = context.WithoutCancel(ctx)
	switch {
	case po.Method == vend.RefundBolt11:
		st, spent, err := p.meltState(ctx, po)
		if err != nil {
			return po, err
		}
		switch st {
		case nut05.Paid:
			fee := po.FeeReserve // gonuts' mint returns no change: a melt costs its whole fee reserve
			if spent > po.Amount {
				fee = spent - po.Amount
			}
			return p.book.BookPayout(ctx, po.ID, fee)
		case nut05.Unpaid:
			return p.book.ReleasePayout(ctx, po.ID, fmt.Sprintf("left in flight; the mint did not pay melt quote %s", short(po.Quote)))
		}
		return po, fmt.Errorf("melt quote %s is %s at the mint", short(po.Quote), st)
	case po.Token == "":
		// Its token was never recorded, so never handed over. (The
		// proofs the wallet set aside for it, if it made one, stay
		// pending in the wallet: 'capvend cashu balance' shows them.)
		return p.book.ReleasePayout(ctx, po.ID, "left in flight before its token was recorded: nothing was handed over")
	}
	tok, err := ParseToken(po.Token)
	if err != nil {
		return po, err
	}
	states, err := p.mint.proofStates(ctx, tok.Mint, tok.Proofs)
	if err != nil {
		return po, err
	}
	spent, unspent := 0, 0
	for _, s := range states {
		switch s {
		case nut07.Spent:
			spent++
		case nut07.Unspent:
			unspent++
		}
	}
	switch {
	case spent == len(states):
		return p.book.BookPayout(ctx, po.ID, po.Fee)
	case unspent == len(states):
		r, err := p.book.ReleasePayout(ctx, po.ID, "left in flight; its token was never redeemed: taken back")
		if err != nil {
			return po, err
		}
		if err := p.with(func(w *wallet.Wallet) error { return takeBack(w, po.Token) }); err != nil {
			return r, fmt.Errorf("released, but %w: %v", errNotTakenBack, err)
		}
		return r, nil
	}
	return po, fmt.Errorf("its token's proofs are %d spent, %d unspent of %d (a redemption under way?)", spent, unspent, len(states))
}
