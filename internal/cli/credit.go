package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

func creditCommand() *command {
	var lf ledgerFlags
	return &command{
		Name:    "credit",
		Summary: "list prepaid credit balances; 'credit show ACCOUNT', 'credit refund ACCOUNT' pays what is left back",
		Help: `Prepaid credit (credit.enabled): a client buys N sats with the capvend_topup
tool and pays priced calls from its balance with the credit token the
top-up answer gave (or, on Nostr, with its own pubkey's account). Each
account's balance is money owed to the client, in liabilities:credit:<account>;
'ledger verify' checks every balance against its top-ups, draws, give-backs,
expiries and refunds, and against the journal.

Lists, one line each: the account (t + 24 hex digits, or nostr-<pubkey>), its
balance, what it bought, spent on calls (and how many), got back from failed
calls, lost to expiry and was refunded, and its last top-up; then the
payouts in flight (reserved from a balance, not booked yet). Safe while
'capvend serve' runs.

Examples:
  capvend credit
  capvend credit show t0123456789abcdef01234567
  capvend credit refund t0123456789abcdef01234567 --cashu`,
		Flags: lf.register,
		Run: func(ctx context.Context, e *env, args []string) error {
			return listCredit(ctx, e, &lf, "")
		},
		Subs: []*command{creditShowCommand(), creditRefundCommand()},
	}
}

func creditShowCommand() *command {
	var lf ledgerFlags
	return &command{
		Name:    "show",
		Args:    "ACCOUNT",
		Summary: "one credit account's balance and history totals",
		Help: `Shows one credit account, as 'capvend credit' lists it.

Example:
  capvend credit show t0123456789abcdef01234567`,
		Flags: lf.register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 1 {
				return usageError("show takes one ACCOUNT (see 'capvend credit')")
			}
			return listCredit(ctx, e, &lf, args[0])
		},
	}
}

func listCredit(ctx context.Context, e *env, lf *ledgerFlags, id string) error {
	l, err := lf.open(ctx, e)
	if err != nil {
		return err
	}
	defer l.Close()
	accts, err := l.CreditAccounts(ctx, id)
	if errors.Is(err, vend.ErrNotFound) {
		return &exitError{code: 1, err: fmt.Errorf("%w (see 'capvend credit')", err)}
	}
	if err != nil {
		return err
	}
	payouts, err := l.Payouts(ctx, false)
	if err != nil {
		return err
	}
	var inFlight []vend.Payout
	for _, p := range payouts {
		if p.Kind == vend.PayoutCredit && (id == "" || p.Account == id) {
			inFlight = append(inFlight, p)
		}
	}
	if err := writeCredit(e.Stdout, accts); err != nil {
		return err
	}
	return writePayouts(e.Stdout, inFlight)
}

// writeCredit prints accounts as a table and the total owed, and what
// payouts in flight hold.
func writeCredit(w io.Writer, accts []ledger.CreditAccountInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ACCOUNT\tBALANCE\tBOUGHT\tSPENT\tCALLS\tGIVEN BACK\tEXPIRED\tREFUNDED\tLAST TOP-UP\t")
	var total, reserved vend.Msat
	for _, a := range accts {
		reserved += a.Reserved
		topped := "-"
		if !a.ToppedUp.IsZero() {
			topped = a.ToppedUp.Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t\n", a.ID, a.Balance, a.TopUps, a.Draws, a.Calls, a.GiveBacks,
			a.Expired, a.Refunded, topped)
		total += a.Balance
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if reserved > 0 {
		_, err := fmt.Fprintf(w, "%d account(s), %s owed in credit, and %s reserved by payouts in flight\n", len(accts), total, reserved)
		return err
	}
	_, err := fmt.Fprintf(w, "%d account(s), %s owed in credit\n", len(accts), total)
	return err
}

// writePayouts lists payouts in flight: reserved in the ledger, their
// money perhaps on its way, not booked yet. The process holding the
// paying wallet resolves them (serve at start, or the next payout
// command).
func writePayouts(w io.Writer, ps []vend.Payout) error {
	if len(ps) == 0 {
		return nil
	}
	fmt.Fprintf(w, "%d payout(s) in flight (booked or released by the next 'capvend serve' or payout command on their wallet):\n", len(ps))
	for _, p := range ps {
		what := string(p.Kind)
		switch p.Kind {
		case vend.PayoutCredit:
			what = "credit " + p.Account
		case vend.PayoutRefund:
			what = fmt.Sprintf("refund %d", p.Refund)
		}
		how := "a Cashu token"
		switch {
		case p.NWC != "":
			how = "bolt11 through the NWC wallet, payment hash " + abbreviate(p.Quote, 16)
		case p.Method == vend.RefundBolt11:
			how = "bolt11, melt quote " + abbreviate(p.Quote, 12)
		case p.Token == "":
			how += " not made yet"
		}
		if _, err := fmt.Fprintf(w, "  payout %d: %s of %s by %s from %s (wallet %s) since %s\n", p.ID, p.Amount, what, how, p.From(),
			p.Wallet, p.CreatedAt.Format(time.DateTime)); err != nil {
			return err
		}
	}
	return nil
}

func creditRefundCommand() *command {
	var pf payoutFlags
	register := func(fs *flag.FlagSet) {
		pf.register(fs, "(whole sats, at most the balance)", "(default the first of cashu.mints)")
	}
	return &command{
		Name:    "refund",
		Args:    "ACCOUNT",
		Summary: "pay what is left of a credit account back: a Cashu token or a bolt11 (Cashu or NWC wallet)",
		Help: `Pays what is left of credit ACCOUNT back from capvend's Cashu wallet:
  --cashu            as a Cashu token of the whole sats left (a fraction of a
                     sat stays in the account), printed for you to hand over;
  --invoice BOLT11   to the client's invoice (an amount in whole sats, at
                     most the balance), through the mint (a melt, NUT-05);
or with --nwc (--nwc=NAME: one of nwc.wallets) and --invoice BOLT11 from the
wallet of an NWC connection granted pay_invoice and lookup_invoice: the
invoice's amount (at most the balance; one without an amount is paid the
whole balance), booked out of assets:lightning:nwc[:NAME], its fee
expenses:fees:nwc[:NAME]. An invoice asking more than the balance is
refused before anything is paid.
The payout is reserved in the ledger before anything leaves the wallet: the
amount moves out of the balance at once (to liabilities:credit_reserved), so
no call on any instance sharing the ledger can spend it meanwhile, and the
balance can never go below zero (the ledger refuses it). Once the token is
made (or the mint paid the invoice) it is booked:
  Dr liabilities:credit_reserved   what the client got
  Dr expenses:fees:cashu:<mint>    what paying cost
  Cr assets:cashu:<mint>           the ecash that left the wallet
and if nothing left it is released back to the balance. A payout left in
flight (capvend killed in between, a melt pending at the mint, a payment
pending at the wallet) is listed by 'capvend credit' and resolved from the
mint's or the wallet's word by the next payout command or 'capvend serve' on
the same wallet. The Cashu wallet is opened like 'capvend cashu melt': stop
'capvend serve' first; an NWC wallet may be paid from while it serves.

Examples:
  capvend credit refund t0123456789abcdef01234567 --cashu
  capvend credit refund t0123456789abcdef01234567 --invoice lnbc790n1...
  capvend credit refund t0123456789abcdef01234567 --nwc --invoice lnbc790n1...`,
		Flags: register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) == 0 {
				return usageError("refund takes the ACCOUNT (see 'capvend credit')")
			}
			if err := parseAfterArg("credit refund", "credit refund takes one argument", args, register); err != nil {
				return pf.nwc.hint(err)
			}
			cf, payCashu, invoice, mint := &pf.cf, pf.payCashu, pf.invoice, pf.mint
			if pf.nwc.set {
				return payCreditNWC(ctx, e, &pf, args[0])
			}
			if payCashu == (strings.TrimSpace(invoice) != "") {
				return usageError("say how to pay: --cashu or --invoice BOLT11")
			}
			l, dir, mints, err := cf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			account := args[0]
			if payCashu {
				p, token, err := cashu.PayCreditToken(ctx, dir, mints, mint, account, l)
				if err != nil {
					return refundError(err)
				}
				fmt.Fprintf(e.Stdout, "credit %s refunded: %s (fee %s) from %s\nhand this Cashu token to the client:\n%s\n",
					account, p.Paid, p.Fee, p.MintURL, token)
				return nil
			}
			p, res, err := cashu.PayCreditInvoice(ctx, dir, mints, mint, account, invoice, l)
			if err != nil {
				return refundError(err)
			}
			fmt.Fprintf(e.Stdout, "credit %s refunded: %s to the invoice (fee %s) from %s\nmelt quote %s\npreimage   %s\n",
				account, p.Paid, p.Fee, p.MintURL, res.Quote, res.Preimage)
			return nil
		},
	}
}
