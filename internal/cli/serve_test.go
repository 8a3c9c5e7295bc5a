package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/internal/racesupp"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/teststack"
	"github.com/capvend/capvend/vend"
)

// The regtest stack is the one every test binary of the run shares
// (teststack), attached by the first test that needs it; with
// CAPVEND_TEST_STACK=DIR it is the stack already running in DIR
// (`capvend testnet up --dir DIR`). capvendBin is built once, beside it.
var (
	binOnce    sync.Once
	binErr     error
	binTmp     string
	capvendBin string
	// lastHTTPUpstream is the example-tools --http address of the last
	// configuration written (benchmarks call it directly).
	lastHTTPUpstream atomic.Value // string
)

func TestMain(m *testing.M) {
	racesupp.Reexec() // go-nostr and khatru race inside themselves: see package racesupp
	// The parallel tests (the multi-instance ones among them) mostly wait,
	// for leases to lapse and requests lost with a killed instance, not for
	// the CPU; each runs a few capvend processes.
	teststack.Parallel(4)
	code := teststack.Run(m)
	if binTmp != "" {
		os.RemoveAll(binTmp)
	}
	capvendtest.Cleanup()
	os.Exit(code)
}

func needStack(t testing.TB) *testnet.Stack {
	t.Helper()
	skip.Short(t, "needs the regtest stack")
	teststack.Prepare() // the stack comes up while capvend builds
	builtCapvend(t)
	return teststack.Need(t)
}

// serveBuildTags are builtCapvend's build tags: capvend_failpoints for
// the crash tests, and the test binary's own libsecp256k1
// (libsecp256k1_test.go).
var serveBuildTags = []string{"capvend_failpoints"}

// builtCapvend returns capvendBin, the capvend binary built once for the
// run, with the crash tests' failpoints (off unless a test's environment
// names one).
func builtCapvend(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binTmp, binErr = os.MkdirTemp("", "capvend-serve-"); binErr != nil {
			return
		}
		capvendBin, binErr = testnet.BuildCapvend(context.Background(), binTmp, serveBuildTags...)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return capvendBin
}

// writeServeConfig writes a capvend.yaml selling example-tools as a stdio
// child (prefix t_) and as an HTTP upstream (prefix w_), paid through the
// stack's vendor node with its invoice macaroon.
// serveOpts chooses the payment backends of a test configuration.
type serveOpts struct {
	hold  bool // LND hold invoices
	noLND bool // no LND backend
	cashu bool // the stack's mint as a Cashu backend
	// nsecFile, if set, enables the Nostr (ContextVM) front on the stack's
	// relay with the key in that file.
	nsecFile string
	// items prices the stdio upstream's prompt summarize (3 sats) and
	// resource example://readme (1.5 sats).
	items bool
	// http402 sets payments.http_402: unpaid priced calls over HTTP get
	// HTTP 402 with their challenges (L402, X-Cashu).
	http402 bool
	// http402Schemes, if set, is payments.http_402_schemes (YAML flow
	// list): the challenges of a 402, in order.
	http402Schemes string
	// credit turns prepaid credit on.
	credit bool
	// callsLog, if set, is the file the stdio upstream (example-tools
	// --calls-log) appends a line to per execution.
	callsLog string
	// nwcURIFile, if set, adds the NWC backend with that nwc.uri_file.
	nwcURIFile string
}

func writeServeConfig(t testing.TB, s *testnet.Stack, o serveOpts) (path, listen string) {
	t.Helper()
	vendor, _ := s.Node(testnet.Vendor)
	toolsBin := capvendtest.ExampleTools(t)
	httpUpstream := capvendtest.FreeAddr(t)
	lastHTTPUpstream.Store(httpUpstream)
	up := exec.Command(toolsBin, "--http", httpUpstream)
	up.Stderr = io.Discard
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Process.Kill(); up.Wait() })
	listen = capvendtest.FreeAddr(t)
	var backends string
	if !o.noLND {
		backends = fmt.Sprintf("lnd:\n  host: %s\n  tls_cert_file: %s\n  macaroon_file: %s\n  hold_invoices: %v\n",
			vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon, o.hold)
	}
	if o.cashu {
		backends += fmt.Sprintf("cashu:\n  mints: [%s]\n  wallet_dir: cashu-wallet\n", s.MintURL)
	}
	if o.nwcURIFile != "" {
		backends += fmt.Sprintf("nwc:\n  uri_file: %s\n", o.nwcURIFile)
	}
	if o.nsecFile != "" {
		backends += fmt.Sprintf("nostr:\n  relays: [%s]\n  nsec_file: %s\n", s.RelayURL, o.nsecFile)
	}
	if o.credit {
		backends += "credit:\n  enabled: true\n"
	}
	var schemes402 string
	if o.http402Schemes != "" {
		schemes402 = "  http_402_schemes: " + o.http402Schemes + "\n"
	}
	var toolsArgs string
	if o.callsLog != "" {
		toolsArgs = fmt.Sprintf("    args: [--calls-log, %s]\n", o.callsLog)
	}
	var items string
	if o.items {
		items = "    prompts:\n      summarize: {price_sats: 3}\n    resources:\n      \"example://readme\": {price_msat: 1500}\n"
	}
	cfg := fmt.Sprintf(`
ledger:
  path: capvend.db
server:
  name: "capvend e2e"
http:
  listen: %s
%s
payments:
  ttl: 2m
  http_402: %v
%slimits:
  requests_per_minute: 1000000 # benchmarks call in tight loops
upstreams:
  - name: tools
    command: %s
%s    prefix: t_
    tools:
      sha256: {price_sats: 21}
      always_fails: {price_sats: 5}
      slow_count: {price_sats: 3, not_idempotent: true}
%s  - name: web
    url: http://%s/mcp
    prefix: w_
    tools:
      sha256: {price_sats: 13}
`, listen, backends, o.http402, schemes402, toolsBin, toolsArgs, items, httpUpstream)
	path = filepath.Join(t.TempDir(), "capvend.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, listen
}

// TestServePaidCallsOverMCPHTTP is the end-to-end proof: a real mcp-go
// client calls priced tools of a real upstream (a stdio child and an HTTP
// server) through `capvend serve`, the customer LND node pays, the results
// arrive, a failing tool's hold invoice is canceled, and the ledger
// verifies.
func TestServePaidCallsOverMCPHTTP(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{hold: true, cashu: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	pc := capvendtest.NewPayingClient(t, s, url)
	ctx := context.Background()

	var tools *mcp.ListToolsResult
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		tools, err = pc.ListTools(ctx, mcp.ListToolsRequest{})
		if err == nil && len(tools.Tools) == 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools: %+v %v", tools, err)
		}
		time.Sleep(200 * time.Millisecond) // upstreams connecting
	}
	prices := map[string]any{}
	for _, tl := range tools.Tools {
		if tl.Meta != nil {
			prices[tl.Name] = tl.Meta.AdditionalFields["capvend/price"]
		}
	}
	if fmt.Sprint(prices["t_sha256"]) != "map[amount:21 unit:sats]" || prices["t_word_count"] != nil {
		t.Fatalf("prices in tools/list: %v", prices)
	}

	res, err := pc.Call(t, "t_word_count", map[string]any{"text": "free as in beer"})
	if err != nil || capvendtest.Text(res) != "4 words, 1 lines, 15 characters" {
		t.Fatalf("free call: %v %v", res, err)
	}
	if len(pc.Methods()) != 0 {
		t.Fatalf("a free call sent %v", pc.Methods())
	}

	before := capvendtest.CustomerBalance(t, s)
	for _, tool := range []string{"t_sha256", "w_sha256"} {
		res, err = pc.Call(t, tool, map[string]any{"text": "hi"})
		if err != nil || capvendtest.Text(res) != "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4" {
			t.Fatalf("%s: %v %v (notes %v)", tool, res, err, pc.Methods())
		}
		if err := <-pc.Paid; err != nil {
			t.Fatalf("%s: payment: %v", tool, err)
		}
	}
	if got := strings.Join(pc.Methods(), ","); got != "notifications/payment_required,notifications/payment_accepted,notifications/payment_required,notifications/payment_accepted" {
		t.Fatalf("notifications %s", got)
	}
	if spent := before - capvendtest.CustomerBalance(t, s); spent != 34_000 {
		t.Fatalf("customer spent %d msat, want 34000", spent)
	}

	// Progress from the upstream reaches the caller on the call's stream.
	ctx2, cancel2 := context.WithTimeout(ctx, 90*time.Second)
	res, err = pc.CallTool(ctx2, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_slow_count",
		Arguments: map[string]any{"n": 4}, Meta: &mcp.Meta{ProgressToken: "count-1"}}})
	cancel2()
	if err != nil || capvendtest.Text(res) != "counted to 4" {
		t.Fatalf("slow_count: %v %v", res, err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatal(err)
	}
	progress := 0
	for _, m := range pc.Methods() {
		if m == "notifications/progress" {
			progress++
		}
	}
	// mcp-go's stdio server may write an upstream's last notification
	// after its result, and then it is not forwarded: at least three of
	// the four must arrive.
	if progress < 3 {
		t.Fatalf("%d of 4 progress notifications reached the client, want at least 3: %v", progress, pc.Methods())
	}

	// Invalid arguments: refused before any charge.
	if _, err := pc.Call(t, "t_sha256", map[string]any{"text": 42}); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("invalid arguments: %v", err)
	}
	// A tool that fails after payment: the hold invoice is canceled and
	// the customer's money comes back.
	before = capvendtest.CustomerBalance(t, s)
	res, err = pc.Call(t, "t_always_fails", map[string]any{"text": "x"})
	if err != nil || !res.IsError {
		t.Fatalf("failing tool: %v %v", res, err)
	}
	if err := <-pc.Paid; err == nil {
		t.Fatal("the customer's payment of the failed call succeeded")
	}
	if after := capvendtest.CustomerBalance(t, s); after != before {
		t.Fatalf("customer balance %d -> %d after a refunded call", before, after)
	}

	// A Cashu token in _meta pays at once: no invoice, no notification
	// but payment_accepted.
	token, err := s.CashuMint(ctx, 21)
	if err != nil {
		t.Fatal(err)
	}
	res, err = pc.CallMeta(t, "t_sha256", map[string]any{"text": "hi"}, map[string]any{"capvend/cashu": token})
	if err != nil || capvendtest.Text(res) != "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4" {
		t.Fatalf("token call: %v %v", res, err)
	}
	// The same token again is refused: it is spent.
	if _, err := pc.CallMeta(t, "t_sha256", map[string]any{"text": "again"}, map[string]any{"capvend/cashu": token}); err == nil {
		t.Fatal("a spent token paid a second call")
	}

	l := ledgerkit.OpenVerified(t, db)
	b, _ := l.Balance(ctx)
	var revenue int64
	for _, tr := range b.Tools {
		revenue += int64(tr.Revenue)
	}
	if revenue != 34_000+3_000+21_000 {
		t.Fatalf("revenue %+v", b.Tools)
	}
}

// TestServeWithCashuOnly sells through a Cashu mint alone: the client pays
// the mint quote's Lightning invoice, capvend mints the ecash and runs the
// call.
func TestServeWithCashuOnly(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{noLND: true, cashu: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	pc := capvendtest.NewPayingClient(t, s, url)
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	res, err := pc.Call(t, "w_sha256", map[string]any{"text": "hi"})
	if err != nil || capvendtest.Text(res) != "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4" {
		t.Fatalf("mint-quote call: %v %v (notes %v)", res, err, pc.Methods())
	}
	if err := <-pc.Paid; err != nil {
		t.Fatalf("paying the mint quote: %v", err)
	}
	l := ledgerkit.OpenVerified(t, db)
	b, _ := l.Balance(context.Background())
	if len(b.Tools) != 1 || b.Tools[0].Revenue != 13_000 {
		t.Fatalf("revenue %+v", b.Tools)
	}
	found := false
	for _, a := range b.Accounts {
		found = found || strings.HasPrefix(a.Account, "assets:cashu:") && a.Balance == 13_000
	}
	if !found {
		t.Fatalf("no ecash booked: %+v", b.Accounts)
	}
}

// TestServeSurvivesSIGKILLAtEveryStep kills the real capvend binary with
// SIGKILL at each step of a paid call, starts it again, and checks that
// the call ended as it must: never run unpaid, never run twice (unless
// idempotent and interrupted while running), every settled payment
// delivered or refunded, and the ledger verifies.
func TestServeSurvivesSIGKILLAtEveryStep(t *testing.T) {
	s := needStack(t)
	for _, tc := range []struct {
		step       string
		tool       string
		pays       bool           // the client gets an invoice and pays it
		want       vend.CallState // after the restart
		executions int
	}{
		{vend.FailAfterQuote, "t_sha256", false, vend.CallCanceled, 0},
		{vend.FailAfterInvoice, "t_sha256", false, vend.CallAwaitingPayment, 0},
		{vend.FailAfterSettlement, "t_sha256", true, vend.CallDelivered, 1},
		{vend.FailDuringExecution, "t_sha256", true, vend.CallDelivered, 2},    // idempotent: run again
		{vend.FailDuringExecution, "t_slow_count", true, vend.CallRefunded, 1}, // not idempotent: refunded
		{vend.FailAfterResult, "t_sha256", true, vend.CallDelivered, 1},
	} {
		t.Run(tc.step+"/"+tc.tool, func(t *testing.T) {
			path, listen := writeServeConfig(t, s, serveOpts{})
			db := filepath.Join(filepath.Dir(path), "capvend.db")
			proc := startCapvend(t, path, capvendtest.Options{Process: true, Failpoint: tc.step})
			pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
			args := map[string]any{"text": "crash " + tc.step}
			if tc.tool == "t_slow_count" {
				args = map[string]any{"n": 2}
			}
			capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
			if _, err := pc.Call(t, tc.tool, args); err == nil {
				t.Fatal("the call succeeded although capvend was killed")
			}
			if code := proc.Wait(); code != capvendtest.ExitKilled {
				t.Fatalf("capvend did not die by SIGKILL: exit %d", code)
			}
			if tc.pays {
				if err := <-pc.Paid; err != nil {
					t.Fatalf("payment: %v", err)
				}
			}
			restarted := startCapvend(t, path, capvendtest.Options{Process: true})
			l, err := ledger.Open(context.Background(), db, ledger.Options{MustExist: true})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c := capvendtest.WaitCall(t, l, tc.want)
			if c.Executions != tc.executions {
				t.Fatalf("call executed %d times, want %d", c.Executions, tc.executions)
			}
			restarted.Stop()
			out, errOut, code := run(t, nil, "ledger", "verify", "--db", db)
			if code != 0 {
				t.Fatalf("ledger verify: %s %s", out, errOut)
			}
		})
	}
}

// serveTools is how many tools writeServeConfig's capvend lists.
const serveTools = 10
