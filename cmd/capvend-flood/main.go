// Command capvend-flood is a load generator for capvend's invoice-spam
// defences (issue #11, hole 4). Against a running `capvend serve` on the
// regtest stack (`capvend testnet up`) it floods with fresh Nostr keys and
// fresh MCP HTTP sessions asking priced calls and never paying, while an
// honest customer (a ContextVM client with one key, and an MCP HTTP client
// from 127.0.0.1) buys calls paid from the stack's customer node. It
// prints the honest customer's paid-call latency (p50, p99) without the
// flood and under it, capvend's peak resident memory (from
// /proc/<pid>/status), and the open invoices at the vendor's LND.
//
// The flood runs in a child process at -nice 19 by default: it stands in
// for attackers on other machines, whose CPU the shop does not share
// (-nice 0 shares it).
//
// It sends only to 127.0.0.0/8 (the relay and capvend of the stack), and
// every loop is bounded in count and time.
//
//	capvend-flood -write-config DIR -example-tools PATH   # a capvend.yaml for the stack
//	capvend serve --config DIR/capvend.yaml &
//	capvend-flood -config DIR/capvend.yaml -pid $!
//
// See docs/OPERATING.md, "Invoice flood", for a run and its figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/capvend/capvend/testnet"
)

func main() {
	var o options
	// Its own flag set: lnd's lnwire (imported through testnet) registers
	// pgregory.net/rapid's test flags on the global one.
	fs := flag.NewFlagSet("capvend-flood", flag.ExitOnError)
	fs.StringVar(&o.config, "config", "", "the `capvend.yaml` of the capvend serve under test (http.listen, nostr.relays, nostr.nsec_file are read)")
	fs.StringVar(&o.testnetDir, "testnet", "", "the regtest stack's `DIR` (default $CAPVEND_TESTNET_DIR, else <user cache dir>/capvend/testnet)")
	fs.IntVar(&o.pid, "pid", 0, "capvend's `PID`, to read its memory from /proc (0: not measured)")
	fs.StringVar(&o.tool, "tool", "sha256", "the priced `TOOL` the flood and the customer call")
	fs.IntVar(&o.keys, "keys", 1000, "fresh Nostr keys in the flood")
	fs.IntVar(&o.sessions, "sessions", 200, "fresh MCP HTTP sessions in the flood")
	fs.IntVar(&o.calls, "calls", 10, "priced calls per flooding key or session")
	fs.IntVar(&o.sources, "sources", 8, "source addresses of the HTTP flood: 127.0.0.2 .. 127.0.0.(1+N)")
	fs.IntVar(&o.honest, "honest", 20, "paid calls of each honest customer (Nostr, HTTP) per phase")
	fs.IntVar(&o.workers, "workers", 16, "concurrent senders per flood")
	fs.DurationVar(&callTimeout, "call-timeout", callTimeout, "an honest call not answered within this is not served")
	fs.DurationVar(&slowAfter, "slow", slowAfter, "say where each honest call slower than this spent its time (to the invoice, paying and running)")
	fs.DurationVar(&o.invoiceEvery, "invoice-every", 2*time.Second, "count the vendor LND's open invoices this often (each count lists them all: LND work of its own while the customer pays)")
	fs.DurationVar(&o.limit, "timeout", 20*time.Minute, "give up after this long")
	fs.BoolVar(&o.returning, "returning", false, "the honest Nostr customer under the flood is the one who paid without it (same key: a known payer); default a fresh key, indistinguishable from the flood")
	fs.BoolVar(&o.stock, "stock", false, "the HTTP flood's sessions are stock MCP hosts: they do not declare the capvend/payments capability, so each priced call is answered at once with a payment-required tool result (a plain invoice) instead of notifications on a held stream")
	fs.IntVar(&o.pow, "pow", 0, "NIP-13 `BITS`: with -write-config, nostr.pow_difficulty; else the work the honest Nostr customer mines into each request (the flood does none)")
	fs.IntVar(&o.nice, "nice", 19, "the flood runs in a child process at this `NICENESS` (0: as this one), standing in for attackers on other machines; the honest customers run at this process's")
	child := fs.Bool("flood-child", false, "run only the flood, reporting on stdout (how the flood's child process is started)")
	writeConfig := fs.String("write-config", "", "write a capvend.yaml (and nsec) for the stack into `DIR` and exit")
	exampleTools := fs.String("example-tools", "", "with -write-config: the example-tools `BINARY` capvend sells (go build ./cmd/example-tools)")
	fs.Parse(os.Args[1:])

	if *child {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		if err := runChild(ctx, &o); err != nil {
			fatal(err)
		}
		return
	}
	dir := o.testnetDir
	if dir == "" {
		dir = os.Getenv("CAPVEND_TESTNET_DIR")
	}
	if dir == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			fatal(err)
		}
		dir = filepath.Join(c, "capvend", "testnet")
	}
	st, err := testnet.Load(dir, os.Stderr)
	if err != nil {
		fatal(fmt.Errorf("the regtest stack in %s: %w (start it with 'capvend testnet up')", dir, err))
	}
	if *writeConfig != "" {
		if *exampleTools == "" {
			fatal(fmt.Errorf("-write-config needs -example-tools"))
		}
		path, err := writeStackConfig(*writeConfig, st, *exampleTools, o.pow)
		if err != nil {
			fatal(err)
		}
		fmt.Println(path)
		return
	}
	if o.config == "" {
		fatal(fmt.Errorf("-config is required (the capvend.yaml of the capvend serve under test)"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.limit)
	defer cancel()
	if err := run(ctx, st, &o); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "capvend-flood:", err)
	os.Exit(1)
}
