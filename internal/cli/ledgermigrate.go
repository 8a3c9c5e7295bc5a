package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/capvend/capvend/ledger"
)

func ledgerMigrateCommand() *command {
	var config, from, to string
	return &command{
		Name:    "migrate",
		Summary: "copy a SQLite ledger into an empty PostgreSQL ledger, then verify both",
		Help: `Copies every record of the SQLite ledger --from names (sqlite:PATH) into the
PostgreSQL database of the configuration's ledger.dsn_file (--to postgres),
from one consistent snapshot and in one PostgreSQL transaction: all of it or
nothing. Records keep their ids; the credit key comes along, so credit
tokens stay good. The target must hold no records (a database capvend never
used, or one it only created its tables in); a non-empty one is refused.
Both ledgers are verified afterwards, as by 'capvend ledger verify'; exits 1
if either fails. Stop 'capvend serve' first: writes to the SQLite ledger
after the copy began are not in it.`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&config, "config", "", "configuration `FILE` whose ledger.dsn_file names the target (default $CAPVEND_CONFIG, else ./capvend.yaml)")
			fs.StringVar(&from, "from", "", "the source ledger: sqlite:`PATH`")
			fs.StringVar(&to, "to", "postgres", "the target: postgres (the configuration's ledger.dsn_file)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			path, ok := strings.CutPrefix(from, "sqlite:")
			switch {
			case len(args) > 0:
				return usageError("migrate takes no arguments")
			case !ok || path == "":
				return usageError("--from must be sqlite:PATH")
			case to != "postgres":
				return usageError("--to must be postgres")
			}
			cfg, err := loadConfig(config, e.Getenv)
			if err != nil {
				return err
			}
			if cfg.Ledger.DSNFile == "" {
				return usageError("the configuration has no ledger.dsn_file: it names the target's DSN")
			}
			pg := cfg.Ledger
			pg.Driver = "postgres"
			return migrateLedger(ctx, e, path, pg)
		},
	}
}

// migrateLedger copies the SQLite ledger at path into the PostgreSQL ledger
// of target and verifies both.
func migrateLedger(ctx context.Context, e *env, path string, target LedgerConfig) error {
	src, err := ledger.Open(ctx, path, ledger.Options{MustExist: true})
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := target.open(ctx, "", ledger.Options{})
	if err != nil {
		return err
	}
	defer dst.Close()
	counts, err := src.CopyTo(ctx, dst)
	if err != nil {
		return err
	}
	var rows int64
	for _, n := range counts {
		rows += n
	}
	fmt.Fprintf(e.Stdout, "copied %d rows of %s into %s: %d calls, %d payments, %d journal entries, %d postings\n",
		rows, src.Path(), dst.Path(), counts["calls"], counts["payments"], counts["entries"], counts["postings"])
	failed := false
	for _, l := range []*ledger.Ledger{src, dst} {
		r, err := l.Verify(ctx)
		if err != nil {
			return err
		}
		r.WriteTo(e.Stdout)
		failed = failed || !r.OK()
	}
	if failed {
		return &exitError{code: 1, err: fmt.Errorf("a ledger failed verification after the copy")}
	}
	return nil
}
