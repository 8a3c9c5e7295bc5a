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

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
)

func reconcileCommand() *command {
	var configFile string
	var repair bool
	var last int
	return &command{
		Name:    "reconcile",
		Summary: "compare the ledger with LND, the Cashu wallet and the mints once; exit 1 on a difference",
		Help: `Compares the books with what the payment backends hold, once:
  - every LND invoice capvend created since the last run (a stored add
    index): settled at LND but not booked, booked but not settled at LND,
    canceled at LND but open in the ledger, a hold invoice locked in at LND
    that no call will settle;
  - the Cashu wallet's ecash per mint (each proof checked at the mint, so
    ecash spent elsewhere shows) against the ledger's assets:cashu:<mint>;
    only while 'capvend serve' is stopped: a running capvend holds the
    wallet, and its own reconciliation compares it;
  - each open mint quote against the mint's state.
Prints one line per difference (kind, backend, payment hash or quote,
call, what the ledger and the backend say, what was done) and records the
run in the ledger. Exits 0 when the books agree, 1 on any difference.

With --repair it also repairs what is safe, each in one ledger transaction
journaled with reason 'reconcile': it books a late settlement (the paid
call then runs at the next start of capvend serve, or at once in a
running serve's own reconciliation), ends a payment LND canceled, and
cancels an orphan hold invoice at LND (the payer gets the money back).
'capvend serve' reconciles every reconcile.interval (default 5m) and
repairs by itself.

With --last N it runs nothing and lists the differences of the last N
recorded runs (serve's or this command's).

Examples:
  capvend reconcile --config capvend.yaml
  capvend reconcile --config capvend.yaml --repair
  capvend reconcile --config capvend.yaml --last 5`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&configFile, "config", "", "configuration `FILE` (default $CAPVEND_CONFIG, else ./capvend.yaml)")
			fs.BoolVar(&repair, "repair", false, "repair what is safe (book late settlements, cancel orphan hold invoices)")
			fs.IntVar(&last, "last", 0, "list the differences of the last `N` recorded runs instead of running")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("capvend reconcile takes no arguments")
			}
			cfg, err := loadConfig(configFile, e.Getenv)
			if err != nil {
				return err
			}
			l, err := cfg.Ledger.open(ctx, "", ledger.Options{MustExist: true})
			if err != nil {
				return err
			}
			defer l.Close()
			if last > 0 {
				runs, err := l.ReconcileRuns(ctx, last)
				if err != nil {
					return err
				}
				return writeRuns(e.Stdout, runs)
			}
			return reconcileOnce(ctx, e, cfg, l, repair)
		},
	}
}

// reconcileOnce wires a Reconciler on cfg's backends, runs it once and
// prints the differences; exit 1 if there is any.
func reconcileOnce(ctx context.Context, e *env, cfg *Config, l *ledger.Ledger, repair bool) error {
	rc := reconcile.Config{Store: l, Repair: repair, Log: e.Log}
	if cfg.LND.Host != "" {
		conn, err := lnd.Dial(cfg.LND.Host, cfg.LND.TLSCertFile, cfg.LND.MacaroonFile)
		if err != nil {
			return err
		}
		defer conn.Close()
		mark, err := l.InvoiceMark(ctx)
		if err != nil {
			return err
		}
		rc.LND, rc.Node = lnd.NewNode(lnrpc.NewLightningClient(conn), invoicesrpc.NewInvoicesClient(conn)), cfg.LND.Host
		rc.OwnsPreimage = lnd.Mark(mark).Owns
	}
	if len(cfg.Cashu.Mints) > 0 {
		wf, err := cashu.OpenWalletFile(cfg.Cashu.WalletDir, cfg.Cashu.Mints)
		if errors.Is(err, cashu.ErrWalletBusy) {
			fmt.Fprintln(e.Stderr, "capvend reconcile: the Cashu wallet is held by a running capvend: its ecash is compared by serve's own reconciliation; mint quotes are compared here")
			wf, err = cashu.QuotesOnly(cfg.Cashu.Mints)
		}
		if err != nil {
			return err
		}
		rc.Wallet = wf
	}
	for _, conn := range cfg.NWC.connections() {
		u, err := readNWCURI(conn.field, conn.uriFile)
		if err != nil {
			return err
		}
		c, err := nwc.NewClient(u, nwc.ClientConfig{Timeout: cfg.NWC.Timeout})
		if err != nil {
			return err
		}
		defer c.Close()
		rc.NWC = append(rc.NWC, nwc.NewReconciler(c, conn.name))
	}
	if rc.LND == nil && rc.Wallet == nil && len(rc.NWC) == 0 {
		return usageError("nothing to reconcile: configure lnd.host, nwc.uri_file or cashu.mints")
	}
	r, err := reconcile.New(rc)
	if err != nil {
		return err
	}
	s, err := r.Once(ctx)
	if s.Run != 0 {
		writeDifferences(e.Stdout, s.Differences)
	}
	if err != nil {
		return fmt.Errorf("reconcile run %d could not compare everything: %w", s.Run, err)
	}
	if n := len(s.Differences); n > 0 {
		return &exitError{code: 1, err: fmt.Errorf("reconcile run %d: %d difference(s), %d repaired", s.Run, n, s.Repaired)}
	}
	fmt.Fprintf(e.Stdout, "reconcile run %d: the books agree with the backends\n", s.Run)
	return nil
}

// writeDifferences prints one line per difference.
func writeDifferences(w io.Writer, ds []reconcile.Difference) {
	if len(ds) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tBACKEND\tREF\tCALL\tLEDGER\tREMOTE\tDETAIL\tREPAIR")
	for _, d := range ds {
		ref := d.Ref
		if ref == "" {
			ref = d.MintURL
		}
		call := "-"
		if d.CallID != 0 {
			call = fmt.Sprint(d.CallID)
		}
		repair := d.Repair
		if repair == "" {
			repair = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Kind, d.Backend, ref, call, d.Ledger, d.Remote,
			strings.ReplaceAll(d.Detail, "\t", " "), repair)
	}
	tw.Flush()
}

// writeRuns prints recorded runs, newest first, with their differences.
func writeRuns(w io.Writer, runs []ledger.ReconcileRun) error {
	if len(runs) == 0 {
		_, err := fmt.Fprintln(w, "no reconciliation has run yet")
		return err
	}
	for _, r := range runs {
		end := "unfinished"
		if !r.Finished.IsZero() {
			end = r.Finished.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "run %d  %s .. %s  %d difference(s), %d repaired", r.ID, r.Started.Format(time.RFC3339), end, len(r.Differences), r.Repaired)
		if r.Error != "" {
			fmt.Fprintf(w, "  error: %s", r.Error)
		}
		fmt.Fprintln(w)
		writeDifferences(w, r.Differences)
	}
	return nil
}
