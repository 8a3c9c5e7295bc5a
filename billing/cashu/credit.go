package cashu

import (
	"context"
	"fmt"
	"slices"

	"github.com/capvend/capvend/vend"
)

// CreditBook is the part of the ledger a credit refund uses; *ledger.Ledger
// implements it.
type CreditBook interface {
	CreditBalance(ctx context.Context, account string) (vend.Msat, error)
	// RefundCredit books a payout of an account's credit in one
	// transaction; one larger than the balance is refused.
	RefundCredit(ctx context.Context, account string, p vend.CreditPayout) error
}

// PayCreditToken pays what is left of a credit account (whole sats; a
// fraction of a sat stays in the account) as a Cashu token from the wallet
// in dir, at mint (or the first of mints), and books it. A token made but
// not booked is taken back into the wallet. ErrWalletBusy while capvend
// serves.
func PayCreditToken(ctx context.Context, dir string, mints []string, mint, account string, l CreditBook) (vend.CreditPayout, string, error) {
	if err := checkWalletFree(dir); err != nil {
		return vend.CreditPayout{}, "", err
	}
	sats, mint, err := creditToPay(ctx, l, mints, mint, account)
	if err != nil {
		return vend.CreditPayout{}, "", err
	}
	w, err := openWallet(dir, []string{mint})
	if err != nil {
		return vend.CreditPayout{}, "", err
	}
	defer w.Shutdown()
	token, fee, err := makeToken(w, mint, uint64(sats))
	if err != nil {
		return vend.CreditPayout{}, "", err
	}
	p := vend.CreditPayout{Method: vend.RefundCashu, MintURL: mint, Paid: vend.Msat(sats) * vend.MsatPerSat, Fee: vend.Msat(fee) * vend.MsatPerSat}
	if err := l.RefundCredit(context.WithoutCancel(ctx), account, p); err != nil {
		if terr := takeBack(w, token); terr != nil {
			return p, "", fmt.Errorf("cashu: credit %s: booking failed: %w; taking the token back failed too (%v): hand it over or receive it: %s", account, err, terr, token)
		}
		return p, "", fmt.Errorf("cashu: credit %s: booking failed (the token was taken back): %w", account, err)
	}
	return p, token, nil
}

// PayCreditInvoice pays a credit account's client the bolt11 invoice (an
// amount in whole sats, at most the balance) from the wallet's ecash (a
// melt, NUT-05) and books it once the mint reports it paid.
func PayCreditInvoice(ctx context.Context, dir string, mints []string, mint, account, invoice string, l CreditBook) (vend.CreditPayout, MeltResult, error) {
	if err := checkWalletFree(dir); err != nil {
		return vend.CreditPayout{}, MeltResult{}, err
	}
	invoice, amount, err := meltableInvoice(invoice)
	if err != nil {
		return vend.CreditPayout{}, MeltResult{}, err
	}
	sats, mint, err := creditToPay(ctx, l, mints, mint, account)
	if err != nil {
		return vend.CreditPayout{}, MeltResult{}, err
	}
	if amount > vend.Msat(sats)*vend.MsatPerSat {
		return vend.CreditPayout{}, MeltResult{}, fmt.Errorf("cashu: credit %s: the invoice asks %s, more than the %d sats left: refused", account, amount, sats)
	}
	w, err := openWallet(dir, []string{mint})
	if err != nil {
		return vend.CreditPayout{}, MeltResult{}, err
	}
	defer w.Shutdown()
	res, _, err := melt(w, mint, invoice)
	if err != nil {
		return vend.CreditPayout{}, res, err
	}
	p := vend.CreditPayout{Method: vend.RefundBolt11, MintURL: mint, Paid: res.Amount, Fee: res.Fee}
	// Not ctx: the money left; the booking must not be skipped.
	if err := l.RefundCredit(context.Background(), account, p); err != nil {
		return p, res, fmt.Errorf("cashu: credit %s: the invoice was PAID (melt quote %s, %s + %s fee) but booking it failed: %w; book it by hand", account, res.Quote, res.Amount, res.Fee, err)
	}
	return p, res, nil
}

// creditToPay returns the whole sats left in account and the mint to pay
// them from (mint if given, else the first of mints).
func creditToPay(ctx context.Context, l CreditBook, mints []string, mint, account string) (int64, string, error) {
	bal, err := l.CreditBalance(ctx, account)
	if err != nil {
		return 0, "", err
	}
	sats := int64(bal / vend.MsatPerSat)
	if sats <= 0 {
		return 0, "", fmt.Errorf("cashu: credit %s holds %s: nothing to refund", account, bal)
	}
	switch {
	case mint != "" && !slices.Contains(mints, mint):
		return 0, "", fmt.Errorf("cashu: mint %s is not one of cashu.mints", mint)
	case mint != "":
	case len(mints) == 0:
		return 0, "", fmt.Errorf("cashu: no mint configured to pay from")
	default:
		mint = mints[0]
	}
	return sats, mint, nil
}
