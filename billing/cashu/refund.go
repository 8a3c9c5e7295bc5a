package cashu

import (
	"context"
	"errors"
	"fmt"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/vend"
)

// Refunds paid from the wallet. A refund is paid at most once: the payout
// is booked by the ledger's PayRefund, whose schema refuses a second one;
// the wallet being held by one process at a time (a running capvend, or a
// `capvend refunds pay`) keeps two payers from even making a token or a
// Lightning payment for the same refund. A token made but not booked is
// taken back into the wallet.

// ErrNoRefundInvoice: a refund is to be paid to a bolt11 but none was
// given, by the client or the operator.
var ErrNoRefundInvoice = errors.New("cashu: no invoice to pay the refund to (the client gave none: pass one, or pay with a Cashu token)")

// RefundBook is the part of the ledger refund payouts use; *ledger.Ledger
// implements it.
type RefundBook interface {
	RefundByID(ctx context.Context, id vend.RefundID) (vend.Refund, error)
	PayRefund(ctx context.Context, id vend.RefundID, p vend.RefundPayout) (vend.Refund, error)
}

// PayRefund implements vend.RefundPayer: it makes a token for the refund
// (its amount rounded up to a whole sat) from the wallet's ecash at the
// refund's mint (the first trusted mint if it has none, or no longer is
// trusted) and books the payout. A refund paid before is returned as it
// is. On error the refund stays owed: the wallet holds too little there
// (ErrInsufficientFunds), or the mint cannot be reached
// (ErrMintUnavailable) when the token needs a swap.
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
	sats := uint64(cur.Amount.SatsCeil())
	var token string
	var fee uint64
	err = b.withWallet(func(w *wallet.Wallet) error {
		var err error
		token, fee, err = makeToken(w, mint, sats)
		return err
	})
	if err != nil {
		return cur, fmt.Errorf("cashu: refund %d: %w", cur.ID, err)
	}
	paid, err := b.tl.PayRefund(context.WithoutCancel(ctx), cur.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: mint,
		Paid: vend.Msat(sats * vend.MsatPerSat), Fee: vend.Msat(fee * vend.MsatPerSat), Token: token})
	if err != nil {
		b.log.Error("refund token made but not booked; taking it back into the wallet", "refund", int64(cur.ID), logErr, err)
		if terr := b.withWallet(func(w *wallet.Wallet) error { return takeBack(w, token) }); terr != nil {
			b.log.Error("taking back an unbooked refund token failed: 'capvend cashu balance' shows it pending", "refund", int64(cur.ID), logErr, terr)
		}
		return cur, fmt.Errorf("cashu: refund %d: %w", cur.ID, err)
	}
	b.log.Info("refund paid as a Cashu token", "refund", int64(paid.ID), logCall, int64(paid.CallID), logMint, mint,
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
// of mints[0]; the refund's amount rounded up to a whole sat. It books the
// payout (liabilities:refunds to assets:cashu:<mint>, fees an expense) and
// returns the refund paid, with its token (a bearer secret). It contacts
// the mint when the wallet holds no exact proofs. It fails with
// ErrWalletBusy while capvend serves, vend.ErrRefundPaid for a refund
// paid before, ErrInsufficientFunds; a token made but not booked is taken
// back into the wallet.
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
	sats := uint64(r.Amount.SatsCeil())
	token, fee, err := makeToken(w, mint, sats)
	if err != nil {
		return r, err
	}
	paid, err := l.PayRefund(context.WithoutCancel(ctx), r.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: mint,
		Paid: vend.Msat(sats * vend.MsatPerSat), Fee: vend.Msat(fee * vend.MsatPerSat), Token: token})
	if err != nil {
		if terr := takeBack(w, token); terr != nil {
			return r, fmt.Errorf("cashu: refund %d: booking failed: %w; taking the token back failed too (%v): hand it over or receive it: %s", r.ID, err, terr, token)
		}
		return r, fmt.Errorf("cashu: refund %d: booking failed (the token was taken back): %w", r.ID, err)
	}
	return paid, nil
}

// PayRefundInvoice pays owed refund id to a Lightning invoice from the
// ecash of the wallet in dir (a melt, NUT-05): invoice, or if "" the one
// the client gave with the call (ErrNoRefundInvoice if none). The invoice
// must carry an amount in whole sats, at most the amount owed (a smaller
// one settles the refund: the rest was given up by the client and stays
// income:overpayments). mint, mints choose the ecash as for
// PayRefundToken. It books the payout once the mint reports the invoice
// paid. It fails with ErrWalletBusy while capvend serves,
// vend.ErrRefundPaid for a refund paid before, ErrInsufficientFunds when
// the wallet cannot cover the amount and the mint's fee reserve.
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
	res, _, err := melt(w, mint, invoice)
	if err != nil {
		return r, res, err
	}
	// Not ctx: the money left; the booking must not be skipped.
	paid, err := l.PayRefund(context.Background(), r.ID, vend.RefundPayout{Method: vend.RefundBolt11, MintURL: mint,
		Paid: res.Amount, Fee: res.Fee, Ref: res.Quote})
	if err != nil {
		return r, res, fmt.Errorf("cashu: refund %d: the invoice was PAID (melt quote %s, %s + %s fee) but booking it failed: %w; book it by hand", r.ID, res.Quote, res.Amount, res.Fee, err)
	}
	return paid, res, nil
}
