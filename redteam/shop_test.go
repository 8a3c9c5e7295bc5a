package redteam

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/freeport"
	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/testnet"
)

// price is one priced item of a shop's configuration.
type price struct {
	sats       int64
	freePerDay int
	// freeTotal is free_per_day_total: a global daily cap on the tool's
	// free calls, whoever makes them (issue 11: Nostr keys are free to
	// make).
	freeTotal int
	// extra is more of the rule's YAML (a per-argument price), after
	// price_sats: the base price.
	extra string
}

func (p price) msat() int64 { return p.sats * 1000 }

func (p price) yaml() string {
	s := fmt.Sprintf("price_sats: %d", p.sats)
	if p.extra != "" {
		s += ", " + p.extra
	}
	if p.freePerDay > 0 {
		s += fmt.Sprintf(", free_per_day: %d", p.freePerDay)
	}
	if p.freeTotal > 0 {
		s += fmt.Sprintf(", free_per_day_total: %d", p.freeTotal)
	}
	return "{" + s + "}"
}

// prices are what a shop sells: tools by name on the upstream, prompts by
// name, resources by URI or URI template. Items not listed are free.
type prices struct {
	tools, prompts, resources map[string]price
}

// issuePrices are the prices of issue 11: slow_count 1 sat, sha256 21
// sats, word_count 1 sat with one free call a day; always_fails 5 sats
// (it fails after payment: refunds).
func issuePrices() prices {
	return prices{tools: map[string]price{
		"slow_count":   {sats: 1},
		"sha256":       {sats: 21},
		"word_count":   {sats: 1, freePerDay: 1},
		"always_fails": {sats: 5},
	}}
}

func (p prices) yaml() string {
	var b strings.Builder
	section := func(name string, m map[string]price) {
		if len(m) == 0 {
			return
		}
		fmt.Fprintf(&b, "    %s:\n", name)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "      %q: %s\n", k, m[k].yaml())
		}
	}
	section("tools", p.tools)
	section("prompts", p.prompts)
	section("resources", p.resources)
	return b.String()
}

// Invoices of a shop's LND backend.
const (
	holdInvoices  = "hold"
	plainInvoices = "plain"
	noLND         = "none"
)

// shopOpts configure a shop. The zero value sells example-tools (upstream
// "ex", no prefix, a stdio child) at issuePrices over MCP HTTP, paid with
// LND hold invoices.
type shopOpts struct {
	prices *prices // nil: issuePrices
	lnd    string  // holdInvoices (""), plainInvoices or noLND
	cashu  bool    // the stack's mint as a Cashu backend
	nostr  bool    // the Nostr front on the stack's relay, with a fresh key
	// Extra YAML lines, indented for their section (two spaces; four
	// under the upstream).
	http, nostrExtra, lndExtra, limits, upstream, top string
	// payments are more lines under payments: (two spaces).
	payments string
	// toolFlags are more flags of example-tools (--byte-count).
	toolFlags []string
	// nsecMode is the mode of the nsec file (default 0600).
	nsecMode os.FileMode
	// env is added to capvend's environment.
	env []string
	// noWait: do not wait for capvend to serve (it is expected to fail).
	noWait bool
}

// shop is one capvend serving example-tools on the stack, as a real
// process, and what the invariant needs to judge it.
type shop struct {
	t        *testing.T
	s        *testnet.Stack
	opts     shopOpts
	dir      string
	config   string
	db       string
	callsLog string
	listen   string // MCP HTTP host:port
	url      string // http://listen/mcp
	serverSK string // Nostr key of the server, hex
	serverPK string
	nsecFile string

	mu       sync.Mutex
	versions []priceVersion // prices in force, oldest first
	cmd      *exec.Cmd
	logs     *syncbuf.Buffer
	exited   chan struct{}
	exitErr  error
}

// priceVersion is a price list and when it came in force.
type priceVersion struct {
	since  time.Time
	prices prices
}

// newShop writes a shop's configuration (and its Nostr key) without
// starting it.
func newShop(t *testing.T, o shopOpts) *shop {
	t.Helper()
	s := needStack(t)
	dir := t.TempDir()
	sh := &shop{t: t, s: s, opts: o, dir: dir,
		config:   filepath.Join(dir, "capvend.yaml"),
		db:       filepath.Join(dir, "capvend.db"),
		callsLog: filepath.Join(dir, "calls.jsonl"),
		listen:   freeAddr(t),
	}
	sh.url = "http://" + sh.listen + "/mcp"
	if o.prices == nil {
		p := issuePrices()
		sh.opts.prices = &p
	}
	if o.nostr {
		sh.serverSK = nostr.GeneratePrivateKey()
		sh.serverPK, _ = nostr.GetPublicKey(sh.serverSK)
		sh.nsecFile = filepath.Join(dir, "server.nsec")
		mode := o.nsecMode
		if mode == 0 {
			mode = 0o600
		}
		if err := os.WriteFile(sh.nsecFile, []byte(sh.serverSK+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(sh.nsecFile, mode); err != nil {
			t.Fatal(err)
		}
	}
	sh.writeConfig(*sh.opts.prices)
	return sh
}

// startShop starts capvend serving the shop until the test ends; at the
// end it stops it and checks the money invariant and `ledger verify`.
func startShop(t *testing.T, o shopOpts) *shop {
	t.Helper()
	sh := newShop(t, o)
	t.Cleanup(sh.finish)
	sh.start()
	return sh
}

// writeConfig writes capvend.yaml with prices p.
func (sh *shop) writeConfig(p prices) {
	sh.t.Helper()
	o := sh.opts
	vendor, _ := sh.s.Node(testnet.Vendor)
	var b strings.Builder
	fmt.Fprintf(&b, "ledger:\n  path: %s\nserver:\n  name: redteam shop\n", sh.db)
	// A test stops its shop once it has every answer it checks: the calls
	// left waiting for a payment nobody makes (a flood, a second quote)
	// would hold the stop for a front's default 30 s grace.
	fmt.Fprintf(&b, "http:\n  listen: %s\n  shutdown_grace: 1s\n%s", sh.listen, o.http)
	switch o.lnd {
	case "", holdInvoices, plainInvoices:
		fmt.Fprintf(&b, "lnd:\n  host: %s\n  tls_cert_file: %s\n  macaroon_file: %s\n  hold_invoices: %v\n%s",
			vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon, o.lnd != plainInvoices, o.lndExtra)
	}
	if o.cashu {
		fmt.Fprintf(&b, "cashu:\n  mints: [%s]\n  wallet_dir: %s\n", sh.s.MintURL, filepath.Join(sh.dir, "cashu-wallet"))
	}
	if o.nostr {
		fmt.Fprintf(&b, "nostr:\n  relays: [%s]\n  nsec_file: %s\n  announce: false\n  shutdown_grace: 1s\n%s", sh.s.RelayURL, sh.nsecFile, o.nostrExtra)
	}
	fmt.Fprintf(&b, "payments:\n  ttl: 2m\n%s", o.payments)
	limits := o.limits
	if limits == "" {
		limits = "  requests_per_minute: 100000\n"
	}
	fmt.Fprintf(&b, "limits:\n%s", limits)
	b.WriteString(o.top)
	fmt.Fprintf(&b, "upstreams:\n  - name: ex\n    command: %s\n    args: [--calls-log, %s%s]\n%s%s",
		tools, sh.callsLog, strings.Join(append([]string{""}, o.toolFlags...), ", "), o.upstream, p.yaml())
	if err := os.WriteFile(sh.config, []byte(b.String()), 0o600); err != nil {
		sh.t.Fatal(err)
	}
	sh.mu.Lock()
	sh.versions = append(sh.versions, priceVersion{since: time.Now(), prices: p})
	sh.mu.Unlock()
}

// pricesAt returns the prices in force at time at.
func (sh *shop) pricesAt(at time.Time) prices {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p := sh.versions[0].prices
	for _, v := range sh.versions {
		if !v.since.After(at) {
			p = v.prices
		}
	}
	return p
}

// start runs `capvend serve` and waits until it serves (and example-tools
// answered a tools/list through it).
func (sh *shop) start() {
	sh.t.Helper()
	cmd := exec.Command(serveBin, "serve", "--config", sh.config)
	cmd.Env = append(os.Environ(), sh.opts.env...)
	logs := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		sh.t.Fatal(err)
	}
	exited := make(chan struct{})
	sh.mu.Lock()
	sh.cmd, sh.logs, sh.exited = cmd, logs, exited
	sh.mu.Unlock()
	go func() {
		err := cmd.Wait()
		sh.mu.Lock()
		sh.exitErr = err
		sh.mu.Unlock()
		close(exited)
	}()
	if sh.opts.noWait {
		return
	}
	want := []string{"serving MCP at"}
	if sh.opts.nostr {
		want = append(want, "serving ContextVM")
	}
	sh.waitLog(want...)
	// The upstream connects in the background: wait until its tools are
	// listed.
	waitUntil(sh.t, "example-tools listed through capvend", func() bool {
		c := newHTTPClient(sh.t, sh)
		sess, err := c.tryInitialize()
		if err != nil {
			return false
		}
		m, err := c.tryRPC(sess, 1, "tools/list", nil, nil)
		return err == nil && strings.Contains(string(m.Result), `"name":"sha256"`)
	})
}

// waitLog waits until capvend's output holds every one of want, failing
// if it exits first.
func (sh *shop) waitLog(want ...string) {
	sh.t.Helper()
	deadline := time.Now().Add(90 * time.Second) // a hang guard
	for {
		logs := sh.logs.String()
		all := true
		for _, w := range want {
			all = all && strings.Contains(logs, w)
		}
		if all {
			return
		}
		select {
		case <-sh.exited:
			sh.t.Fatalf("capvend exited (%v) before serving; output:\n%s", sh.exitErr, tail(sh.logs.String(), 8000))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			sh.t.Fatalf("capvend did not serve within 90 s; output:\n%s", tail(logs, 8000))
		}
	}
}

// waitExit waits (bounded) for capvend to exit and returns its output
// and its exit error.
func (sh *shop) waitExit(d time.Duration) (string, error) {
	sh.t.Helper()
	select {
	case <-sh.exited:
	case <-time.After(d):
		sh.t.Fatalf("capvend still runs after %s; output:\n%s", d, tail(sh.logs.String(), 8000))
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.logs.String(), sh.exitErr
}

// signal sends sig to capvend.
func (sh *shop) signal(sig os.Signal) {
	sh.t.Helper()
	sh.mu.Lock()
	cmd := sh.cmd
	sh.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		sh.t.Fatal(err)
	}
}

// stop stops capvend with SIGTERM (SIGKILL after a minute: then the test
// fails) and returns once it exited.
func (sh *shop) stop() {
	sh.mu.Lock()
	cmd, exited := sh.cmd, sh.exited
	sh.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-exited
		sh.t.Errorf("capvend did not stop within a minute of SIGTERM")
	}
}

// restart stops capvend and starts it again on the same ledger.
func (sh *shop) restart() {
	sh.t.Helper()
	sh.stop()
	sh.start()
}

// reload writes prices p to the configuration and sends SIGHUP. The new
// prices count for the invariant from the moment listed says they are
// in force (it is polled, bounded).
func (sh *shop) reload(p prices, listed func() bool) {
	sh.t.Helper()
	sh.writeConfig(p)
	sh.mu.Lock()
	last := &sh.versions[len(sh.versions)-1]
	sh.mu.Unlock()
	sh.signal(syscall.SIGHUP)
	waitUntil(sh.t, "the new prices listed after SIGHUP", listed)
	sh.mu.Lock()
	last.since = time.Now()
	sh.mu.Unlock()
}

// finish stops capvend, then checks the money invariant and `capvend
// ledger verify`.
func (sh *shop) finish() {
	t := sh.t
	sh.stop()
	if sh.logs != nil && strings.Contains(sh.logs.String(), "WARNING: DATA RACE") {
		t.Errorf("the race detector reported a data race in capvend serve")
	}
	if t.Failed() && sh.logs != nil {
		full := sh.logs.String()
		// The whole output outlives the test's directories.
		name := filepath.Join(os.TempDir(), "redteam-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+".log")
		if err := os.WriteFile(name, []byte(full), 0o600); err == nil {
			t.Logf("capvend output: %s", name)
		}
		t.Logf("capvend output (%s), its end:\n%s", sh.config, tail(full, 8_000))
	}
	if _, err := os.Stat(sh.db); err != nil {
		return // it never opened a ledger (a start that had to fail)
	}
	checkInvariant(t, sh)
	verifyLedger(t, sh.db)
}

// verifyLedger runs `capvend ledger verify` on db and requires exit 0.
func verifyLedger(t *testing.T, db string) {
	t.Helper()
	out, err := exec.Command(capvend, "ledger", "verify", "--db", db).CombinedOutput()
	if err != nil {
		t.Errorf("capvend ledger verify: %v\n%s", err, out)
	}
}

// runCapvend runs a capvend command to its end (bounded) and returns its
// output and exit code.
func runCapvend(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, capvend, args...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("capvend %s: %v", strings.Join(args, " "), err)
	}
	return string(out), code
}

// freeAddr is a free 127.0.0.1:port for a server the test starts, below
// the range outgoing connections take their ports from (internal/freeport).
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// waitUntil polls ok until it holds; after two minutes (a hang guard, not
// a speed check) the test fails.
func waitUntil(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 2 minutes", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
