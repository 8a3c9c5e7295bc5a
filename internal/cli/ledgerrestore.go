package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/capvend/capvend/internal/replica"
	"github.com/capvend/capvend/ledger"
)

// errRestoreExists: the restore's target (or a file of an old ledger
// beside it) exists; nothing was written.
var errRestoreExists = errors.New("refusing to overwrite")

// litestream is the Litestream runner for the replica c names (url, if
// set, overrides ledger.replica). The credentials file is refused while
// others may read it, like every secret file of capvend.
func (c LedgerConfig) litestream(url string) (replica.Litestream, error) {
	if url == "" {
		url = c.Replica
	}
	if url == "" {
		return replica.Litestream{}, usageError("no replica: set ledger.replica in the configuration (file:///PATH or s3://BUCKET/PATH), or pass --replica URL")
	}
	if _, err := replica.ParseURL(url); err != nil {
		return replica.Litestream{}, fmt.Errorf("ledger.replica: %w", err)
	}
	ls := replica.Litestream{Bin: c.LitestreamBin, URL: url}
	if f := c.ReplicaCredentialsFile; f != "" {
		if err := checkSecretFile("ledger.replica_credentials_file", f); err != nil {
			return ls, err
		}
		env, err := replica.ReadCredentials(f)
		if err != nil {
			return ls, fmt.Errorf("ledger.replica_credentials_file: %w", err)
		}
		ls.Env = env
	}
	return ls, nil
}

func ledgerRestoreCommand() *command {
	var configFile, to, at, replicaURL string
	return &command{
		Name:    "restore",
		Summary: "bring the SQLite ledger back from its Litestream replica into a new file",
		Help: `Restores the ledger that Litestream replicated to ledger.replica (run beside
'capvend serve': see docs/OPERATING.md, Continuous backup) into --to FILE: the
newest state the replica holds, or with --at TIME the state as of that
time (the last change replicated at or before it). FILE must not exist,
nor the -wal and -shm files or the Litestream folder (.NAME-litestream) of
an old ledger beside it: a stale -wal would be replayed into the restored
file. Litestream writes the copy into a temporary folder beside FILE.

What happened after the restored point is not in the books: the calls
that were then unfinished are ended so that none runs (again). Quoted and
awaiting calls are canceled (a payment made for one is booked when LND or
the mint reports it, and owed back), paid calls refunded, running calls
failed (serve refunds them), and a paid call whose hold invoice is locked
in is left to serve: it cancels the invoice, or books the settlement LND
made meanwhile and owes it back. The copy is then verified ('ledger
verify's checks) and only then linked to FILE (mode 0600); on any failure
nothing is written.

Then, with FILE at ledger.path, start 'capvend serve' (its reconciliation
books what LND and the mints settled after that point, and its recovery
refunds) and Litestream again; 'capvend reconcile' lists what it found.
An invoice quoted after that point is in no payment of the restored
ledger; the preimage of every LND invoice capvend makes carries a mark
keyed by the ledger's identity, which the replica keeps, so reconciliation
recognizes such an invoice that LND settled and books its amount to
liabilities:unattributed (received for a call the books lost: return it
to its payer or book it as income); its call never runs.
Stored answers of calls answered after that point are lost: a client
repeating such a request gets an error, not a second run.

Why Litestream runs beside serve and is not linked into capvend: its
library opens the database with its own copy of SQLite (modernc.org/sqlite)
and requires the application to use that driver too, because POSIX locks
belong to the process: when one copy of SQLite closes the file, the other
copy's locks on it are gone (sqlite.org/howtocorrupt.html, 2.2.1).
capvend's ledger is mattn/go-sqlite3, so linking Litestream would put two
SQLite libraries on the books in one process. Run as its own process, it
holds its locks and checkpoints as designed, and capvend uses its command
line, which Litestream calls its stable interface (the library is not).

The litestream program (ledger.litestream, else litestream in PATH) runs
with only PATH, HOME and the variables of ledger.replica_credentials_file
in its environment: a file of AWS_ACCESS_KEY_ID=... and
AWS_SECRET_ACCESS_KEY=... lines for an s3:// replica, refused while group
or others may read it (chmod 600). Credentials never go on its command
line, in litestream.yml or in a message.

Examples:
  capvend ledger restore --to /var/lib/capvend/capvend.db
  capvend ledger restore --to /tmp/capvend-before.db --at 2026-11-21T15:04:05Z`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&configFile, "config", "", "configuration `FILE` naming the replica (default $CAPVEND_CONFIG, else ./capvend.yaml)")
			fs.StringVar(&to, "to", "", "write the restored ledger to `FILE`, which must not exist (required)")
			fs.StringVar(&at, "at", "", "restore the state as of `TIME` (RFC 3339, or a date: midnight UTC); default the newest")
			fs.StringVar(&replicaURL, "replica", "", "restore from this replica `URL` instead of ledger.replica")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("restore takes no arguments (got %q)", args[0])
			}
			if to == "" {
				return usageError("--to FILE is required")
			}
			when, err := parseTimeFlag("--at", at)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(configFile, e.Getenv)
			if err != nil {
				return err
			}
			ls, err := cfg.Ledger.litestream(replicaURL)
			if err != nil {
				return err
			}
			rep, err := restoreLedger(ctx, ls, to, when)
			if rep != nil && rep.verify != nil && !rep.verify.OK() {
				rep.verify.WriteTo(e.Stdout)
				return &exitError{code: 1, err: errors.New("the restored ledger failed verification: nothing was written")}
			}
			if err != nil {
				return err
			}
			point := "its newest state"
			if !when.IsZero() {
				point = "the state as of " + when.UTC().Format(time.RFC3339)
			}
			last := "no change"
			if !rep.last.IsZero() {
				last = "the last change " + rep.last.UTC().Format(time.RFC3339Nano)
			}
			s := rep.settled
			fmt.Fprintf(e.Stdout, "restored %s from %s (%s; %s in the books)\n", rep.path, ls.Redacted(), point, last)
			fmt.Fprintf(e.Stdout, "unfinished calls at that point, never run (again): %d canceled, %d refunded, %d failed (serve refunds them), %d with a locked-in hold invoice (serve cancels it, or books and owes back what LND settled)\n",
				len(s.Canceled), len(s.Refunded), len(s.Failed), len(s.Held))
			if _, err := rep.verify.WriteTo(e.Stdout); err != nil {
				return err
			}
			fmt.Fprintln(e.Stdout, "next: put it at ledger.path, start capvend serve (reconciliation books what LND and the mints settled since), then Litestream")
			return nil
		},
	}
}

// restoreReport is what restoreLedger did.
type restoreReport struct {
	path    string
	last    time.Time // the books' newest change in the restored ledger
	settled ledger.RestoreSummary
	verify  *ledger.Report
}

// restoreLedger restores the replica into to (as of at, if not zero):
// Litestream writes a temporary copy beside to, its unfinished calls are
// settled (ledger.SettleRestored), it is verified, and only then linked
// to to, which must not exist (nor an old ledger's -wal, -shm or
// Litestream folder beside it).
func restoreLedger(ctx context.Context, ls replica.Litestream, to string, at time.Time) (*restoreReport, error) {
	to, err := filepath.Abs(to)
	if err != nil {
		return nil, err
	}
	dir, base := filepath.Split(to)
	for _, p := range []string{to, to + "-wal", to + "-shm", filepath.Join(dir, "."+base+"-litestream")} {
		if _, err := os.Lstat(p); err == nil {
			what := "the ledger file"
			if p != to {
				what = "a file of an old ledger (remove it with the old ledger: it does not belong to the restored one)"
			}
			return nil, fmt.Errorf("restore %s: %w %s: %s exists", to, errRestoreExists, what, p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("restore %s: %w", to, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restore %s: %w", to, err)
	}
	tmpDir, err := os.MkdirTemp(dir, ".capvend-restore-")
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", to, err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, base)
	if err := ls.Restore(ctx, tmp, at); err != nil {
		return nil, fmt.Errorf("restore %s: %w", to, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, fmt.Errorf("restore %s: %w", to, err)
	}
	rep := &restoreReport{path: to}
	if err := settleRestored(ctx, tmp, rep, ls.Redacted()); err != nil {
		return nil, fmt.Errorf("restore %s: %w", to, err)
	}
	for _, s := range []string{"-wal", "-shm"} {
		if _, err := os.Stat(tmp + s); err == nil {
			return nil, fmt.Errorf("restore %s: the restored copy kept a %s file after it was closed", to, s)
		}
	}
	if rep.verify, err = ledger.VerifyFile(ctx, tmp); err != nil {
		return nil, fmt.Errorf("restore %s: verify: %w", to, err)
	}
	if !rep.verify.OK() {
		return rep, fmt.Errorf("restore %s: the restored ledger failed verification; nothing was written", to)
	}
	rep.verify.Path = to
	// A hard link is refused if to appeared meanwhile: the no-clobber
	// rename.
	if err := os.Link(tmp, to); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("restore %s: %w the file that appeared meanwhile", to, errRestoreExists)
		}
		return nil, fmt.Errorf("restore %s: %w", to, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return rep, d.Sync()
}

// settleRestored opens the restored copy at path (migrating it to this
// capvend's schema), settles the calls it has unfinished and reads the
// time of its newest change.
func settleRestored(ctx context.Context, path string, rep *restoreReport, from string) error {
	l, err := ledger.Open(ctx, path, ledger.Options{MustExist: true})
	if err != nil {
		return err
	}
	defer l.Close()
	if rep.last, err = l.LastChange(ctx); err != nil {
		return err
	}
	point := "its last change"
	if !rep.last.IsZero() {
		point = rep.last.UTC().Format(time.RFC3339Nano)
	}
	reason := fmt.Sprintf("the ledger was restored from %s as of %s on %s: what happened to this call after that is not in the books, so it is never run (again)",
		from, point, time.Now().UTC().Format(time.RFC3339))
	if rep.settled, err = l.SettleRestored(ctx, reason); err != nil {
		return err
	}
	return l.Close()
}

func ledgerLitestreamConfigCommand() *command {
	var configFile, out string
	return &command{
		Name:    "litestream-config",
		Summary: "print the Litestream configuration that replicates the ledger to ledger.replica",
		Help: `Writes the litestream.yml that replicates ledger.path to ledger.replica, for
Litestream ` + replica.Version + ` run beside 'capvend serve' (see docs/OPERATING.md,
Continuous backup): 'litestream replicate -config litestream.yml'. It holds no secret:
S3 credentials reach Litestream by its environment, from the file
ledger.replica_credentials_file names (a systemd unit's EnvironmentFile=).

Example:
  capvend ledger litestream-config --out /etc/capvend/litestream.yml`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&configFile, "config", "", "configuration `FILE` (default $CAPVEND_CONFIG, else ./capvend.yaml)")
			fs.StringVar(&out, "out", "", "write to `FILE` (atomically, mode 0600) instead of standard output")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("litestream-config takes no arguments (got %q)", args[0])
			}
			cfg, err := loadConfig(configFile, e.Getenv)
			if err != nil {
				return err
			}
			if cfg.Ledger.Driver == "postgres" {
				return usageError("ledger.driver is postgres: Litestream replicates an SQLite ledger")
			}
			if cfg.Ledger.Replica == "" {
				return usageError("no ledger.replica in %s: set it to file:///PATH or s3://BUCKET/PATH", cfg.path)
			}
			text := replica.Config(cfg.Ledger.Path, cfg.Ledger.Replica)
			if out == "" {
				_, err := fmt.Fprint(e.Stdout, text)
				return err
			}
			return writeFileAtomic(out, func(f *os.File) error {
				_, err := f.WriteString(text)
				return err
			})
		},
	}
}
