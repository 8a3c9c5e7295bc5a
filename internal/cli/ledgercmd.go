package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capvend/capvend/ledger"
)

// ledgerFlags are the flags every ledger command takes to find the ledger.
type ledgerFlags struct {
	config string
	db     string
}

func (f *ledgerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "configuration `FILE` naming the ledger (default $CAPVEND_CONFIG, else ./capvend.yaml)")
	fs.StringVar(&f.db, "db", "", "SQLite ledger `PATH`, overriding the configuration's ledger")
}

// open opens the existing ledger the flags name; it never creates one.
func (f *ledgerFlags) open(ctx context.Context, e *env) (*ledger.Ledger, error) {
	if f.db != "" {
		return ledger.Open(ctx, f.db, ledger.Options{MustExist: true})
	}
	cfg, err := loadConfig(f.config, e.Getenv)
	if err != nil {
		return nil, err
	}
	return cfg.Ledger.open(ctx, "", ledger.Options{MustExist: true})
}

func ledgerCommand() *command {
	return &command{
		Name:    "ledger",
		Summary: "inspect the ledger: export it for accounting, verify it, show balances, back it up, restore it",
		Help: `The ledger is an SQLite file (ledger.path in the configuration), or a
PostgreSQL database (ledger.driver postgres, its DSN in ledger.dsn_file),
holding every priced call, payment request, settlement, Cashu proof received,
stored result, and a double-entry journal in millisatoshis. These commands
read it; they are safe to run while 'capvend serve' runs, and so are 'backup'
(a verified copy of an SQLite ledger) and 'prune' (stored answers past
ledger.results_retention replaced by their hash record). 'migrate' copies
an SQLite ledger into PostgreSQL. 'restore' brings an SQLite ledger back
from the replica Litestream keeps beside serve (ledger.replica), whose
configuration 'litestream-config' prints.`,
		Subs: []*command{ledgerExportCommand(), ledgerVerifyCommand(), ledgerBalanceCommand(), ledgerBackupCommand(),
			ledgerRestoreCommand(), ledgerLitestreamConfigCommand(),
			ledgerPruneCommand(), ledgerMigrateCommand()},
	}
}

func ledgerExportCommand() *command {
	var lf ledgerFlags
	var format, since, until, out string
	return &command{
		Name:    "export",
		Summary: "write the journal as csv, jsonl, beancount or hledger",
		Help: `Streams the journal's entries in entry order, from one consistent snapshot,
in constant memory. Amounts: csv and jsonl in millisatoshis (amount_msat);
beancount and hledger in sats with three decimals (commodity SAT).
The beancount file passes bean-check; the hledger file loads in hledger.

--since and --until take a date (2026-11-21, midnight UTC) or an RFC 3339
time; --since is inclusive, --until exclusive.

Examples:
  capvend ledger export --format hledger --out books.journal
  hledger -f books.journal balance
  capvend ledger export --format csv --since 2026-11-01 --until 2026-12-01`,
		Flags: func(fs *flag.FlagSet) {
			lf.register(fs)
			fs.StringVar(&format, "format", "csv", "output format: "+strings.Join(ledger.Formats, ", "))
			fs.StringVar(&since, "since", "", "only entries at or after `TIME`")
			fs.StringVar(&until, "until", "", "only entries before `TIME`")
			fs.StringVar(&out, "out", "", "write to `FILE` (atomically, mode 0600) instead of standard output")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("export takes no arguments (got %q)", args[0])
			}
			opts := ledger.ExportOptions{Format: format}
			var err error
			if opts.Since, err = parseTimeFlag("--since", since); err != nil {
				return err
			}
			if opts.Until, err = parseTimeFlag("--until", until); err != nil {
				return err
			}
			if !opts.Since.IsZero() && !opts.Until.IsZero() && !opts.Since.Before(opts.Until) {
				return usageError("--since %s is not before --until %s", since, until)
			}
			known := false
			for _, f := range ledger.Formats {
				known = known || f == format
			}
			if !known {
				return usageError("--format %q: want one of %s", format, strings.Join(ledger.Formats, ", "))
			}
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			if out == "" {
				return l.Export(ctx, e.Stdout, opts)
			}
			return writeFileAtomic(out, func(f *os.File) error { return l.Export(ctx, f, opts) })
		},
	}
}

// parseTimeFlag accepts a date (UTC midnight) or an RFC 3339 time.
func parseTimeFlag(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse("2006-01-02", v); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	return time.Time{}, usageError("%s %q: want a date like 2026-11-21 or a time like 2026-11-21T15:04:05Z", name, v)
}

// writeFileAtomic writes path through a temporary file in the same
// directory, renamed into place only when write succeeded.
func writeFileAtomic(path string, write func(*os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func ledgerVerifyCommand() *command {
	var lf ledgerFlags
	var full bool
	return &command{
		Name:    "verify",
		Summary: "check every invariant of the ledger; exit 1 if any fails",
		Help: `Checks, on one consistent snapshot:
  - on SQLite, its own integrity check (quick_check; with --full,
    integrity_check, which also checks every index against its table and
    reads the whole file: slower on a large ledger);
  - every journal entry balances (postings sum to zero) and is sealed;
  - each settled payment has exactly one income entry, others none;
  - no delivered priced call without a settled payment;
  - no call executed without a claimed payment, none executed twice;
  - every execution sent upstream exactly what its call sold and was paid
    for (kind, server, tool, argument hash), and each call's execution
    count equals its execution records;
  - paid, executing and delivered calls have a settled or locked-in
    payment (a canceled one covers only a failed call being refunded);
  - every call that ran keeps its stored result; an answer pruned after
    ledger.results_retention keeps a well-formed record (a SHA-256 of 64
    hex digits, a size, and the empty body's hash exactly when the size
    is 0), and no whole answer claims to be pruned;
  - no payment claimed twice, no Cashu proof received twice;
  - refunds of settled payments are booked exactly once;
  - refunds owed (capvend refunds) sum to the balance of
    liabilities:refunds; each refund entry has its refund record; each
    paid refund has exactly one payout entry;
  - the schema's triggers that enforce these are in place.
Prints a report; exits 0 when all hold, 1 when any fails.`,
		Flags: func(fs *flag.FlagSet) {
			lf.register(fs)
			fs.BoolVar(&full, "full", false, "run SQLite's full integrity_check instead of quick_check")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("verify takes no arguments")
			}
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			verify := l.Verify
			if full {
				verify = l.VerifyFull
			}
			r, err := verify(ctx)
			if err != nil {
				return err
			}
			r.WriteTo(e.Stdout)
			if !r.OK() {
				return &exitError{code: 1, err: fmt.Errorf("ledger %s failed verification", l.Path())}
			}
			return nil
		},
	}
}

func ledgerBalanceCommand() *command {
	var lf ledgerFlags
	return &command{
		Name:    "balance",
		Summary: "show revenue per tool and per day, account balances and pending amounts",
		Help: `Revenue is net of refunds, in sats with millisatoshi precision. Pending shows
payment requests not yet paid (and not expired), hold invoices locked in but
not yet settled, calls waiting for payment, and refunds owed to clients
(how many and their total: what 'capvend refunds' lists; ledger verify
checks it is the balance of liabilities:refunds).`,
		Flags: lf.register,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("balance takes no arguments")
			}
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			b, err := l.Balance(ctx)
			if err != nil {
				return err
			}
			_, err = b.WriteTo(e.Stdout)
			return err
		},
	}
}
