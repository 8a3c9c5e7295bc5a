// Command capvend-soak runs `capvend serve` on the regtest stack under a
// mixed load for a long while (30 minutes by default) and says whether it
// stays flat (issue #30). It starts a stack of its own (or uses one with
// -testnet), builds capvend and example-tools, and runs capvend serve as a
// separate process selling word_count free and sha256 at 21 sats over MCP
// HTTP and Nostr (ContextVM), paid by LND invoices, Cashu tokens and
// prepaid credit. The load, all at once, at fixed rates:
//
//   - free calls over MCP HTTP and over Nostr;
//   - calls paid by the stack's customer LND node (over HTTP and Nostr);
//   - calls paid with Cashu tokens (_meta capvend/cashu) from a customer
//     wallet the customer node funds at the stack's mint;
//   - prepaid credit: a top-up (the customer node pays), then calls drawn
//     on it until it is exhausted, then another top-up;
//   - a flood of unpaid quotes: fresh Nostr keys and fresh MCP HTTP
//     sessions (from 127.0.0.2-9) ask for sha256 and never pay; their
//     quotes must expire (payments.ttl) and leave nothing behind.
//
// Mid-run the stack's relay is stopped and started again (an outage), and
// capvend gets a SIGHUP (a reload that changes a price). Every -every it
// samples capvend's RSS and open files (/proc/PID), its goroutines and
// open quotes (/metrics), the p50 and p99 latency of the interval's free,
// paid and credit calls, and the ledger's size (file, WAL, pages in use).
// At the end it prints the table and a verdict per series (its slope over
// the second half and whether it held its bound), draws soak.png, checks
// that every unpaid quote expired, runs `capvend ledger verify`, and exits
// 0 only if every bound held.
//
//	go run ./cmd/capvend-soak                      # 30 minutes, sampled every minute
//	go run ./cmd/capvend-soak -duration 3m         # a quick run, sampled every 15 s
//
// It sends only to 127.0.0.0/8 and stops by itself. See the README,
// "Soak run", for the bounds and a run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	o := defaultOptions()
	// Its own flag set: lnd's lnwire (imported through testnet) registers
	// pgregory.net/rapid's test flags on the global one.
	fs := flag.NewFlagSet("capvend-soak", flag.ExitOnError)
	fs.DurationVar(&o.duration, "duration", o.duration, "how long the load runs")
	fs.DurationVar(&o.every, "every", 0, "sample this often (default 1m, 15s for runs under 10m)")
	fs.StringVar(&o.dir, "dir", "", "the run's `DIR`: capvend.yaml, the ledger, logs, soak.txt, soak.csv, soak.png (default a new temporary directory, kept)")
	fs.StringVar(&o.testnetDir, "testnet", "", "use the regtest stack running in `DIR` (capvend testnet up --dir DIR); default: start one in the run's directory and stop it at the end")
	fs.StringVar(&o.capvend, "capvend", "", "the capvend `BINARY` (default: go build ./cmd/capvend)")
	fs.StringVar(&o.exampleTools, "example-tools", "", "the example-tools `BINARY` (default: go build ./cmd/example-tools)")
	fs.Float64Var(&o.freeRate, "free-rate", o.freeRate, "free calls per second over MCP HTTP")
	fs.Float64Var(&o.nostrFreeRate, "nostr-free-rate", o.nostrFreeRate, "free calls per second over Nostr")
	fs.Float64Var(&o.paidRate, "paid-rate", o.paidRate, "LND-paid calls per second, over each of MCP HTTP and Nostr")
	fs.Float64Var(&o.cashuRate, "cashu-rate", o.cashuRate, "Cashu-paid calls per second")
	fs.Float64Var(&o.creditRate, "credit-rate", o.creditRate, "calls per second drawn on prepaid credit")
	fs.Float64Var(&o.unpaidRate, "unpaid-rate", o.unpaidRate, "unpaid quotes per second (two thirds over Nostr, one third over MCP HTTP), never paid")
	fs.DurationVar(&o.ttl, "ttl", o.ttl, "payments.ttl: how long an unpaid quote stays open")
	fs.DurationVar(&o.sessionIdle, "session-idle", o.sessionIdle, "http.session_idle: the flood's abandoned MCP sessions end after this")
	fs.Float64Var(&o.outageAt, "outage-at", o.outageAt, "stop the relay at this `FRACTION` of the run")
	fs.DurationVar(&o.outageFor, "outage-for", o.outageFor, "and start it again after this long")
	fs.Float64Var(&o.hupAt, "sighup-at", o.hupAt, "send capvend a SIGHUP (a price reload) at this `FRACTION` of the run")
	fs.Float64Var(&o.bounds.RSSMiB, "rss-bound", o.bounds.RSSMiB, "RSS may grow at most this many `MiB` over the second half (fitted slope)")
	fs.Float64Var(&o.bounds.Goroutines, "goroutine-bound", o.bounds.Goroutines, "goroutines stay within this of their second-half median")
	fs.Float64Var(&o.bounds.FDs, "fd-bound", o.bounds.FDs, "open files stay within this of their second-half median")
	fs.Float64Var(&o.bounds.P99Factor, "p99-factor", o.bounds.P99Factor, "the p99 of the last three intervals (their median) is at most this times the median interval's: one noisy interval on a shared machine does not fail the run")
	fs.Parse(os.Args[1:])
	if o.every == 0 {
		o.every = time.Minute
		if o.duration < 10*time.Minute {
			o.every = 15 * time.Second
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capvend-soak:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}
