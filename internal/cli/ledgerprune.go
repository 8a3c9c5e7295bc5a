package cli

import (
	"context"
	"flag"
	"fmt"
	"time"
)

func ledgerPruneCommand() *command {
	var lf ledgerFlags
	var olderThan time.Duration
	return &command{
		Name:    "prune",
		Summary: "replace stored answers older than the retention period by their hash record",
		Help: `Replaces the bodies of stored answers (the results of calls, the replies to
Nostr requests) stored more than --older-than ago (default: the
configuration's ledger.results_retention, 30 days unless set) by their
record: the body's SHA-256, its size and its error flag. A replay of such
a request then gets an error saying its answer expired after the retention
period; nothing runs again. Money records (calls, payments, the journal,
refunds, credit) are never pruned. 'capvend serve' does the same every 10
minutes; this is for operators who want it now, or once with another age.

It works in bounded batches (256 answers or 4 MiB of bodies each, one
transaction each), pausing between them, so it is safe while serve runs.
The SQLite file keeps its size: its freed pages are reused by new records.`,
		Flags: func(fs *flag.FlagSet) {
			lf.register(fs)
			fs.DurationVar(&olderThan, "older-than", 0, "prune answers stored more than `DURATION` ago (e.g. 720h); default ledger.results_retention")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("prune takes no arguments (got %q)", args[0])
			}
			if olderThan < 0 {
				return usageError("--older-than %s: want a positive duration", olderThan)
			}
			age := olderThan
			if age == 0 {
				cfg, err := loadConfig(lf.config, e.Getenv)
				if err != nil {
					return err
				}
				if age = cfg.Ledger.ResultsRetention; age == 0 {
					fmt.Fprintln(e.Stdout, "ledger.results_retention is 0: stored answers are kept forever; nothing pruned (pass --older-than to prune anyway)")
					return nil
				}
			}
			l, err := lf.open(ctx, e)
			if err != nil {
				return err
			}
			defer l.Close()
			before := time.Now().Add(-age)
			st, err := l.Prune(ctx, before, 0)
			fmt.Fprintf(e.Stdout, "pruned %d stored results and %d stored replies from before %s (%d bytes of bodies): their SHA-256, size and error flag are kept\n",
				st.Results, st.Replies, before.UTC().Format(time.RFC3339), st.Bytes)
			return err
		},
	}
}
