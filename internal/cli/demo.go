package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/exampletools"
	"github.com/capvend/capvend/vend"
)

func demoCommand() *command {
	var dir string
	var keep bool
	return &command{
		Name:    "demo",
		Summary: "run everything on a local regtest network: a priced tool, capvend, and a customer who pays",
		Help: `One command from nothing to paid tool calls, on this machine only (127.0.0.1):

  1. builds btcd and lnd from the Go module proxy into the cache on the first
     run (about 5 minutes; later runs reuse them), and starts the regtest
     stack: btcd, three LND nodes (vendor, customer, mint) with channels, a
     Cashu mint and a Nostr relay;
  2. starts the example MCP server shipped with capvend (word_count, free;
     sha256, priced; always_fails, priced, fails after payment);
  3. starts 'capvend serve' selling it over MCP HTTP and Nostr (ContextVM),
     paid through LND (hold invoices) and the Cashu mint;
  4. runs a customer who lists the tools with their prices, calls the free
     tool, pays the priced one over Lightning, through a Cashu mint quote and
     with a Cashu token, sends an invalid argument (refused before any
     charge), calls the failing tool (hold invoice canceled, money back),
     and does the same list and a paid call over Nostr;
  5. prints 'capvend ledger balance' and an hledger export, checks
     'capvend ledger verify', stops everything and exits 0.

Everything it starts is stopped at the end, also on failure or Ctrl-C.
Its files (stack data, logs, capvend.yaml, capvend.db) go to a temporary
folder that is removed at the end, unless --dir is given (then kept).`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&dir, "dir", "", "keep the demo's files in `DIR` (default: a temporary folder, removed)")
			fs.BoolVar(&keep, "keep", false, "keep the temporary folder (its path is printed)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("demo takes no arguments")
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("demo: find the capvend executable: %w", err)
			}
			if dir == "" {
				if dir, err = os.MkdirTemp("", "capvend-demo-"); err != nil {
					return fmt.Errorf("demo: %w", err)
				}
				if keep {
					defer fmt.Fprintf(e.Stdout, "files kept in %s\n", dir)
				} else {
					defer os.RemoveAll(dir)
				}
			}
			return runDemo(ctx, e, demoOptions{Dir: dir, Executable: exe})
		},
	}
}

// demoOptions configures runDemo.
type demoOptions struct {
	Dir        string // everything the demo writes
	Executable string // the capvend binary that runs the mint and relay
	BinDir     string // btcd/lnd cache; "": the default
}

// Prices of the demo's priced tools, in sats: sha256 of a short text
// (one started KB) costs 20 + 1.
const (
	demoSHA256Sats = 21
	demoFailSats   = 5
)

// demo is one run of the demo: the stack, capvend and the customer.
type demo struct {
	e     *env
	out   io.Writer
	stack *testnet.Stack
	mcp   *client.Client
	start time.Time

	bill chan bill // each payment_required the MCP client gets
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.out, format+"\n", a...) }

// bill is a payment_required's invoice and description.
type bill struct{ bolt11, description string }

// runDemo runs the demo in opts.Dir; see demoCommand.
func runDemo(ctx context.Context, e *env, opts demoOptions) (err error) {
	d := &demo{e: e, out: e.Stdout, start: time.Now(), bill: make(chan bill, 4)}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.say("capvend demo: everything runs on 127.0.0.1, in %s", opts.Dir)
	d.say("")
	d.say("[1/5] regtest stack (btcd, LND vendor/customer/mint, Cashu mint, Nostr relay)")
	d.say("      the first run builds btcd and lnd (about 5 minutes); progress below")
	st, err := testnet.Start(ctx, testnet.Options{Dir: filepath.Join(opts.Dir, "stack"), Executable: opts.Executable,
		BinDir: opts.BinDir, Progress: indent(e.Stderr, "      ")})
	if err != nil {
		return fmt.Errorf("demo: regtest stack: %w", err)
	}
	d.stack = st
	defer func() {
		d.say("")
		d.say("teardown: stopping the regtest stack")
		if cerr := st.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("demo: stopping the stack: %w", cerr)
		}
	}()
	d.say("      ready: mint %s, relay %s", st.MintURL, st.RelayURL)

	// The example MCP server, in-process over Streamable HTTP.
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	upMux := http.NewServeMux()
	upMux.Handle("/mcp", server.NewStreamableHTTPServer(exampletools.NewServer()))
	upSrv := &http.Server{Handler: upMux, ReadHeaderTimeout: 10 * time.Second}
	go upSrv.Serve(upLn)
	defer upSrv.Close()
	d.say("[2/5] example MCP server at http://%s/mcp", upLn.Addr())

	cfgPath, listen, err := writeDemoConfig(opts.Dir, st, "http://"+upLn.Addr().String()+"/mcp")
	if err != nil {
		return err
	}
	cfg, err := loadConfig(cfgPath, func(string) string { return "" })
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(opts.Dir, "capvend.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer logFile.Close()
	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	se := &env{Stdin: strings.NewReader(""), Stdout: logFile, Stderr: logFile, Getenv: func(string) string { return "" },
		Log: slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	served := make(chan error, 1)
	go func() { served <- serve(serveCtx, se, cfg, false) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopServe()
		select {
		case err := <-served:
			return err
		case <-time.After(90 * time.Second):
			return errors.New("capvend serve did not stop within 90 s")
		}
	}
	defer stop()
	if err := waitListening(ctx, listen, served); err != nil {
		return err
	}
	serverPK, err := demoServerPubkey(cfg)
	if err != nil {
		return err
	}
	d.say("[3/5] capvend serving MCP at http://%s/mcp and ContextVM on %s", listen, st.RelayURL)
	d.say("      (config %s, log %s)", cfgPath, filepath.Join(opts.Dir, "capvend.log"))
	d.say("")
	d.say("[4/5] a customer buys")
	if err := d.customerMCP(ctx, "http://"+listen+"/mcp"); err != nil {
		return err
	}
	if err := d.customerNostr(ctx, st.RelayURL, serverPK); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return fmt.Errorf("demo: capvend serve: %w", err)
	}

	d.say("")
	d.say("[5/5] the books")
	for _, args := range [][]string{
		{"ledger", "balance", "--config", cfgPath},
		{"ledger", "export", "--format", "hledger", "--config", cfgPath},
		{"ledger", "verify", "--config", cfgPath},
	} {
		d.say("")
		d.say("$ capvend %s", strings.Join(args[:len(args)-2], " "))
		var errBuf strings.Builder
		le := &env{Stdin: strings.NewReader(""), Stdout: indent(d.out, "  "), Stderr: &errBuf, Getenv: e.Getenv, Log: e.Log}
		if code := execute(ctx, rootCommand(), le, args); code != 0 {
			return fmt.Errorf("demo: capvend %s exited %d: %s", strings.Join(args[:2], " "), code, strings.TrimSpace(errBuf.String()))
		}
	}
	d.say("")
	d.say("demo finished in %s: every paid call ran once, the failed one was refunded, the ledger verifies", time.Since(d.start).Round(100*time.Millisecond))
	return nil
}

// writeDemoConfig writes the demo's capvend.yaml and Nostr key into dir,
// and returns the config path and the MCP listen address.
func writeDemoConfig(dir string, st *testnet.Stack, upstreamURL string) (path, listen string, err error) {
	vendor, ok := st.Node(testnet.Vendor)
	if !ok {
		return "", "", errors.New("demo: the stack has no vendor node")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", fmt.Errorf("demo: %w", err)
	}
	listen = ln.Addr().String()
	ln.Close()
	if err := os.WriteFile(filepath.Join(dir, "capvend.nsec"), []byte(nostr.GeneratePrivateKey()+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("demo: %w", err)
	}
	cfg := fmt.Sprintf(`# Written by 'capvend demo'.
ledger:
  path: capvend.db
server:
  name: "capvend demo"
  about: "example-tools, priced in sats"
http:
  listen: %s
nostr:
  relays: [%s]
  nsec_file: capvend.nsec
lnd:
  host: %s
  tls_cert_file: %s
  macaroon_file: %s
  hold_invoices: true
cashu:
  mints: [%s]
  wallet_dir: cashu-wallet
payments:
  ttl: 2m
upstreams:
  - name: example
    url: %s
    tools:
      # 20 sats a call plus 1 sat per started KB of text, at most 50.
      sha256: {price_sats: 20, per_kb: {arg: text, sats: 1}, max_sats: 50}
      always_fails: {price_sats: %d}
`, listen, st.RelayURL, vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon, st.MintURL, upstreamURL, demoFailSats)
	path = filepath.Join(dir, "capvend.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return "", "", fmt.Errorf("demo: %w", err)
	}
	return path, listen, nil
}

// waitListening waits until addr accepts connections or serve ended.
func waitListening(ctx context.Context, addr string, served chan error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-served:
			return fmt.Errorf("demo: capvend serve stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: capvend serve is not listening on %s after 2 minutes", addr)
		}
	}
}

// demoServerPubkey is the Nostr pubkey of the demo's capvend.
func demoServerPubkey(cfg *Config) (string, error) {
	sk, err := ctxvm.LoadSecretKey(cfg.Nostr.NsecFile)
	if err != nil {
		return "", fmt.Errorf("demo: %w", err)
	}
	return nostr.GetPublicKey(sk)
}

// balance is the customer node's spendable balance in msat.
func (d *demo) balance(ctx context.Context) (int64, error) {
	return d.stack.ChannelBalance(ctx, testnet.Customer)
}

// customerMCP is the MCP HTTP customer.
func (d *demo) customerMCP(ctx context.Context, url string) error {
	c, err := d.connectMCP(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close()
	d.mcp = c
	d.say("")
	d.say("  over MCP Streamable HTTP:")
	for _, step := range []func(context.Context) error{d.listMCP, d.buyMCP, d.invalidMCP, d.failedMCP} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// connectMCP connects to url as a capvend-aware MCP client: one that
// hands the payment notifications' invoices to d.bill.
func (d *demo) connectMCP(ctx context.Context, url string) (*client.Client, error) {
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method != vend.NotifyPaymentRequired {
			return
		}
		if pr, _ := n.Params.AdditionalFields["pay_req"].(string); pr != "" {
			desc, _ := n.Params.AdditionalFields["description"].(string)
			d.bill <- bill{pr, desc}
		}
	})
	if err := c.Start(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("demo: MCP client: %w", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "capvend-demo-customer", Version: "1"}
	// A capvend-aware client: it handles the payment notifications.
	init.Params.Capabilities.Experimental = map[string]any{mcpfront.CapabilityPayments: map[string]any{}}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		return nil, fmt.Errorf("demo: MCP initialize: %w", err)
	}
	return c, nil
}

// listMCP prints the tools and their prices.
func (d *demo) listMCP(ctx context.Context) error {
	c := d.mcp
	// serve answers before its upstream has connected (in the background):
	// ask until the example server's tools are listed, as a client would
	// after notifications/tools/list_changed (30 s, serve's own wait).
	var list *mcp.ListToolsResult
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := listed.Until(waitCtx, func(ctx context.Context) (names []string, err error) {
		list, names, err = listTools(ctx, c)
		return names, err
	}, listed.Any); err != nil {
		return fmt.Errorf("demo: tools/list: %w", err)
	}
	var names []string
	for _, t := range list.Tools {
		price := "free"
		if t.Meta != nil {
			if p, ok := t.Meta.AdditionalFields["capvend/price"].(map[string]any); ok {
				price = fmt.Sprintf("%v %v", p["amount"], p["unit"])
				if hi, ok := p["max_amount"]; ok {
					price = fmt.Sprintf("%v-%v %v", p["amount"], hi, p["unit"])
				}
			}
		}
		names = append(names, fmt.Sprintf("%s (%s)", t.Name, price))
	}
	d.say("  - tools/list: %s", strings.Join(names, ", "))

	return nil
}

// buyMCP makes a free call and pays for calls every way the demo offers:
// an LND hold invoice, a mint quote's invoice, a Cashu token (spent twice:
// refused the second time).
func (d *demo) buyMCP(ctx context.Context) error {
	text := "Lightning pays for tools"
	res, err := d.call(ctx, "word_count", map[string]any{"text": text}, nil)
	if err != nil {
		return err
	}
	d.say("  - word_count(%q), free: %s", text, res)

	if err := d.paidCall(ctx, "sha256 paid over Lightning (LND hold invoice)", "sha256", map[string]any{"text": "hello"}, nil, demoSHA256Sats); err != nil {
		return err
	}
	if err := d.paidCall(ctx, "sha256 paid through a Cashu mint quote", "sha256", map[string]any{"text": "hello again"},
		map[string]any{vend.MetaInvoiceFrom: string(vend.BackendCashu)}, demoSHA256Sats); err != nil {
		return err
	}

	// A Cashu token in _meta pays at once: the customer first buys
	// ecash from the mint (over Lightning), then spends it.
	tok, err := d.stack.CashuMint(ctx, demoSHA256Sats)
	if err != nil {
		return fmt.Errorf("demo: buying ecash: %w", err)
	}
	res, err = d.call(ctx, "sha256", map[string]any{"text": "paid in ecash"}, map[string]any{vend.MetaCashuToken: tok})
	if err != nil {
		return err
	}
	d.say("  - sha256 paid with a %d-sat Cashu token in _meta[%q]: %s", demoSHA256Sats, vend.MetaCashuToken, short(res))
	if _, err := d.call(ctx, "sha256", map[string]any{"text": "paid in ecash"}, map[string]any{vend.MetaCashuToken: tok}); err == nil {
		return errors.New("demo: a spent Cashu token was accepted twice")
	} else {
		d.say("    the same token again is refused: %v", err)
	}

	return nil
}

// invalidMCP shows that invalid arguments are refused before any charge.
func (d *demo) invalidMCP(ctx context.Context) error {
	before, err := d.balance(ctx)
	if err != nil {
		return err
	}
	_, invalid := d.call(ctx, "sha256", map[string]any{"text": 42}, nil)
	if invalid == nil {
		return errors.New("demo: an invalid argument was accepted")
	}
	after, err := d.balance(ctx)
	if err != nil {
		return err
	}
	if len(d.bill) > 0 || after != before {
		return fmt.Errorf("demo: an invalid call was charged (balance %d -> %d msat)", before, after)
	}
	d.say("  - sha256 with text=42 (not a string): refused before any charge: %s", strings.TrimPrefix(invalid.Error(), "invalid params: "))

	return nil
}

// failedMCP pays for a tool that fails and shows the money come back.
func (d *demo) failedMCP(ctx context.Context) error {
	// The failing tool: its hold invoice is canceled, the money goes back.
	before, err := d.balance(ctx)
	if err != nil {
		return err
	}
	payErr := make(chan error, 1)
	done := make(chan struct{})
	var callErr error
	var failRes string
	go func() {
		defer close(done)
		failRes, callErr = d.call(ctx, "always_fails", map[string]any{"text": "x"}, nil)
	}()
	select {
	case b := <-d.bill:
		go func() { _, err := d.stack.Pay(ctx, b.bolt11); payErr <- err }()
	case <-done:
		return fmt.Errorf("demo: always_fails answered without asking for payment: %q, %v", failRes, callErr)
	case <-time.After(time.Minute):
		return errors.New("demo: no payment_required for always_fails within a minute")
	}
	<-done
	if perr := <-payErr; perr == nil {
		return errors.New("demo: the failed call's hold invoice was settled")
	}
	after, err := d.balance(ctx)
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("demo: the failed call was not refunded: balance %d -> %d msat", before, after)
	}
	outcome := failRes
	if callErr != nil {
		outcome = callErr.Error()
	}
	d.say("  - always_fails (%d sats, hold invoice): the tool failed (%s); the invoice was canceled and the customer's balance is back to the msat", demoFailSats, short(outcome))
	return nil
}

// call calls a tool over MCP and returns its text, or an error for a
// JSON-RPC error or an isError result.
func (d *demo) call(ctx context.Context, tool string, args map[string]any, meta map[string]any) (string, error) {
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	if meta != nil {
		req.Params.Meta = &mcp.Meta{AdditionalFields: meta}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	res, err := d.mcp.CallTool(ctx, req)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(mcp.TextContent); ok {
			sb.WriteString(t.Text)
		}
	}
	if res.IsError {
		return sb.String(), fmt.Errorf("tool error: %s", sb.String())
	}
	return sb.String(), nil
}

// paidCall calls a priced tool, pays the invoice it is sent from the
// customer node, and checks the customer paid exactly sats.
func (d *demo) paidCall(ctx context.Context, what, tool string, args, meta map[string]any, sats int64) error {
	before, err := d.balance(ctx)
	if err != nil {
		return err
	}
	type answer struct {
		text string
		err  error
	}
	ans := make(chan answer, 1)
	go func() {
		t, err := d.call(ctx, tool, args, meta)
		ans <- answer{t, err}
	}()
	var a answer
	var desc string
	select {
	case b := <-d.bill:
		if _, err := d.stack.Pay(ctx, b.bolt11); err != nil {
			return fmt.Errorf("demo: %s: paying %s: %w", what, short(b.bolt11), err)
		}
		desc = b.description
		a = <-ans
	case a = <-ans:
		return fmt.Errorf("demo: %s: answered without a payment_required: %q, %v", what, a.text, a.err)
	case <-time.After(time.Minute):
		return fmt.Errorf("demo: %s: no payment_required within a minute", what)
	}
	if a.err != nil {
		return fmt.Errorf("demo: %s: %w", what, a.err)
	}
	after, err := d.balance(ctx)
	if err != nil {
		return err
	}
	if before-after != sats*1000 {
		return fmt.Errorf("demo: %s: the customer paid %d msat, want %d", what, before-after, sats*1000)
	}
	d.say("  - %s: payment_required %d sats (%s) -> paid from the customer node -> %s", what, sats, desc, short(a.text))
	return nil
}

// listTools lists the tools of an MCP server, and their names.
func listTools(ctx context.Context, c *client.Client) (*mcp.ListToolsResult, []string, error) {
	list, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, 0, len(list.Tools))
	for _, t := range list.Tools {
		names = append(names, t.Name)
	}
	return list, names, nil
}

// short shortens s for the transcript.
func short(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 72 {
		return s[:69] + "..."
	}
	return s
}

// indent prefixes every line written to w.
func indent(w io.Writer, prefix string) io.Writer { return &indenter{w: w, prefix: prefix, bol: true} }

type indenter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	bol    bool
}

func (in *indenter) Write(p []byte) (int, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	var b []byte
	for _, c := range p {
		if in.bol {
			b = append(b, in.prefix...)
		}
		b = append(b, c)
		in.bol = c == '\n'
	}
	if _, err := in.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// customerNostr is the ContextVM customer: tools/list with cap tags, a
// free call and a paid call over the relay.
func (d *demo) customerNostr(ctx context.Context, relayURL, serverPK string) error {
	d.say("")
	d.say("  over Nostr (ContextVM, kind 25910) via %s:", relayURL)
	dialCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := ctxvmclient.Dial(dialCtx, relayURL, serverPK, ctxvmclient.Options{Kinds: []int{ctxvmclient.KindMessage}})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer c.Close()
	// Every request offers Lightning; an answer takes 3 minutes at most.
	request := func(method string, params any, onNote func(ctxvmclient.Message) error) (json.RawMessage, nostr.Tags, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		res, tags, err := c.Call(ctx, method, params, ctxvmclient.Request{Tags: nostr.Tags{{"pmi", vend.PMILightning}}, OnNote: onNote})
		if err != nil {
			return nil, nil, fmt.Errorf("demo: %s over Nostr: %w", method, err)
		}
		return res, tags, nil
	}
	resp, tags, err := request("tools/list", map[string]any{}, nil)
	if err != nil {
		return err
	}
	var caps []string
	for _, t := range tags {
		if len(t) >= 4 && t[0] == "cap" {
			caps = append(caps, fmt.Sprintf("[%s]", strings.Join(t, " ")))
		}
	}
	var list struct {
		Tools []struct{ Name string } `json:"tools"`
	}
	if err := json.Unmarshal(resp, &list); err != nil {
		return fmt.Errorf("demo: nostr tools/list: %w", err)
	}
	d.say("  - tools/list: %d tools; price tags %s", len(list.Tools), strings.Join(caps, " "))
	resp, _, err = request("tools/call", map[string]any{"name": "word_count", "arguments": map[string]any{"text": "sats over nostr"}}, nil)
	if err != nil {
		return err
	}
	d.say("  - word_count, free: %s", short(resultText(resp)))
	before, err := d.balance(ctx)
	if err != nil {
		return err
	}
	paid := false
	var seen []string
	resp, _, err = request("tools/call", map[string]any{"name": "sha256", "arguments": map[string]any{"text": "hello nostr"}},
		func(m ctxvmclient.Message) error {
			seen = append(seen, strings.TrimPrefix(m.Method, "notifications/"))
			if m.Method != vend.NotifyPaymentRequired {
				return nil
			}
			var p struct {
				PayReq string `json:"pay_req"`
			}
			if err := json.Unmarshal(m.Params, &p); err != nil || p.PayReq == "" {
				return fmt.Errorf("bad payment_required %s", m.Params)
			}
			_, err := d.stack.Pay(ctx, p.PayReq)
			paid = err == nil
			return err
		})
	if err != nil {
		return err
	}
	after, err := d.balance(ctx)
	if err != nil {
		return err
	}
	if !paid || before-after != demoSHA256Sats*1000 {
		return fmt.Errorf("demo: nostr paid call: paid %v, customer paid %d msat", paid, before-after)
	}
	d.say("  - sha256, %d sats: %s -> result %s", demoSHA256Sats, strings.Join(seen, " -> "), short(resultText(resp)))
	return nil
}

// resultText is the text of a CallToolResult.
func resultText(res json.RawMessage) string {
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	_ = json.Unmarshal(res, &r)
	var sb strings.Builder
	for _, c := range r.Content {
		sb.WriteString(c.Text)
	}
	return sb.String()
}
