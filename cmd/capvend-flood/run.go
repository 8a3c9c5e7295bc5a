package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/nbd-wtf/go-nostr"
	"gopkg.in/yaml.v3"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/testnet"
)

type options struct {
	config, testnetDir, tool            string
	pid, keys, sessions, calls, sources int
	honest, workers, pow, nice          int
	limit, invoiceEvery                 time.Duration
	returning                           bool   // -returning
	stock                               bool   // -stock
	customerKey                         string // the returning Nostr customer's key, made in the first phase
}

// target is the capvend serve under test, read from its capvend.yaml.
type target struct {
	mcpURL   string // http://<http.listen>/mcp
	relay    string // the first of nostr.relays
	serverPK string // from nostr.nsec_file
}

func readTarget(path string) (*target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c struct {
		HTTP struct {
			Listen string `yaml:"listen"`
		} `yaml:"http"`
		Nostr struct {
			Relays   []string `yaml:"relays"`
			NsecFile string   `yaml:"nsec_file"`
		} `yaml:"nostr"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.HTTP.Listen == "" || len(c.Nostr.Relays) == 0 || c.Nostr.NsecFile == "" {
		return nil, fmt.Errorf("%s: http.listen, nostr.relays and nostr.nsec_file are needed", path)
	}
	nsec := c.Nostr.NsecFile
	if !filepath.IsAbs(nsec) {
		nsec = filepath.Join(filepath.Dir(path), nsec)
	}
	sk, err := ctxvm.LoadSecretKey(nsec)
	if err != nil {
		return nil, err
	}
	pk, _ := nostr.GetPublicKey(sk)
	return &target{mcpURL: "http://" + c.HTTP.Listen + "/mcp", relay: c.Nostr.Relays[0], serverPK: pk}, nil
}

// writeStackConfig writes a capvend.yaml selling example-tools (sha256 at
// 21 sats) over MCP HTTP and the stack's relay, paid with LND hold
// invoices of the stack's vendor node, with the default limits.
func writeStackConfig(dir string, st *testnet.Stack, exampleTools string, pow int) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	vendor, ok := st.Node(testnet.Vendor)
	if !ok {
		return "", errors.New("the stack has no vendor node")
	}
	if err := os.WriteFile(filepath.Join(dir, "capvend.nsec"), []byte(nostr.GeneratePrivateKey()+"\n"), 0o600); err != nil {
		return "", err
	}
	tools, err := filepath.Abs(exampleTools)
	if err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`# Written by capvend-flood -write-config.
ledger:
  path: capvend.db
server:
  name: "capvend under flood"
http:
  listen: 127.0.0.1:8402
nostr:
  relays: [%s]
  nsec_file: capvend.nsec
  announce: false
  pow_difficulty: %d
lnd:
  host: %s
  tls_cert_file: %s
  macaroon_file: %s
  hold_invoices: true
payments:
  ttl: 10m
upstreams:
  - name: ex
    command: %s
    tools:
      sha256: {price_sats: 21}
      slow_count: {price_sats: 1}
      word_count: {price_sats: 1, free_per_day: 1}
`, st.RelayURL, pow, vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon, tools)
	path := filepath.Join(dir, "capvend.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// run measures the honest customer without the flood, then under it.
func run(ctx context.Context, st *testnet.Stack, o *options) error {
	tg, err := readTarget(o.config)
	if err != nil {
		return err
	}
	mon := &monitor{pid: o.pid, st: st, every: o.invoiceEvery}
	mon.start(ctx)
	defer mon.stop()
	cpu := newCPUMeter(st, o.pid)

	say("capvend-flood: %s, relay %s, server %s…", tg.mcpURL, tg.relay, tg.serverPK[:12])
	say("phase 1: the honest customer alone: %d paid %s calls over Nostr and %d over MCP HTTP", o.honest, o.tool, o.honest)
	c0 := cpu.sample()
	base, err := honestPhase(ctx, st, tg, o, "quiet")
	if err != nil {
		return err
	}
	c1 := cpu.sample()
	quietRSS, quietOpen := mon.peakRSS(), mon.openInvoices(ctx)

	say("phase 2: flood of %d Nostr keys x %d calls and %d HTTP sessions x %d calls from %d addresses, never paying (a child process at nice %d)",
		o.keys, o.calls, o.sessions, o.calls, o.sources, o.nice)
	mon.resetPeak()
	fl := &flood{o: o, tg: tg}
	floodCtx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	floodDone, err := fl.start(floodCtx)
	if err != nil {
		return err
	}
	cpu.add(fmt.Sprintf("flood (nice %d)", o.nice), fl.pid, fl.childCPU)
	c2 := cpu.sample()
	// Let the flood fill capvend's unpaid slots before the customer comes.
	for fl.nostrSent.Load() < int64(min(o.keys*o.calls/3, 3000)) && ctx.Err() == nil {
		select {
		case <-floodDone:
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	say("  flood under way: %d Nostr requests and %d HTTP calls sent; the customer comes", fl.nostrSent.Load(), fl.httpSent.Load())
	under, err := honestPhase(ctx, st, tg, o, "flood")
	if err != nil {
		return err
	}
	c3 := cpu.sample()
	floodOpen := mon.openInvoices(ctx)
	<-floodDone
	say("  flood done: %d Nostr requests (%d publish errors), %d HTTP calls (%s)",
		fl.nostrSent.Load(), fl.nostrErrs.Load(), fl.httpSent.Load(), fl.outcomes.String())
	time.Sleep(2 * time.Second)
	afterOpen := mon.openInvoices(ctx)

	say("")
	say("results")
	report := func(name string, q, f []time.Duration, qFail, fFail int) {
		say("  %-12s without flood: p50 %-8s p99 %-8s served %d/%d | under flood: p50 %-8s p99 %-8s served %d/%d | p99 ratio %.2f",
			name, ms(pct(q, 50)), ms(pct(q, 99)), len(q), len(q)+qFail, ms(pct(f, 50)), ms(pct(f, 99)), len(f), len(f)+fFail,
			float64(pct(f, 99))/float64(max(pct(q, 99), 1)))
	}
	report("nostr", base.nostr, under.nostr, base.nostrFail, under.nostrFail)
	report("mcp-http", base.http, under.http, base.httpFail, under.httpFail)
	all := func(p phaseResult) []time.Duration {
		return append(append([]time.Duration(nil), p.nostr...), p.http...)
	}
	report("both", all(base), all(under), base.nostrFail+base.httpFail, under.nostrFail+under.httpFail)
	say("  without the flood:")
	cpu.report(c0, c1)
	say("  from the flood's start to the customers' last call under it:")
	cpu.report(c2, c3)
	if o.pid > 0 {
		say("  capvend RSS: %d MB peak without flood, %d MB peak under flood (pid %d)", quietRSS>>20, mon.peakRSS()>>20, o.pid)
	} else {
		say("  capvend RSS: not measured (no -pid)")
	}
	say("  capvend goroutines: not measured (capvend has no endpoint that reports them)")
	say("  open invoices at the vendor LND: %d after the quiet phase, %d peak during the flood (%d when the customer was done), %d after it",
		quietOpen, mon.peakOpen(), floodOpen, afterOpen)
	return nil
}

type phaseResult struct {
	nostr, http         []time.Duration
	nostrFail, httpFail int
}

// honestPhase runs both honest customers at once, each buying o.honest
// calls one after the other.
func honestPhase(ctx context.Context, st *testnet.Stack, tg *target, o *options, label string) (phaseResult, error) {
	var r phaseResult
	var wg sync.WaitGroup
	var nerr, herr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.nostr, r.nostrFail, nerr = honestNostr(ctx, st, tg, o, label)
	}()
	go func() {
		defer wg.Done()
		r.http, r.httpFail, herr = honestHTTP(ctx, st, tg, o, label)
	}()
	wg.Wait()
	return r, errors.Join(nerr, herr)
}

func say(format string, a ...any) { fmt.Printf(format+"\n", a...) }

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// pct is the p-th percentile of ds (nearest rank), 0 if empty.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// monitor samples capvend's RSS and the vendor LND's open invoices.
type monitor struct {
	pid   int
	st    *testnet.Stack
	every time.Duration // between counts of open invoices

	mu       sync.Mutex
	rss, top int64 // bytes
	cancel   context.CancelFunc
	done     chan struct{}
}

func (m *monitor) start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		n := 0
		per := max(int(m.every/(250*time.Millisecond)), 1)
		for {
			if rss := readRSS(m.pid); rss > 0 {
				m.mu.Lock()
				m.rss = max(m.rss, rss)
				m.mu.Unlock()
			}
			if n%per == 0 { // listing thousands of invoices is not free
				m.openInvoices(ctx)
			}
			n++
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

func (m *monitor) stop() { m.cancel(); <-m.done }

func (m *monitor) peakRSS() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rss
}

func (m *monitor) resetPeak() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rss, m.top = 0, 0
}

func (m *monitor) peakOpen() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.top
}

// readRSS is VmRSS of pid in bytes, 0 if unknown.
func readRSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// openInvoices counts the vendor node's open (and accepted) invoices.
func (m *monitor) openInvoices(ctx context.Context) int {
	c, err := m.st.Conn(testnet.Vendor)
	if err != nil {
		return -1
	}
	ln := lnrpc.NewLightningClient(c)
	n := 0
	var offset uint64
	for {
		res, err := ln.ListInvoices(ctx, &lnrpc.ListInvoiceRequest{PendingOnly: true, IndexOffset: offset, NumMaxInvoices: 5000})
		if err != nil {
			return -1
		}
		n += len(res.Invoices)
		if len(res.Invoices) == 0 || res.LastIndexOffset == offset {
			break
		}
		offset = res.LastIndexOffset
	}
	m.mu.Lock()
	m.top = max(m.top, int64(n))
	m.mu.Unlock()
	return n
}
