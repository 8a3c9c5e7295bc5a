package cashu

import (
	"context"
	"errors"
	"fmt"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/vend"
)

// Refunds paid from the wallet. A refund is paid at most once, and by one
// payer: its payout is reserved in the ledger before a token is made or a
// melt is paid (payout.go), and the ledger refuses a second reservation
// of the same refund, so another instance paying it on the client's
// replay, or the operator, is refused before it pays anything. A token
// made but not booked is taken back into the wallet.

// ErrNoRefundInvoice: a refund is to be paid to a bolt11 but none was
// given, by the client or the operator.
var ErrNoRefundInvoice = errors.New("cashu: no invoice to pay the refund to (the client gave none: pass one, or pay with a Cashu token)")

// RefundBook is the part of the ledger refund payouts use; *ledger.Ledger
// implements it.
type RefundBook interface {
	RefundByID(ctx context.Context, id vend.RefundID) (vend.Refund, error)
	PayoutBook
}

// PayRefund implements vend.RefundPayer: it reserves the refund's payout,
// makes a token for it (its amount rounded up to a whole sat) from the
// wallet's ecash at the refund's mint (the first trusted mint if it has
// none, or no longer is trusted), records it and books it. A refund paid
// before is returned as it is. A refund reserved by a payout this wallet
// left in flight (a crash) is resolved first; one another instance is
// paying is vend.ErrPayoutInFlight. On error the refund stays owed: the
// wallet holds too little there (ErrInsufficientFunds), or the mint
// cannot be reached (ErrMintUnavailable) when the token needs a swap.
func (b *Backend) PayRefund(ctx context.Context, r vend.Refund) (vend.Refund, error) {
	b.refundMu.Lock()
	defer b.refundMu.Unlock()
	cur, err := b.tl.CallRefund(ctx, r.CallID)
	if err != nil {
		return r, fmt.Errorf("cashu: refund %d: %w", r.ID, err)
	}
	if cur.State == vend.RefundPaid {
		return cur, nil
	}
	mint, ok := b.trusted(cur.MintURL)
	if !ok {
		mint = b.mints[0]
	}
	p, err := b.payer()
	if err != nil {
		return cur, fmt.Errorf("cashu: refund %d: %w", cur.ID, err)
	}
	np := vend.NewPayout{Kind: vend.PayoutRefund, Refund: cur.ID, MintURL: mint, Amount: vend.Msat(cur.Amount.SatsCeil() * vend.MsatPerSat)}
	po, err := p.payToken(ctx, np)
	if errors.Is(err, vend.ErrPayoutInFlight) {
		// Ours, left by a crash? Resolve this wallet's, then try again
		// (another instance's stays its own).
		if _, _, rerr := p.resolve(ctx); rerr != nil {
			b.log.Warn("payouts left in flight not resolved", logErr, rerr)
		}
		po, err = p.payToken(ctx, np)
	}
	if errors.Is(err, vend.ErrRefundPaid) {
		return b.tl.CallRefund(ctx, cur.CallID)
	}
	if err != nil {
		if errors.Is(err, errNotTakenBack) {
			b.log.Error("refund token made but not booked, and not taken back: 'capvend cashu balance' shows it pending", "refund", int64(cur.ID), "payout", int64(po.ID), logErr, err)
		}
		return cur, fmt.Errorf("cashu: refund %d: %w", cur.ID, err)
	}
	paid, err := b.tl.CallRefund(context.WithoutCancel(ctx), cur.CallID)
	if err != nil {
		return cur, fmt.Errorf("cashu: refund %d paid by payout %d: %w", cur.ID, po.ID, err)
	}
	b.log.Info("refund paid as a Cashu token", "refund", int64(paid.ID), "payout", int64(po.ID), logCall, int64(paid.CallID), logMint, mint,
		logAmount, int64(paid.Paid), logFee, int64(paid.Fee))
	return paid, nil
}

// makeToken takes sats of ecash at mint out of w as a token (a swap at the
// mint when the wallet holds no exact proofs), and returns it with the
// fee that cost.
func makeToken(w *wallet.Wallet, mint string, sats uint64) (string, uint64, error) {
	before := w.GetBalanceByMints()[mint]
	if before < sats {
		return "", 0, fmt.Errorf("%w: %s holds %d sat, the refund is %d sat", ErrInsufficientFunds, mint, before, sats)
	}
	proofs, err := w.Send(sats, mint, false)
	if err != nil {
		if errors.Is(err, wallet.ErrInsufficientMintBalance) {
			return "", 0, fmt.Errorf("%w: %v", ErrInsufficientFunds, err)
		}
		return "", 0, fmt.Errorf("%w: making a token: %v", ErrMintUnavailable, err)
	}
	var fee uint64
	if after := w.GetBalanceByMints()[mint]; before >= after && before-after > sats {
		fee = before - after - sats
	}
	t := &Token{Mint: mint, Unit: cashu.Sat.String(), Proofs: proofs}
	s, err := t.Serialize()
	if err != nil {
		return "", 0, errors.Join(fmt.Errorf("cashu: serializing a token: %w", err), takeBackProofs(w, mint, proofs))
	}
	return s, fee, nil
}

// takeBack swaps a token made by w back into it.
func takeBack(w *wallet.Wallet, token string) error {
	t, err := ParseToken(token)
	if err != nil {
		return err
	}
	return takeBackProofs(w, t.Mint, t.Proofs)
}

func takeBackProofs(w *wallet.Wallet, mint string, proofs cashu.Proofs) error {
	v3, err := cashu.NewTokenV3(proofs, mint, cashu.Sat, false)
	if err != nil {
		return err
	}
	_, err = w.Receive(v3, false)
	return err
}

// owedRefund reads refund id and checks it is owed.
func owedRefund(ctx context.Context, l RefundBook, id vend.RefundID) (vend.Refund, error) {
	r, err := l.RefundByID(ctx, id)
	if err != nil {
		return r, err
	}
	if r.State != vend.RefundOwed {
		return r, fmt.Errorf("%w: refund %d (call %d) was paid %s by %s", vend.ErrRefundPaid, r.ID, r.CallID,
			r.PaidAt.Format("2006-01-02 15:04:05Z07:00"), r.Method)
	}
	return r, nil
}

// refundMint is the mint a refund is paid from: mint if given, else the
// refund's own if it is one of mints, else the first of mints.
func refundMint(r vend.Refund, mints []string, mint string) (string, error) {
	if mint != "" {
		return NormalizeMintURL(mint)
	}
	if len(mints) == 0 {
		return "", errors.New("cashu: no mint configured")
	}
	own, _ := NormalizeMintURL(r.MintURL)
	first := ""
	for i, m := range mints {
		n, err := NormalizeMintURL(m)
		if err != nil {
			return "", err
		}
		if i == 0 {
			first = n
		}
		if own != "" && n == own {
			return n, nil
		}
	}
	return first, nil
}

// PayRefundToken pays owed refund id with a Cashu token made from the
// wallet in dir, for the operator to hand to the client: the ecash of
// mint if given, else of the refund's own mint if it is one of mints, else
// of mints[0]; the refund's amount rounded up to a whole sat. The payout
// is reserved first (refused while another payer has it in flight:
// vend.ErrPayoutInFlight), the token made and recorded, then booked
// (liabilities:refunds to assets:cashu:<mint>, fees an expense); it
// returns the refund paid, with its token (a bearer secret). It contacts
// the mint when the wallet holds no exact proofs. It first resolves the
// payouts this wallet left in flight. It fails with ErrWalletBusy while
// capvend serves, vend.ErrRefundPaid for a refund paid before,
// ErrInsufficientFunds; a token made but not booked is taken back into
// the wallet.
func PayRefundToken(ctx context.Context, dir string, mints []string, mint string, id vend.RefundID, l RefundBook) (vend.Refund, error) {
	if err := checkWalletFree(dir); err != nil {
		return vend.Refund{}, err
	}
	r, err := owedRefund(ctx, l, id)
	if err != nil {
		return r, err
	}
	if mint, err = refundMint(r, mints, mint); err != nil {
		return r, err
	}
	w, err := openWallet(dir, []string{mint})
	if err != nil {
		return r, err
	}
	defer w.Shutdown()
	p := cliPayer(w, l)
	p.resolve(ctx) // what it cannot resolve stays reserved: a refund in it is refused below
	po, err := p.payToken(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, MintURL: mint,
		Amount: vend.Msat(r.Amount.SatsCeil() * vend.MsatPerSat)})
	if err != nil {
		if errors.Is(err, errNotTakenBack) && po.Token != "" {
			return r, fmt.Errorf("cashu: refund %d: %w: hand it over or receive it: %s", r.ID, err, po.Token)
		}
		return r, fmt.Errorf("cashu: refund %d: %w", r.ID, err)
	}
	return l.RefundByID(context.WithoutCancel(ctx), r.ID)
}

// PayRefundInvoice pays owed refund id to a Lightning invoice from the
// ecash of the wallet in dir (a melt, NUT-05): invoice, or if "" the one
// the client gave with the call (ErrNoRefundInvoice if none). The invoice
// must carry an amount in whole sats, at most the amount owed (a smaller
// one settles the refund: the rest was given up by the client and stays
// income:overpayments). mint, mints choose the ecash as for
// PayRefundToken. The payout is reserved with its melt quote before the
// melt (refused while another payer has it in flight), booked once the
// mint reports the invoice paid, released if it did not pay; a melt the
// mint reports pending stays reserved until the wallet is opened again.
// It first resolves the payouts this wallet left in flight. It fails with
// ErrWalletBusy while capvend serves, vend.ErrRefundPaid for a refund
// paid before, ErrInsufficientFunds when the wallet cannot cover the
// amount and the mint's fee reserve.
func PayRefundInvoice(ctx context.Context, dir string, mints []string, mint string, id vend.RefundID, invoice string, l RefundBook) (vend.Refund, MeltResult, error) {
	if err := checkWalletFree(dir); err != nil {
		return vend.Refund{}, MeltResult{}, err
	}
	r, err := owedRefund(ctx, l, id)
	if err != nil {
		return r, MeltResult{}, err
	}
	if invoice == "" {
		invoice = r.Invoice
	}
	if invoice == "" {
		return r, MeltResult{}, ErrNoRefundInvoice
	}
	invoice, amount, err := meltableInvoice(invoice)
	if err != nil {
		return r, MeltResult{}, err
	}
	if amount > r.Amount {
		return r, MeltResult{}, fmt.Errorf("cashu: refund %d: the invoice asks %s, more than the %s owed: refused", r.ID, amount, r.Amount)
	}
	if mint, err = refundMint(r, mints, mint); err != nil {
		return r, MeltResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return r, MeltResult{}, err
	}
	w, err := openWallet(dir, []string{mint})
	if err != nil {
		return r, MeltResult{}, err
	}
	defer w.Shutdown()
	p := cliPayer(w, l)
	p.resolve(ctx)
	_, res, err := p.payInvoice(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, MintURL: mint, Amount: amount}, invoice)
	if err != nil {
		return r, res, fmt.Errorf("cashu: refund %d: %w", r.ID, err)
	}
	paid, err := l.RefundByID(context.WithoutCancel(ctx), r.ID)
	return paid, res, err
}
