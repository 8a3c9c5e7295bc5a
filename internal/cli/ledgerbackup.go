package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/capvend/capvend/ledger"
)

func ledgerBackupCommand() *command {
	var lf ledgerFlags
	var to string
	var force bool
	return &command{
		Name:    "backup",
		Summary: "write a consistent, verified copy of the SQLite ledger to a file",
		Help: `Copies the SQLite ledger to --to FILE while 'capvend serve' runs: SQLite's
online backup copies the pages of one snapshot (a read transaction, which
no writer waits for). The copy is written to a temporary file in FILE's
folder, made one self-contained file (no -wal beside it), synced, opened
read-only and verified: 'ledger verify's checks must pass and every table
of the books must hold the snapshot's number of rows. Only then is it
renamed to FILE (mode 0600): FILE is never half written. An existing FILE
is refused unless --force; a missing folder is created (mode 0700).

To restore, stop capvend and put the copy in place of ledger.path (remove
the old ledger's -wal and -shm files), then run 'capvend reconcile': it lists
what LND and the mints settled that the copy does not book. What happened
after the copy was taken is not in it.

A PostgreSQL ledger (ledger.driver postgres) is backed up with PostgreSQL's
own tools: pg_dump, or a base backup with WAL archiving (see
docs/OPERATING.md, Backups).

Example:
  capvend ledger backup --to backups/capvend-2026-11-21.db`,
		Flags: func(fs *flag.FlagSet) {
			lf.register(fs)
			fs.StringVar(&to, "to", "", "write the copy to `FILE` (required)")
			fs.BoolVar(&force, "force", false, "replace FILE if it exists")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("backup takes no arguments (got %q)", args[0])
			}
			if to == "" {
				return usageError("--to FILE is required")
			}
			if lf.db == "" {
				cfg, err := loadConfig(lf.config, e.Getenv)
				if err != nil {
					return err
				}
				if cfg.Ledger.Driver == "postgres" {
					return fmt.Errorf("%w: run pg_dump --format=custom --file=capvend.dump \"$(cat %s)\", or keep a base backup with WAL archiving (see docs/OPERATING.md, Backups)",
						ledger.ErrBackupPostgres, cfg.Ledger.DSNFile)
				}
			}
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
				return err
			}
			rep, err := l.Backup(ctx, to, force)
			if rep != nil && rep.Verify != nil && !rep.Verify.OK() {
				rep.Verify.WriteTo(e.Stdout)
				return &exitError{code: 1, err: errors.New("the copy failed verification: nothing was written")}
			}
			if err != nil {
				return err
			}
			r := rep.Rows
			fmt.Fprintf(e.Stdout, "backup %s: %d bytes, one snapshot of %d calls, %d payments, %d journal entries, %d postings, %d stored results\n",
				rep.Path, rep.Bytes, r["calls"], r["payments"], r["entries"], r["postings"], r["results"])
			_, err = rep.Verify.WriteTo(e.Stdout)
			return err
		},
	}
}
