package cashu

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut07"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/vend"
)

// A token's proofs are recorded swapping, with its payment, before the
// mint is asked to swap them (ledger ClaimToken), and swapped with the
// settlement. Whatever happens in between ends in the ledger as what
// happened at the mint, never as a silent gain or a burnt token:
//
//   - the swap answered: settled (the call runs);
//   - it failed and the mint says the proofs are unspent: it did not
//     happen; the proofs are released, the client's token is intact and
//     pays again when it comes back (a transient failure tells the client
//     to retry with the same token);
//   - it failed and the mint says they are spent (it did not say "already
//     spent"): it happened and its answer was lost; the ecash the mint
//     signed for the wallet is restored (NUT-09) and the payment settles;
//   - no word from the mint (down, a crash between the swap and the
//     record): the payment ends canceled with its proofs still swapping.
//     At the next start, every FailAfterSwap interval while Run runs, or
//     when the same token comes again, the mint is asked again: unspent,
//     released; spent, the settlement is booked late and, since the call
//     did not run, the money is a refund owed to the client.

// The steps a Config.Failpoint is called at.
const (
	FailAfterSwap = "after_swap" // a token's swap answered; its settlement is not recorded
	FailAfterMint = "after_mint" // a paid quote's ecash is minted; its settlement is not recorded
	// FailAfterPayout (payout.go): a payout's money left; its booking is not written.
)

func (b *Backend) failpoint(step string) {
	if b.cfg.Failpoint != nil {
		b.cfg.Failpoint(step)
	}
}

// tokenLedger is what the backend needs of its ledger beyond payments:
// the swapping state of token proofs, and refunds. *ledger.Ledger
// implements it.
type tokenLedger interface {
	ProofsReceived(ctx context.Context, secretHashes []string) (int, error)
	ClaimToken(ctx context.Context, id vend.CallID, np vend.NewPayment, proofs []vend.Proof) (vend.Payment, error)
	SwappingTokens(ctx context.Context, secretHashes []string) ([]vend.SwappingToken, error)
	EndSwap(ctx context.Context, ref, to, reason string) error
	SettleSwap(ctx context.Context, s vend.Settlement, reason string) (vend.Payment, error)
	// RecordChange records the proofs of change handed out for payment
	// ref (secret hash, mint, amount), before it is handed over.
	RecordChange(ctx context.Context, ref string, proofs []vend.Proof) error
	vend.RefundLedger
	PayoutBook
	// BookLostPayment books, once, the ecash minted for a quote of the
	// wallet's own store that no payment names (the ledger lost it: a
	// restore from its replica); vend.ErrAlreadySettled if booked
	// before, or if a payment names it.
	BookLostPayment(ctx context.Context, p vend.LostPayment) error
}

// swapToken swaps a claimed token's proofs into the wallet and records the
// payment settled, or what the failure was (swapFailed).
func (b *Backend) swapToken(ctx context.Context, p vend.Payment, tok *Token, priceSats, fee uint64) (vend.TokenReceipt, error) {
	var received uint64
	receive := func(w *wallet.Wallet) error {
		v3, err := cashu.NewTokenV3(append(cashu.Proofs(nil), tok.Proofs...), tok.Mint, cashu.Sat, true)
		if err != nil {
			return err
		}
		received, err = w.Receive(v3, false)
		return err
	}
	err := b.withWallet(receive)
	if alreadySigned(err) {
		// The wallet's counter is behind the mint: repair and retry
		// (the mint refused the outputs: the proofs are unspent).
		if _, rerr := b.recoverWallet(ctx, tok.Mint, ""); rerr == nil {
			err = b.withWallet(receive)
		}
	}
	if err != nil {
		return b.swapFailed(ctx, p, tok, priceSats, fee, err)
	}
	return b.settleToken(p, tok, received, priceSats)
}

// settleToken makes the change of a swapped token (what was received
// beyond the price) and records the settlement.
func (b *Backend) settleToken(p vend.Payment, tok *Token, received, priceSats uint64) (vend.TokenReceipt, error) {
	var change, changeFee uint64
	var changeToken string
	if received > priceSats {
		change = received - priceSats
		_ = b.withWallet(func(w *wallet.Wallet) error {
			before := w.GetBalanceByMints()[tok.Mint]
			cps, err := w.Send(change, tok.Mint, false)
			if err != nil {
				b.log.Warn("making change failed; the overpayment is kept", logRef, short(p.Ref), logErr, err)
				change = 0
				return nil
			}
			after := w.GetBalanceByMints()[tok.Mint]
			if spent := before - after; before >= after && spent > change {
				changeFee = spent - change
			}
			ct := &Token{Mint: tok.Mint, Unit: cashu.Sat.String(), Proofs: cps}
			if changeToken, err = ct.Serialize(); err != nil {
				b.log.Error("serializing change failed; the overpayment is kept", logRef, short(p.Ref), logErr, err)
				change, changeToken = 0, ""
				return nil
			}
			// Recorded before it is handed over: a wallet rebuilt from
			// its seed finds these proofs again, and must set them aside.
			if err := b.tl.RecordChange(context.Background(), p.Ref, handedOut(tok.Mint, cps)); err != nil {
				b.log.Error("change handed out but not recorded: a wallet restored from the seed would count it as its own",
					logRef, short(p.Ref), logErr, err)
			}
			return nil
		})
	}
	b.failpoint(FailAfterSwap)
	s := vend.Settlement{
		Ref:    p.Ref,
		Amount: vend.Msat((tok.Amount - change) * vend.MsatPerSat),
		Fee:    vend.Msat((tok.Amount - received + changeFee) * vend.MsatPerSat),
	}
	// Not ctx: the ecash is in the wallet; the books must say so.
	sp, err := b.ledger.SettlePayment(context.Background(), s)
	if err != nil {
		// The proofs stay swapping: Run books the swap late.
		b.log.Error("token swapped but its settlement was not recorded", logRef, short(p.Ref), logCall, int64(p.CallID), logErr, err)
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: recording settlement: %w", err)
	}
	b.log.Info("token accepted", logRef, short(p.Ref), logCall, int64(p.CallID), logMint, tok.Mint,
		logAmount, int64(s.Amount), logFee, int64(s.Fee), "change_sat", change)
	return vend.TokenReceipt{Payment: sp, Change: changeToken}, nil
}

// swapOutcome is what the mint's proof states say of a swap.
type swapOutcome int

const (
	swapUnknown     swapOutcome = iota // no answer, or proofs pending
	swapNotDone                        // all unspent: the swap did not happen
	swapDone                           // all spent: it happened (or someone else spent them all)
	swapSpentBefore                    // some spent, some not: not a swap of ours
)

func outcomeOf(states []nut07.State, err error) swapOutcome {
	if err != nil {
		return swapUnknown
	}
	var unspent, spent int
	for _, s := range states {
		switch s {
		case nut07.Unspent:
			unspent++
		case nut07.Spent:
			spent++
		default:
			return swapUnknown
		}
	}
	switch {
	case spent == 0:
		return swapNotDone
	case unspent == 0:
		return swapDone
	}
	return swapSpentBefore
}

// swapFailed finds out from the mint what a failed swap did and records
// it (see the comment at the top of this file).
func (b *Backend) swapFailed(ctx context.Context, p vend.Payment, tok *Token, priceSats, fee uint64, swapErr error) (vend.TokenReceipt, error) {
	log := b.log.With(logRef, short(p.Ref), logCall, int64(p.CallID), logMint, tok.Mint)
	// The payment must end whatever the caller does now.
	bg := context.WithoutCancel(ctx)
	if errors.Is(swapErr, ErrClosed) || errors.Is(swapErr, ErrWalletBusy) {
		// The wallet never sent the swap.
		b.endSwap(bg, p.Ref, vend.SwapReleased, "the wallet was closed before the swap")
		return vend.TokenReceipt{}, swapErr
	}
	states, serr := b.proofStates(bg, tok.Mint, tok.Proofs)
	switch outcomeOf(states, serr) {
	case swapNotDone:
		b.endSwap(bg, p.Ref, vend.SwapReleased, "swap failed; the proofs are unspent")
		if rejectedByMint(swapErr) {
			log.Info("token refused by the mint", logErr, swapErr)
			return vend.TokenReceipt{}, fmt.Errorf("%w: %v", ErrMintRejected, swapErr)
		}
		log.Warn("token swap failed; the proofs are unspent and released: the client may retry with the same token", logErr, swapErr)
		return vend.TokenReceipt{}, fmt.Errorf("%w: swap: %v", ErrMintUnavailable, swapErr)
	case swapSpentBefore:
		b.endSwap(bg, p.Ref, vend.SwapSpent, "some proofs were spent before")
		return vend.TokenReceipt{}, ErrTokenSpent
	case swapDone:
		if spentAnswer(swapErr) {
			// The mint refused the swap because the proofs were spent
			// already: someone else's spend, not ours.
			b.endSwap(bg, p.Ref, vend.SwapSpent, "the mint says already spent")
			return vend.TokenReceipt{}, ErrTokenSpent
		}
		// Spent, and the mint never said why: our swap happened and its
		// answer was lost. Restore what the mint signed for the wallet.
		n, err := b.recoverWallet(bg, tok.Mint, "")
		if err == nil {
			log.Warn("token swap answer lost; the mint had swapped it: ecash restored, the payment settles", "restored_sat", n, logErr, swapErr)
			return b.settleToken(p, tok, tok.Amount-fee, priceSats)
		}
		log.Error("token swap answer lost and the ecash not restored yet; checked again later", logErr, err)
	}
	// No word from the mint: the outcome is settled later (Run, or the
	// same token coming again). The call does not wait for it.
	if _, err := b.ledger.EndPayment(bg, p.Ref, vend.PaymentCanceled, "swap outcome unknown: the mint did not answer"); err != nil {
		log.Error("ending a token payment whose swap's outcome is unknown", logErr, err)
	}
	log.Warn("token swap outcome unknown; the proofs stay swapping until the mint answers", logErr, swapErr, "state_err", serr)
	return vend.TokenReceipt{}, fmt.Errorf("%w: swap: %v", ErrMintUnavailable, swapErr)
}

// endSwap records a failed swap's end, logging what cannot be recorded.
func (b *Backend) endSwap(ctx context.Context, ref, to, reason string) {
	if err := b.tl.EndSwap(ctx, ref, to, reason); err != nil && !errors.Is(err, vend.ErrIllegalTransition) {
		b.log.Error("recording the end of a token swap", logRef, short(ref), "end", to, logErr, err)
	}
}

// rejectedByMint reports whether a failed swap is the mint refusing the
// proofs or outputs (they will never swap) rather than failing. gonuts
// flattens the mint's error into text, so its fixed details are matched.
func rejectedByMint(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, e := range []cashu.Error{cashu.InvalidProofErr, cashu.DuplicateProofs, cashu.NoProofsProvided, cashu.UnknownKeysetErr,
		cashu.InsufficientProofsAmount, cashu.InvalidBlindedMessageAmount, cashu.InactiveKeysetSignatureRequest, cashu.UnitNotSupportedErr} {
		if strings.Contains(msg, e.Detail) {
			return true
		}
	}
	return strings.Contains(msg, "invalid DLEQ proof")
}

// spentAnswer reports whether the mint answered a swap that its proofs
// are spent (or pending) already.
func spentAnswer(err error) bool {
	var ce cashu.Error
	if errors.As(err, &ce) && ce.Code == cashu.ProofAlreadyUsedErrCode {
		return true
	}
	return err != nil && (strings.Contains(err.Error(), cashu.ProofAlreadyUsedErr.Detail) || strings.Contains(err.Error(), cashu.ProofPendingErr.Detail))
}

// resolveEarlier settles the swaps whose outcome is unknown that hold any
// of the secret hashes (a token coming again after the mint did not
// answer). ErrMintUnavailable if the mint still cannot tell.
func (b *Backend) resolveEarlier(ctx context.Context, hashes []string) error {
	sts, err := b.tl.SwappingTokens(ctx, hashes)
	if err != nil {
		return fmt.Errorf("cashu: accept token: %w", err)
	}
	for _, st := range sts {
		if st.Payment.State == vend.PaymentOpen && !st.Payment.CreatedAt.Before(b.born) {
			continue // being swapped right now: replayed
		}
		if err := b.resolveSwap(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// resolveSwap asks the mint what became of a swap whose outcome was never
// recorded, and records it: unspent, released; spent, the ecash restored
// (NUT-09) and the settlement booked late with the refund owed (the call
// did not run); no answer, ErrMintUnavailable and nothing changes.
func (b *Backend) resolveSwap(ctx context.Context, st vend.SwappingToken) error {
	p := st.Payment
	mint, ok := b.trusted(p.MintURL)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUntrustedMint, p.MintURL)
	}
	ys := make([]string, len(st.Proofs))
	ids := make([]string, len(st.Proofs))
	var amount uint64
	for i, pr := range st.Proofs {
		if pr.Y == "" {
			return fmt.Errorf("cashu: payment %s: a proof without its Y cannot be checked", short(p.Ref))
		}
		ys[i], ids[i] = pr.Y, pr.KeysetID
		amount += uint64(pr.AmountSat)
	}
	log := b.log.With(logRef, short(p.Ref), logCall, int64(p.CallID), logMint, mint)
	states, err := b.statesByY(ctx, mint, ys)
	switch outcomeOf(states, err) {
	case swapUnknown:
		if err == nil {
			err = errors.New("proofs pending at the mint")
		}
		return fmt.Errorf("%w: swap of payment %s: %v", ErrMintUnavailable, short(p.Ref), err)
	case swapNotDone:
		b.endSwap(ctx, p.Ref, vend.SwapReleased, "the mint says unspent: the swap did not happen")
		log.Info("unrecorded token swap did not happen: proofs released")
		return nil
	case swapSpentBefore:
		b.endSwap(ctx, p.Ref, vend.SwapSpent, "some proofs were spent before")
		return nil
	}
	// Spent: the swap happened. Restore what the mint signed for the
	// wallet and never reached it (nothing if the wallet saved it).
	if _, err := b.recoverWallet(ctx, mint, ""); err != nil {
		return fmt.Errorf("%w: restoring the swap of payment %s: %v", ErrMintUnavailable, short(p.Ref), err)
	}
	fee, err := b.inputFeeIDs(ctx, mint, ids)
	if err != nil {
		return err
	}
	if fee > amount {
		fee = amount
	}
	sp, err := b.tl.SettleSwap(context.WithoutCancel(ctx), vend.Settlement{Ref: p.Ref, Amount: vend.Msat(amount * vend.MsatPerSat),
		Fee: vend.Msat(fee * vend.MsatPerSat)}, "the swap happened but was not recorded; the call did not run")
	if errors.Is(err, vend.ErrAlreadySettled) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cashu: booking the swap of payment %s: %w", short(p.Ref), err)
	}
	log.Warn("unrecorded token swap had happened: settlement booked, the call's refund is owed", logAmount, int64(sp.Settled))
	return nil
}

// resolveSwapping settles what is known of every swap whose outcome was
// never recorded, except those being swapped by this process right now.
// It reports how many stay unknown.
func (b *Backend) resolveSwapping(ctx context.Context) (unknown int) {
	sts, err := b.tl.SwappingTokens(ctx, nil)
	if err != nil {
		b.log.Error("listing unrecorded token swaps", logErr, err)
		return 0
	}
	for _, st := range sts {
		if st.Payment.State == vend.PaymentOpen && !st.Payment.CreatedAt.Before(b.born) {
			continue
		}
		if err := b.resolveSwap(ctx, st); err != nil {
			unknown++
			b.log.Debug("token swap outcome still unknown", logRef, short(st.Payment.Ref), logErr, err)
		}
	}
	return unknown
}
