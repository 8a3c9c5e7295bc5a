package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/vend"
)

func refundsCommand() *command {
	var lf ledgerFlags
	var all bool
	return &command{
		Name:    "refunds",
		Summary: "list the refunds owed to clients (--all: paid ones too); 'refunds pay ID' pays one",
		Help: `A paid call that fails (the tool fails, a crash interrupts a call that must
not run twice, a payment arrives after the request expired) is refunded:
  - a hold invoice is canceled: Lightning returns the money, nothing is owed;
  - a Cashu payment (a token, or a mint quote's invoice) is paid back at once
    with a Cashu token from capvend's wallet, handed to the client in the
    answer (error data.refund, or _meta["capvend/refund"] of the result);
    if the wallet cannot make one (the mint is down) it stays owed, and is
    paid when the client repeats the request;
  - a plain invoice's payment (LND's, or an NWC wallet's without hold
    invoices) stays owed: listed here, paid with 'capvend refunds pay',
    from the Cashu wallet or (--nwc) from the NWC wallet.
An owed refund is money in liabilities:refunds; 'ledger balance' shows the
same total, and 'ledger verify' checks the two agree.

Lists, one line each: the refund's id, its call, the amount owed (sats with
millisatoshi precision), to whom (the call's transport and client: an MCP
session id or a Nostr pubkey), the refund invoice the client gave with the
call (_meta["capvend/refund_invoice"]), when and why. With --all, paid
refunds too, with how they were paid. Safe while 'capvend serve' runs.

Examples:
  capvend refunds
  capvend refunds --all
  capvend refunds pay 3`,
		Flags: func(fs *flag.FlagSet) {
			lf.register(fs)
			fs.BoolVar(&all, "all", false, "list paid refunds too")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			rs, err := l.Refunds(ctx, all)
			if err != nil {
				return err
			}
			payouts, err := l.Payouts(ctx, false)
			if err != nil {
				return err
			}
			var inFlight []vend.Payout
			for _, p := range payouts {
				if p.Kind == vend.PayoutRefund {
					inFlight = append(inFlight, p)
				}
			}
			if err := writeRefunds(e.Stdout, rs, all, inFlight); err != nil {
				return err
			}
			return writePayouts(e.Stdout, inFlight)
		},
		Subs: []*command{refundsPayCommand()},
	}
}

// writeRefunds prints refunds as a table and a total of what is owed; an
// owed refund a payout in flight is paying says so.
func writeRefunds(w io.Writer, rs []vend.Refund, all bool, inFlight []vend.Payout) error {
	paying := map[vend.RefundID]vend.PayoutID{}
	for _, p := range inFlight {
		paying[p.Refund] = p.ID
	}
	var owed vend.Msat
	n := 0
	for _, r := range rs {
		if r.State == vend.RefundOwed {
			owed += r.Amount
			n++
		}
	}
	if len(rs) > 0 {
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCALL\tAMOUNT (sat)\tSTATE\tTO\tREFUND INVOICE\tSINCE\tREASON")
		for _, r := range rs {
			state := string(r.State)
			if id, ok := paying[r.ID]; ok && r.State == vend.RefundOwed {
				state = fmt.Sprintf("owed, payout %d in flight", id)
			}
			if r.State == vend.RefundPaid {
				state = "paid by " + string(r.Method)
				if r.Method == vend.RefundBolt11 {
					state += " (" + string(r.Paid.AppendSats(nil)) + ")"
				}
				if vend.Backend(r.PaidFrom).IsNWC() {
					state += " from " + r.PaidFrom
				}
			}
			inv := "-"
			if r.Invoice != "" {
				inv = abbreviate(r.Invoice, 24)
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s %s\t%s\t%s\t%s\n", r.ID, r.CallID, r.Amount.AppendSats(nil), state,
				r.Transport, r.Client, inv, r.CreatedAt.Format("2006-01-02 15:04Z"), r.Reason)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	switch {
	case n == 0 && !all:
		_, err := fmt.Fprintln(w, "no refunds owed")
		return err
	default:
		_, err := fmt.Fprintf(w, "%d refund(s) owed, %s sat in all\n", n, owed.AppendSats(nil))
		return err
	}
}

func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// payoutFlags are the flags of a command paying money back from the
// Cashu wallet or an NWC wallet (refunds pay, credit refund).
type payoutFlags struct {
	cf       cashuFlags
	payCashu bool
	invoice  string
	mint     string
	nwc      nwcFlag
}

// register registers the flags; invoiceHelp and mintHelp say what
// --invoice and --mint default to.
func (p *payoutFlags) register(fs *flag.FlagSet, invoiceHelp, mintHelp string) {
	p.cf.register(fs)
	fs.BoolVar(&p.payCashu, "cashu", false, "pay with a Cashu token from the wallet, printed for you to hand to the client")
	fs.StringVar(&p.invoice, "invoice", "", "pay this bolt11 `INVOICE` "+invoiceHelp)
	fs.StringVar(&p.mint, "mint", "", "pay from the ecash of mint `URL` "+mintHelp)
	fs.Var(&p.nwc, "nwc", "pay the bolt11 from the wallet of an NWC connection (pay_invoice), not the Cashu wallet; "+
		"--nwc=NAME names one of nwc.wallets (\"nwc\": nwc.uri_file), default the first configured")
}

func refundsPayCommand() *command {
	var pf payoutFlags
	register := func(fs *flag.FlagSet) {
		pf.register(fs, "(at most the amount owed) instead of the client's",
			"(default the refund's mint if configured, else the first of cashu.mints)")
	}
	return &command{
		Name:    "pay",
		Args:    "ID",
		Summary: "pay an owed refund: to the client's bolt11 (from the Cashu or an NWC wallet), another bolt11, or as a Cashu token",
		Help: `Pays refund ID (see 'capvend refunds') once, from capvend's Cashu wallet:
  (default)          to the bolt11 invoice the client gave with the call
                     (_meta["capvend/refund_invoice"]), through the mint (a
                     melt, NUT-05); an error if it gave none;
  --invoice BOLT11   to that invoice instead;
  --cashu            as a Cashu token of the amount (rounded up to a whole
                     sat), printed for you to hand to the client;
or, with --nwc, from the wallet of an NWC connection (nwc.uri_file, or
--nwc=NAME one of nwc.wallets), to the client's invoice or --invoice's, by
the connection's pay_invoice: the connection must have been granted
pay_invoice and lookup_invoice (else the error says so; give it a budget).
An invoice asking more than is owed is refused before anything is paid; one
asking less settles the refund (the rest stays income:overpayments). From
the Cashu wallet it must carry an amount in whole sats; from an NWC wallet
any amount, and one without an amount is paid exactly what is owed. The
payout is reserved in the ledger before anything leaves the wallet (a
refund another payer has in flight is refused), then booked in one entry:
  Dr liabilities:refunds        the amount owed
  Dr expenses:fees:cashu:<mint> what paying cost (mint and Lightning fees)
  Cr assets:cashu:<mint>        the ecash that left the wallet
(from an NWC wallet: expenses:fees:nwc[:NAME], the fee the wallet reports,
and assets:lightning:nwc[:NAME], where the wallet's income is booked). A
refund is paid once: paying it again is refused (the ledger's schema
refuses a second payout). A payout left in flight (capvend killed between
paying and booking, a melt pending at the mint, a payment pending at the
wallet) is listed by 'capvend refunds' and resolved from the mint's or the
wallet's word (lookup_invoice) by the next payout command or 'capvend
serve' on the same wallet. The Cashu wallet is opened like 'capvend cashu
melt': stop 'capvend serve' first; an NWC wallet may be paid from while it
serves.

Examples:
  capvend refunds pay 3
  capvend refunds pay 3 --invoice lnbc210n1...
  capvend refunds pay 3 --cashu
  capvend refunds pay 3 --nwc
  capvend refunds pay 3 --nwc=coinos --invoice lnbc210n1...`,
		Flags: register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) == 0 {
				return usageError("pay takes the refund's ID (see 'capvend refunds')")
			}
			// Flags may follow the ID: parse them again.
			if err := parseAfterArg("refunds pay", "refunds pay takes one argument", args, register); err != nil {
				return pf.nwc.hint(err)
			}
			cf, payCashu, invoice, mint := &pf.cf, pf.payCashu, pf.invoice, pf.mint
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return usageError("refund ID %q: want a number from 'capvend refunds'", args[0])
			}
			if payCashu && invoice != "" {
				return usageError("--cashu and --invoice exclude each other")
			}
			if invoice != "" && strings.TrimSpace(invoice) == "" {
				return usageError("--invoice is empty")
			}
			if pf.nwc.set {
				return payRefundNWC(ctx, e, &pf, vend.RefundID(id))
			}
			l, dir, mints, err := cf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			if payCashu {
				r, err := cashu.PayRefundToken(ctx, dir, mints, mint, vend.RefundID(id), l)
				if err != nil {
					return refundError(err)
				}
				fmt.Fprintf(e.Stdout, "refund %d (call %d) paid: %s to %s %s (fee %s)\nhand this Cashu token to the client:\n%s\n",
					r.ID, r.CallID, r.Paid, r.Transport, r.Client, r.Fee, r.Token)
				return nil
			}
			r, res, err := cashu.PayRefundInvoice(ctx, dir, mints, mint, vend.RefundID(id), invoice, l)
			if err != nil {
				if errors.Is(err, cashu.ErrNoRefundInvoice) {
					return &exitError{code: 1, err: fmt.Errorf("refund %d: the client gave no refund invoice: pass --invoice BOLT11 or --cashu", id)}
				}
				return refundError(err)
			}
			fmt.Fprintf(e.Stdout, "refund %d (call %d) paid: %s to %s %s's invoice (fee %s) from %s\nmelt quote %s\npreimage   %s\n",
				r.ID, r.CallID, res.Amount, r.Transport, r.Client, res.Fee, res.Mint, res.Quote, res.Preimage)
			return nil
		},
	}
}

// refundError words a refused payout for the operator.
func refundError(err error) error {
	switch {
	case errors.Is(err, vend.ErrNotFound):
		return &exitError{code: 1, err: fmt.Errorf("%w (see 'capvend refunds')", err)}
	case errors.Is(err, vend.ErrRefundPaid):
		return &exitError{code: 1, err: err}
	}
	return err
}
