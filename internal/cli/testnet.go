package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/capvend/capvend/testnet"
)

// testnetDirHelp documents the --dir default shared by the subcommands.
const testnetDirHelp = `The stack lives in --dir (default $CAPVEND_TESTNET_DIR, else
<user cache dir>/capvend/testnet, e.g. ~/.cache/capvend/testnet), which holds
testnet.json (endpoints, TLS cert and macaroon paths, pubkeys, pids), the
nodes' data and logs/.`

func defaultTestnetDir(e *env) string {
	if d := e.Getenv("CAPVEND_TESTNET_DIR"); d != "" {
		return d
	}
	if c, err := os.UserCacheDir(); err == nil {
		return filepath.Join(c, "capvend", "testnet")
	}
	return ".capvend-testnet"
}

// testnetDir is the --dir flag the stack's subcommands share.
type testnetDir struct{ dir string }

func (t *testnetDir) flag(fs *flag.FlagSet) {
	fs.StringVar(&t.dir, "dir", "", "stack directory (default $CAPVEND_TESTNET_DIR or <user cache dir>/capvend/testnet)")
}

// path is the stack's directory: --dir, or the default.
func (t *testnetDir) path(e *env) string {
	if t.dir != "" {
		return t.dir
	}
	return defaultTestnetDir(e)
}

// load attaches to the running stack in path(e), saying how to start one
// when none runs.
func (t *testnetDir) load(e *env) (*testnet.Stack, error) {
	d := t.path(e)
	s, err := testnet.Load(d, e.Stderr)
	if err != nil {
		if errors.Is(err, testnet.ErrNotRunning) {
			return nil, fmt.Errorf("%w (start one with 'capvend testnet up --dir %s')", err, d)
		}
		return nil, err
	}
	return s, nil
}

func testnetCommand() *command {
	td := &testnetDir{}
	return &command{
		Name:    "testnet",
		Summary: "run a local regtest network (btcd, LND, Cashu mint, Nostr relay) for trying and testing capvend",
		Help:    testnetDirHelp,
		Subs: []*command{
			testnetUpCommand(td),
			testnetDownCommand(td),
			testnetStatusCommand(td),
			testnetMineCommand(td),
			testnetPayCommand(td),
			testnetInvoiceCommand(td),
			testnetCashuMintCommand(td),
			testnetBuildCommand(),
			testnetMintCommand(),
			testnetRelayCommand(),
			testnetKeepCommand(),
		},
	}
}

func testnetUpCommand(td *testnetDir) *command {
	var binDir string
	var postgres, nwc bool
	var relayMax int
	return &command{
		Name:    "up",
		Summary: "start the regtest stack (btcd, 3 LND nodes, Cashu mint, Nostr relay) and leave it running",
		Help: `Brings up on 127.0.0.1 only: btcd (regtest, 500+ blocks mined), three LND
` + testnet.LNDVersion + ` nodes (vendor, customer, mint) with funded wallets and
active channels customer->vendor and customer->mint (each pushing sats to
the far side, so vendor->customer refunds and mint melts route), a Cashu
mint (gonuts) backed by the mint node, and an in-memory Nostr relay
(khatru). Returns once everything answers; the processes keep running
detached until 'capvend testnet down'.

btcd and lnd are built once from their pinned module versions with the go
command into <user cache dir>/capvend/bin/<name>-<version>/ (a cold lnd
build takes minutes) and reused afterwards. Ports are chosen free at start,
so stacks in different --dir run side by side.

Running 'up' on a running stack does nothing; a dead or partly dead stack
in --dir is stopped and replaced. On failure the error names the component
and its log file, and everything started is stopped.

With --relay-max-message-length N the relay reads no websocket message over
N bytes (it closes the connection of a client that sends one, as public
relays do) and advertises N in its NIP-11 document
(limitation.max_message_length): e.g. 65536 to try CEP-22 oversized
transfers as on a public relay. A running stack started with another limit
is replaced.

With --postgres it also starts a PostgreSQL server (initdb and postgres from
Debian's postgresql package, no system service) on a loopback port, its
cluster in <dir>/postgres, with an empty database "capvend" whose DSN is in
testnet.json (postgres.dsn) for ledger.dsn_file.

With --nwc it also runs an NWC wallet service (Alby's NWCWalletService, with
hold invoices added: testnet/nwc, installed with '` + "cd testnet/nwc && npm ci" + `') in
front of the vendor node, on the stack's relay; its connection URIs (hold,
plain, nip04, receive) are in testnet.json (nwc.uris), for nwc.uri_file.

` + testnetDirHelp,
		Flags: func(fs *flag.FlagSet) {
			td.flag(fs)
			fs.StringVar(&binDir, "bin-dir", "", "binary cache (default <user cache dir>/capvend/bin)")
			fs.BoolVar(&postgres, "postgres", false, "also start a PostgreSQL server (Debian's postgresql package) for a PostgreSQL ledger; its DSN goes into testnet.json")
			fs.IntVar(&relayMax, "relay-max-message-length", 0, "largest websocket message the relay reads, in `BYTES`, advertised in NIP-11 (0: khatru's 512000, not advertised)")
			fs.BoolVar(&nwc, "nwc", false, "also run an NWC wallet service (testnet/nwc: node, and "+testnet.NWCInstall+") in front of the vendor node; its connection URIs go into testnet.json")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 {
				return usageError("up takes no arguments")
			}
			if relayMax < 0 {
				return usageError("up: --relay-max-message-length must not be negative")
			}
			s, err := testnet.Start(ctx, testnet.Options{Dir: td.path(e), BinDir: binDir, Progress: e.Stdout, Detach: true, Postgres: postgres,
				RelayMaxMessage: relayMax, NWC: nwc})
			if err != nil {
				return err
			}
			defer s.Release() // leave the processes running
			printStack(e, s)
			return nil
		},
	}
}

func testnetBuildCommand() *command {
	var binDir string
	return &command{
		Name:    "build",
		Summary: "build (or reuse) the pinned btcd and lnd binaries without starting anything",
		Help: `Builds btcd/btcctl ` + testnet.BtcdVersion + ` and lnd/lncli ` + testnet.LNDVersion + ` from their module
versions with the go command into <user cache dir>/capvend/bin/<name>-<version>/
(or --bin-dir), unless they are already there, and prints their paths. A
cold lnd build takes minutes; 'up' does the same on first use. CI runs this
step first so test output is not mixed with the build.`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&binDir, "bin-dir", "", "binary cache (default <user cache dir>/capvend/bin)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 {
				return usageError("build takes no arguments")
			}
			d := binDir
			if d == "" {
				var err error
				if d, err = testnet.DefaultBinDir(); err != nil {
					return err
				}
			}
			start := time.Now()
			logf := func(format string, a ...any) {
				fmt.Fprintf(e.Stdout, "[%5.1fs] testnet: %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
			}
			b, err := testnet.EnsureBinaries(ctx, d, logf)
			if err != nil {
				return err
			}
			for _, p := range []string{b.Btcd, b.Btcctl, b.LND, b.LNCLI} {
				fmt.Fprintln(e.Stdout, p)
			}
			return nil
		},
	}
}

func testnetDownCommand(td *testnetDir) *command {
	return &command{
		Name:    "down",
		Summary: "stop the stack's processes (by recorded pid) and wait for them to exit",
		Help: `Sends SIGTERM to each process recorded in testnet.json (only those: the
pid and its start time must match), SIGKILL after 30 s, and waits until
each is gone; then removes testnet.json. Data and logs stay in --dir until
the next 'up'. Does nothing if no stack runs.

` + testnetDirHelp,
		Flags: td.flag,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 {
				return usageError("down takes no arguments")
			}
			d := td.path(e)
			if err := testnet.Stop(ctx, d, e.Stdout); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "testnet in %s is down\n", d)
			return nil
		},
	}
}

func testnetStatusCommand(td *testnetDir) *command {
	var asJSON bool
	return &command{
		Name:    "status",
		Summary: "show the stack's endpoints, processes (pid, RSS) and block height",
		Help: `Prints the endpoints and credentials paths of the running stack, each
process with its pid, state and resident memory, and the chain height.
With --json prints testnet.json instead. Exits 1 if no stack runs.

` + testnetDirHelp,
		Flags: func(fs *flag.FlagSet) {
			td.flag(fs)
			fs.BoolVar(&asJSON, "json", false, "print testnet.json")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 {
				return usageError("status takes no arguments")
			}
			s, err := td.load(e)
			if err != nil {
				return err
			}
			defer s.Release()
			if asJSON {
				b, _ := json.MarshalIndent(s.Info, "", "  ")
				fmt.Fprintln(e.Stdout, string(b))
				return nil
			}
			printStack(e, s)
			if !s.Info.Ready {
				fmt.Fprintln(e.Stdout, "\nbring-up did not finish: 'capvend testnet up' replaces this stack")
			}
			tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "\nPROCESS\tPID\tSTATE\tRSS\tLOG")
			for _, p := range s.Processes() {
				state := "running"
				if !p.Alive {
					state = "DEAD"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f MiB\t%s\n", p.Name, p.PID, state, float64(p.RSSKB)/1024, p.Log)
			}
			_ = tw.Flush()
			if h, err := s.BlockHeight(ctx); err == nil {
				fmt.Fprintf(e.Stdout, "\nblock height: %d\n", h)
			}
			if !s.Running() {
				return errors.New("testnet: stack is partly dead; run 'capvend testnet up' to replace it")
			}
			return nil
		},
	}
}

func testnetMineCommand(td *testnetDir) *command {
	return &command{
		Name:    "mine",
		Args:    "N",
		Summary: "mine N blocks and wait until the LND nodes have them",
		Help:    testnetDirHelp,
		Flags:   td.flag,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 1 {
				return usageError("mine takes one argument: the number of blocks")
			}
			n, err := strconv.Atoi(args[0])
			if err != nil || n <= 0 || n > 10000 {
				return usageError("mine: N must be an integer in 1..10000, got %q", args[0])
			}
			s, err := td.load(e)
			if err != nil {
				return err
			}
			defer s.Release()
			if err := s.Mine(ctx, n); err != nil {
				return err
			}
			h, _ := s.BlockHeight(ctx)
			fmt.Fprintf(e.Stdout, "mined %d blocks; height %d\n", n, h)
			return nil
		},
	}
}

func testnetPayCommand(td *testnetDir) *command {
	return &command{
		Name:    "pay",
		Args:    "BOLT11",
		Summary: "pay a bolt11 invoice from the customer node",
		Help: `Pays BOLT11 from the customer node (routerrpc SendPaymentV2, fee limit
1000 sat) and prints the status, payment hash, preimage and fee.

` + testnetDirHelp,
		Flags: td.flag,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 1 {
				return usageError("pay takes one argument: a bolt11 invoice")
			}
			s, err := td.load(e)
			if err != nil {
				return err
			}
			defer s.Release()
			r, err := s.Pay(ctx, args[0])
			if r != nil {
				fmt.Fprintf(e.Stdout, "status: %s\npayment_hash: %s\n", r.Status, r.PaymentHash)
				if r.Preimage != "" {
					fmt.Fprintf(e.Stdout, "preimage: %s\nfee_msat: %d\n", r.Preimage, r.FeeMsat)
				}
			}
			return err
		},
	}
}

func testnetInvoiceCommand(td *testnetDir) *command {
	var memo string
	return &command{
		Name:    "invoice",
		Args:    "SATS",
		Summary: "create an invoice on the vendor node and print its bolt11",
		Help:    testnetDirHelp,
		Flags: func(fs *flag.FlagSet) {
			td.flag(fs)
			fs.StringVar(&memo, "memo", "capvend testnet", "invoice description")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 1 {
				return usageError("invoice takes one argument: the amount in sats")
			}
			sats, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || sats <= 0 {
				return usageError("invoice: SATS must be a positive integer, got %q", args[0])
			}
			s, err := td.load(e)
			if err != nil {
				return err
			}
			defer s.Release()
			r, err := s.Invoice(ctx, sats, memo)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.Stdout, r.PaymentRequest)
			return nil
		},
	}
}

func testnetCashuMintCommand(td *testnetDir) *command {
	return &command{
		Name:    "cashu-mint",
		Args:    "SATS",
		Summary: "buy SATS of ecash at the stack's mint (paid by the customer node); print a cashuB token",
		Help: `Requests a mint quote for SATS at the stack's Cashu mint, pays its invoice
from the customer node, mints the ecash and prints it as a cashuB token.
The printed token is the only copy of that ecash.

` + testnetDirHelp,
		Flags: td.flag,
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 1 {
				return usageError("cashu-mint takes one argument: the amount in sats")
			}
			sats, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || sats == 0 {
				return usageError("cashu-mint: SATS must be a positive integer, got %q", args[0])
			}
			s, err := td.load(e)
			if err != nil {
				return err
			}
			defer s.Release()
			tok, err := s.CashuMint(ctx, sats)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.Stdout, tok)
			return nil
		},
	}
}

func testnetMintCommand() *command {
	var mc testnet.MintConfig
	return &command{
		Name:    "mint",
		Summary: "run a Cashu mint backed by LND in the foreground (used by 'up')",
		Help: `Runs a gonuts Cashu mint whose Lightning backend is the LND node given by
--lnd-host/--lnd-cert/--lnd-macaroon (the macaroon must read the wallet
balance: use admin.macaroon), serving HTTP on --listen, a loopback address.
Runs until SIGINT/SIGTERM. 'capvend testnet up' starts one of these; you
rarely run it by hand.`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&mc.Listen, "listen", "127.0.0.1:3338", "loopback address to serve on")
			fs.StringVar(&mc.LNDHost, "lnd-host", "", "LND gRPC host:port")
			fs.StringVar(&mc.LNDCert, "lnd-cert", "", "LND tls.cert path")
			fs.StringVar(&mc.LNDMacaroon, "lnd-macaroon", "", "LND admin.macaroon path")
			fs.StringVar(&mc.DBDir, "db", "", "mint database directory")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 {
				return usageError("mint takes no arguments")
			}
			if mc.LNDHost == "" || mc.LNDCert == "" || mc.LNDMacaroon == "" || mc.DBDir == "" {
				return usageError("mint: --lnd-host, --lnd-cert, --lnd-macaroon and --db are required")
			}
			mc.Log = e.Log
			return testnet.RunMint(ctx, mc)
		},
	}
}

func testnetRelayCommand() *command {
	var relayListen string
	var maxMessage int
	return &command{
		Name:    "relay",
		Summary: "run an in-memory Nostr relay in the foreground (used by 'up')",
		Help: `Runs a khatru Nostr relay with an in-memory event store on --listen, a
loopback address, until SIGINT/SIGTERM. With --max-message-length N it reads
no websocket message over N bytes (the sender's connection is closed, as on
public relays) and advertises N in NIP-11 (limitation.max_message_length).
'capvend testnet up' starts one of these; you rarely run it by hand.`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&relayListen, "listen", "127.0.0.1:7777", "loopback address to serve on")
			fs.IntVar(&maxMessage, "max-message-length", 0, "largest websocket message read, in `BYTES`, advertised in NIP-11 (0: khatru's 512000, not advertised)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 {
				return usageError("relay takes no arguments")
			}
			if maxMessage < 0 {
				return usageError("relay: --max-message-length must not be negative")
			}
			return testnet.RunRelay(ctx, relayListen, maxMessage, e.Log)
		},
	}
}

func testnetKeepCommand() *command {
	var keepDir string
	return &command{
		Name:    "keep",
		Summary: "stop a shared test stack once its tests are done (started by the tests)",
		Help: `Watches the regtest stack that test binaries share (testnet.Shared) in
--dir and stops it, removing --dir, once no test binary holds it and the
go commands they ran under have exited. The first test binary to use the
stack starts one of these; you never run it by hand.`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&keepDir, "dir", "", "the shared stack's directory (required)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) != 0 || keepDir == "" {
				return usageError("keep: --dir is required and there are no arguments")
			}
			return testnet.Keep(ctx, keepDir, e.Stderr)
		},
	}
}

// printStack prints the endpoints of s.
func printStack(e *env, s *testnet.Stack) {
	w := e.Stdout
	i := s.Info
	fmt.Fprintf(w, "stack dir:  %s (%s)\n", i.Dir, filepath.Join(i.Dir, testnet.InfoFile))
	fmt.Fprintf(w, "btcd rpc:   %s (user %s, cert %s)\n", i.Btcd.RPCHost, i.Btcd.RPCUser, i.Btcd.RPCCert)
	for _, n := range i.Nodes {
		fmt.Fprintf(w, "lnd %-9s grpc %s  rest %s  p2p %s  pubkey %s\n", n.Name+":", n.RPCHost, n.RESTHost, n.P2PHost, n.Pubkey)
		fmt.Fprintf(w, "              tls %s\n              admin %s\n              invoice %s\n", n.TLSCert, n.AdminMacaroon, n.InvoiceMacaroon)
	}
	fmt.Fprintf(w, "cashu mint: %s\n", s.MintURL)
	if i.Relay.MaxMessage > 0 {
		fmt.Fprintf(w, "relay:      %s (max_message_length %d)\n", s.RelayURL, i.Relay.MaxMessage)
	} else {
		fmt.Fprintf(w, "relay:      %s\n", s.RelayURL)
	}
	if pg := i.Postgres; pg != nil {
		fmt.Fprintf(w, "postgres:   %s (ledger.dsn_file: a file holding it)\n", pg.DSN)
	}
}
