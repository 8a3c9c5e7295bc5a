package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
)

// cashuFlags find the wallet and the ledger of the Cashu commands.
type cashuFlags struct {
	config    string
	db        string
	walletDir string
}

func (f *cashuFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "configuration `FILE` (default $CAPVEND_CONFIG, else ./capvend.yaml)")
	fs.StringVar(&f.db, "db", "", "ledger `PATH`, overriding ledger.path of the configuration")
	fs.StringVar(&f.walletDir, "wallet-dir", "", "wallet `DIR`, overriding cashu.wallet_dir of the configuration")
}

// open loads the configuration and opens the existing ledger; it returns
// the wallet directory and the configured mints.
func (f *cashuFlags) open(ctx context.Context, e *env) (l *ledger.Ledger, walletDir string, mints []string, err error) {
	cfg, err := loadConfig(f.config, e.Getenv)
	if err != nil {
		return nil, "", nil, err
	}
	walletDir, mints = cfg.Cashu.WalletDir, cfg.Cashu.Mints
	if f.walletDir != "" {
		walletDir = f.walletDir
	}
	if walletDir == "" {
		return nil, "", nil, usageError("no wallet directory: set cashu.wallet_dir or pass --wallet-dir")
	}
	if err := checkSecretDir("cashu.wallet_dir", walletDir); err != nil {
		return nil, "", nil, err
	}
	l, err = cfg.Ledger.open(ctx, f.db, ledger.Options{MustExist: true})
	if err != nil {
		return nil, "", nil, err
	}
	return l, walletDir, mints, nil
}

func cashuCommand() *command {
	return &command{
		Name:    "cashu",
		Summary: "inspect capvend's Cashu wallet and withdraw its ecash over Lightning",
		Help: `capvend keeps the ecash it earns (minted from paid mint quotes, or swapped
from tokens clients hand over) in a gonuts wallet in cashu.wallet_dir. These
commands open that wallet, which only one process may hold at a time: stop
'capvend serve' first (they fail at once, rather than wait, while it runs).
Refunds owed to clients are paid from this wallet too ('capvend refunds').`,
		Subs: []*command{cashuBalanceCommand(), cashuMeltCommand(), cashuSeedCommand(), cashuRestoreCommand()},
	}
}

func cashuBalanceCommand() *command {
	var cf cashuFlags
	return &command{
		Name:    "balance",
		Summary: "show the wallet's ecash per mint next to the ledger's assets:cashu:<mint>",
		Help: `Reads the wallet file offline (no mint is contacted) and the ledger, and
prints one line per mint: the ecash the wallet holds (unspent proofs), the
proofs it handed out that are not known spent yet (change returned to
clients, melts in flight), the balance of the ledger's assets:cashu:<mint>
account, and the difference wallet - ledger.

A zero difference means the wallet and the books agree. A positive one is
ecash the ledger does not know of (e.g. a token swapped just before a crash);
a negative one is booked ecash the wallet does not hold. Payouts in flight
(reserved, not booked yet: their money may have left) are listed after.
Exits 1 if any mint does not reconcile.

Amounts are sats with millisatoshi precision.`,
		Flags: cf.register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("balance takes no arguments")
			}
			l, dir, mints, err := cf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			bals, err := cashu.Balances(ctx, dir, mints, l)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(e.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "mint\twallet\tpending\tledger\tdifference\t")
			off := 0
			for _, b := range bals {
				name := b.Mint
				if name == "" {
					name = b.Account
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, b.Wallet, b.Pending, b.Ledger, b.Difference())
				if b.Difference() != 0 {
					off++
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			inFlight, err := l.Payouts(ctx, false)
			if err != nil {
				return err
			}
			if err := writePayouts(e.Stdout, inFlight); err != nil {
				return err
			}
			if off > 0 {
				return &exitError{code: 1, err: fmt.Errorf("%d mint(s) do not reconcile with the ledger", off)}
			}
			return nil
		},
	}
}

func cashuMeltCommand() *command {
	var cf cashuFlags
	var invoice, mint string
	return &command{
		Name:    "melt",
		Summary: "pay a Lightning invoice from the wallet's ecash (NUT-05) and book the withdrawal",
		Help: `Asks the mint for a melt quote for the invoice, reserves the withdrawal in the
ledger with that quote, pays it from the ecash held at that mint, and books
one journal entry:
  Cr assets:cashu:<mint>        amount + fee
  Dr expenses:fees:cashu:<mint> fee
  Dr equity:withdrawals         amount
The fee is what the melt actually cost (Lightning fee and input fees; change
for an unused fee reserve returns to the wallet). The invoice must carry an
amount in whole sats. The wallet must hold amount + the mint's fee reserve.

If the mint did not pay, the reservation is released. If it reports the
payment pending, the withdrawal stays reserved and the command says so (the
proofs stay pending in the wallet); the next payout command or 'capvend
serve' on this wallet asks the mint again and books it once paid (or
releases it). A withdrawal left reserved by a crash is resolved the same way.

Example:
  capvend cashu melt --invoice lnbc500n1...`,
		Flags: func(fs *flag.FlagSet) {
			cf.register(fs)
			fs.StringVar(&invoice, "invoice", "", "the bolt11 `INVOICE` to pay (required)")
			fs.StringVar(&mint, "mint", "", "melt the ecash of mint `URL` (default the first of cashu.mints)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("melt takes no arguments; pass the invoice with --invoice")
			}
			if strings.TrimSpace(invoice) == "" {
				return usageError("--invoice is required")
			}
			l, dir, mints, err := cf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			if mint == "" {
				if len(mints) == 0 {
					return usageError("no mint: set cashu.mints or pass --mint")
				}
				mint = mints[0]
			}
			res, err := cashu.Melt(ctx, dir, mint, invoice, l)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "paid %s (fee %s) from %s\nmelt quote %s\npreimage   %s\n",
				res.Amount, res.Fee, res.Mint, res.Quote, res.Preimage)
			return nil
		},
	}
}

func cashuSeedCommand() *command {
	var cf cashuFlags
	var to string
	var again bool
	return &command{
		Name:    "seed",
		Summary: "write the wallet's seed (its BIP-39 mnemonic) to a new file, once",
		Help: `The wallet derives all its ecash from a 12-word mnemonic (NUT-13): with it
and the trusted mints, 'capvend cashu restore' rebuilds a lost wallet. This
writes the mnemonic to FILE (a new file, mode 0600: it is never printed or
logged) and records in the wallet directory that it was exported, so that
'capvend doctor' stops warning. Keep FILE offline: whoever holds it can
take the wallet's ecash. A second export is refused unless --again.

Example:
  capvend cashu seed --to /media/usb/capvend-seed.txt`,
		Flags: func(fs *flag.FlagSet) {
			cf.register(fs)
			fs.StringVar(&to, "to", "", "write the mnemonic to the new `FILE` (required)")
			fs.BoolVar(&again, "again", false, "export a seed exported before")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 || strings.TrimSpace(to) == "" {
				return usageError("seed takes no arguments and needs --to FILE")
			}
			l, dir, _, err := cf.open(ctx, e)
			if err != nil {
				return err
			}
			l.Close()
			if err := cashu.ExportSeed(dir, to, again); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "the seed of the wallet in %s is in %s (mode 0600): keep it offline\n", dir, to)
			return nil
		},
	}
}

func cashuRestoreCommand() *command {
	var cf cashuFlags
	var from string
	return &command{
		Name:    "restore",
		Summary: "rebuild a lost wallet from its seed at the trusted mints (NUT-09)",
		Help: `Rebuilds the wallet in cashu.wallet_dir (which must hold no wallet: move a
damaged one away first) from the mnemonic in FILE ('capvend cashu seed'),
asking each of cashu.mints for the ecash derived from it (NUT-09) and which
of it is unspent (NUT-07). Tokens the wallet handed to clients that they
have not redeemed yet (change, refund and payout tokens, from the ledger's
records) are its clients' money: they are set aside as pending, never
spent. Nothing is booked: the ledger already says what the wallet holds;
'capvend cashu balance' then compares the two.`,
		Flags: func(fs *flag.FlagSet) {
			cf.register(fs)
			fs.StringVar(&from, "mnemonic-file", "", "read the mnemonic from `FILE` (required)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 || strings.TrimSpace(from) == "" {
				return usageError("restore takes no arguments and needs --mnemonic-file FILE")
			}
			if err := checkSecretFile("--mnemonic-file", from); err != nil {
				return err
			}
			b, err := os.ReadFile(from)
			if err != nil {
				return err
			}
			l, dir, mints, err := cf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			if len(mints) == 0 {
				return usageError("no mint to restore from: set cashu.mints")
			}
			r, err := cashu.Restore(ctx, dir, string(b), mints, l)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "restored %s of ecash; %s handed out to clients and not redeemed yet set aside\n", r.Own, r.Clients)
			bals, err := cashu.Balances(ctx, dir, mints, l)
			if err != nil {
				return err
			}
			for _, m := range bals {
				fmt.Fprintf(e.Stdout, "%s: wallet %s, ledger %s, difference %s\n", m.Account, m.Wallet, m.Ledger, m.Difference())
			}
			return nil
		},
	}
}
