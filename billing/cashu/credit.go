package cashu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/capvend/capvend/vend"
)

// CreditBook is the part of the ledger a credit refund uses; *ledger.Ledger
// implements it.
type CreditBook interface {
	CreditBalance(ctx context.Context, account string) (vend.Msat, error)
	PayoutBook
}

// PayCreditToken pays what is left of a credit account (whole sats; a
// fraction of a sat stays in the account) as a Cashu token from the wallet
// in dir, at mint (or the first of mints). The payout is reserved in the
// ledger first (the balance at that moment, taken out of it at once: no
// draw on any instance spends it meanwhile), the token is made and
// recorded, then booked; it is returned only once booked. Not booked, the
// reservation is released and the token taken back into the wallet. It
// first resolves the payouts this wallet left in flight. ErrWalletBusy
// while capvend serves.
func PayCreditToken(ctx context.Context, dir string, mints []string, mint, account string, l CreditBook) (vend.CreditPayout, string, error) {
	if err := checkWalletFree(dir); err != nil {
		return vend.CreditPayout{}, "", err
	}
	_, mint, err := creditToPay(ctx, l, mints, mint, account)
	if err != nil {
		return vend.CreditPayout{}, "", err
	}
	w, err := openWallet(dir, []string{mint})
	if err != nil {
		return vend.CreditPayout{}, "", err
	}
	defer w.Shutdown()
	p := cliPayer(w, l)
	p.resolve(ctx) // what it cannot resolve stays reserved: nothing below can spend it
	po, err := p.payToken(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: account, MintURL: mint})
	if err != nil {
		if errors.Is(err, errNotTakenBack) && po.Token != "" {
			return vend.CreditPayout{}, "", fmt.Errorf("cashu: credit %s: %w: hand it over or receive it: %s", account, err, po.Token)
		}
		return vend.CreditPayout{}, "", fmt.Errorf("cashu: credit %s: %w", account, err)
	}
	return vend.CreditPayout{Method: vend.RefundCashu, MintURL: mint, Paid: po.Amount, Fee: po.Fee}, po.Token, nil
}

// PayCreditInvoice pays a credit account's client the bolt11 invoice (an
// amount in whole sats, at most the balance) from the wallet's ecash (a
// melt, NUT-05): the payout is reserved in the ledger with its melt quote
// first (the amount taken out of the balance at once: refused if the
// balance no longer covers it), then melted, then booked once the mint
// reports it paid, or released if it did not pay. A melt the mint reports
// pending stays reserved (the error says so) until the wallet is opened
// again. It first resolves the payouts this wallet left in flight.
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
	p := cliPayer(w, l)
	p.resolve(ctx)
	po, res, err := p.payInvoice(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: account, MintURL: mint, Amount: amount}, invoice)
	if err != nil {
		return vend.CreditPayout{}, res, fmt.Errorf("cashu: credit %s: %w", account, err)
	}
	return vend.CreditPayout{Method: vend.RefundBolt11, MintURL: mint, Paid: po.Amount, Fee: po.Fee}, res, nil
}

// creditToPay returns the whole sats left in account and the mint to pay
// them from (mint if given, else the first of mints). The balance read
// here only words an early refusal: the reservation decides.
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
