package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/freeport"
	"github.com/capvend/capvend/testnet"
)

type options struct {
	duration, every, ttl, sessionIdle, outageFor             time.Duration
	dir, testnetDir, capvend, exampleTools                   string
	freeRate, nostrFreeRate, paidRate, cashuRate, creditRate float64
	unpaidRate, outageAt, hupAt                              float64
	bounds                                                   Bounds
}

func defaultOptions() options {
	return options{
		duration: 30 * time.Minute, ttl: time.Minute, sessionIdle: 5 * time.Minute, outageFor: 30 * time.Second,
		freeRate: 10, nostrFreeRate: 2, paidRate: 0.5, cashuRate: 0.2, creditRate: 2, unpaidRate: 3,
		outageAt: 0.3, hupAt: 0.45,
		bounds: Bounds{RSSMiB: 10, Goroutines: 20, FDs: 10, P99Factor: 2},
	}
}

func say(format string, a ...any) { fmt.Printf(format+"\n", a...) }

// run is the whole soak: it returns whether every bound held, and an
// error when the run itself could not be made.
func run(ctx context.Context, o options) (bool, error) {
	if o.dir == "" {
		d, err := os.MkdirTemp("", "capvend-soak-")
		if err != nil {
			return false, err
		}
		o.dir = d
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	say("capvend-soak: %s of load in %s, sampled every %s", o.duration, dir, o.every)
	if err := buildBinaries(ctx, &o, dir); err != nil {
		return false, err
	}
	st, done, err := stack(ctx, o, dir)
	if err != nil {
		return false, err
	}
	defer done()

	sv, err := startServe(ctx, o, dir, st)
	if err != nil {
		return false, err
	}
	defer sv.stop()
	say("capvend serve: pid %d, MCP %s, metrics %s, relay %s", sv.cmd.Process.Pid, sv.mcpURL, sv.metricsURL, st.RelayURL)
	if err := waitNostr(ctx, st.RelayURL, sv.server); err != nil {
		return false, fmt.Errorf("capvend never answered over Nostr: %w (log: %s)", err, sv.logPath)
	}

	failures, err := errLog(dir)
	if err != nil {
		return false, err
	}
	defer failures.Close()
	l := &load{st: st, mcpURL: sv.mcpURL, relay: st.RelayURL, server: sv.server, dir: dir, rec: &recorder{log: failures}}
	sp := &sampler{pid: sv.cmd.Process.Pid, metricsURL: sv.metricsURL, ledger: sv.ledger}

	var samples []Sample
	var events eventLog
	take := func(at time.Duration) {
		s := Sample{At: at}
		sp.sample(ctx, &s)
		lat, errs := l.rec.take()
		for k := range nKinds {
			s.N[k], s.P50[k], s.P99[k], s.Errs[k] = len(lat[k]), pct(lat[k], 50), pct(lat[k], 99), errs[k]
		}
		s.Calls, s.Priced, s.Unpaid = l.n.done(), l.n.priced(), l.n.unpaidHTTP.Load()+l.n.unpaidNostr.Load()
		s.Events = events.take()
		samples = append(samples, s)
		say("  %s  rss %.1f MiB, %d goroutines, %d fds, %d open quotes, %d calls, %d unpaid quotes, %d failed, ledger %.2f MiB in use %s",
			clock(s.At), mib(s.RSS), s.Goroutines, s.FDs, s.OpenQuotes, s.Calls, s.Unpaid, s.Errs[kFree]+s.Errs[kPaid]+s.Errs[kCredit], mib(s.Used), s.Events)
	}

	var mid map[string]int64 // the ledger's rows at the middle of the run
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	start := time.Now()
	take(0)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); l.run(loadCtx, o) }()
	var marks []mark
	outage := time.Duration(o.outageAt * float64(o.duration))
	hup := time.Duration(o.hupAt * float64(o.duration))
	relayDown, outaged := false, false
	var checks []Verdict
	recovered := func(name string, before int64, n func() int64) {
		checks = append(checks, Verdict{name, fmt.Sprintf("%d after the relay came back", n()-before), n() > before})
	}
	var nostrAtRestart, paidNostrAtRestart int64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	next := o.every
	for ctx.Err() == nil {
		<-tick.C
		at := time.Since(start)
		switch {
		case o.outageAt > 0 && !outaged && at >= outage:
			say("  %s  relay outage: stopping the stack's relay for %s", clock(at), o.outageFor)
			if err := st.StopRelay(); err != nil {
				return false, err
			}
			relayDown, outaged = true, true
			marks = append(marks, mark{at, "relay down"})
			events.add("relay down")
		case relayDown && at >= outage+o.outageFor:
			if err := st.StartRelay(ctx); err != nil {
				return false, err
			}
			relayDown = false
			at = time.Since(start)
			say("  %s  relay back (pid %d)", clock(at), st.Info.Relay.PID)
			marks = append(marks, mark{at, "relay up"})
			events.add("relay up")
			nostrAtRestart, paidNostrAtRestart = l.n.freeNostr.Load(), l.n.paidNostr.Load()
		case o.hupAt > 0 && at >= hup && !events.hupped:
			if err := sv.reload(); err != nil {
				return false, err
			}
			events.hupped = true
			say("  %s  SIGHUP: slow_count now %d sats", clock(at), 4)
			marks = append(marks, mark{at, "SIGHUP"})
			events.add("SIGHUP")
		}
		if at >= next {
			take(at)
			if mid == nil && at >= o.duration/2 {
				mid = tableRows(ctx, sv.ledger)
			}
			next += o.every
		}
		if at >= o.duration {
			break
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	atLoad := sp.goroutines(ctx, filepath.Join(dir, "goroutines-load.txt"))
	stopLoad()
	wg.Wait()
	say("load stopped: %d calls served (%d free over HTTP, %d over Nostr; %d paid by LND over HTTP, %d over Nostr; %d paid with Cashu; %d on credit, %d top-ups)",
		l.n.done(), l.n.freeHTTP.Load(), l.n.freeNostr.Load(), l.n.paidHTTP.Load(), l.n.paidNostr.Load(), l.n.cashu.Load(), l.n.credit.Load(), l.n.topUps.Load())
	say("unpaid flood: %s", l.outcomes.String())
	if o.outageAt > 0 {
		recovered("Nostr free after outage", nostrAtRestart, l.n.freeNostr.Load)
		recovered("Nostr paid after outage", paidNostrAtRestart, l.n.paidNostr.Load)
	}
	if o.hupAt > 0 {
		ok := sv.logHas("config reloaded: new prices in force")
		checks = append(checks, Verdict{"SIGHUP reload", fmt.Sprintf("log says the new prices are in force: %v", ok), ok})
	}

	// Every unpaid quote must expire: none may stay open.
	stopped, limit := time.Now(), o.ttl+90*time.Second
	open := -1
	for time.Since(stopped) < limit && ctx.Err() == nil {
		open = int(sp.metrics(ctx, "capvend_open_quotes")["capvend_open_quotes"])
		if open == 0 {
			break
		}
		time.Sleep(5 * time.Second)
	}
	drainedIn := time.Since(stopped).Round(time.Second)
	checks = append(checks, Verdict{"unpaid quotes expired", fmt.Sprintf("%d open %s after the load stopped (payments.ttl %s; bound: 0 within %s)", open, drainedIn, o.ttl, limit), open == 0})
	// The answers to the last expired quotes are published (and retried
	// while the relay refuses them: their clients are gone) for up to
	// nostr's publish timeout: the goroutines are counted once those end.
	time.Sleep(30 * time.Second)
	end := tableRows(ctx, sv.ledger)
	drained := sp.goroutines(ctx, filepath.Join(dir, "goroutines-drained.txt"))
	wallet := dirSize(filepath.Join(dir, "cashu-wallet"))

	if err := sv.stop(); err != nil {
		say("capvend serve did not stop cleanly: %v", err)
	}
	out, verr := exec.CommandContext(ctx, o.capvend, "ledger", "verify", "--config", sv.config).CombinedOutput()
	vok := verr == nil && strings.Contains(string(out), "checks passed")
	vtext := "passed"
	if !vok {
		vtext = fmt.Sprintf("%v: %s", verr, lastLine(string(out)))
	}
	checks = append(checks, Verdict{"ledger verify", vtext, vok})

	// The report.
	vs := append(verdicts(samples, o.bounds), checks...)
	var report strings.Builder
	fmt.Fprintf(&report, "capvend-soak: %s of load, sampled every %s, on %d CPUs (shared with whatever else runs: latencies are noisy)\n", o.duration, o.every, runtime.NumCPU())
	fmt.Fprintf(&report, "rates: free %g/s HTTP + %g/s Nostr; LND-paid %g/s HTTP + %g/s Nostr; Cashu-paid %g/s; credit %g/s; unpaid quotes %g/s; payments.ttl %s; http.session_idle %s\n\n",
		o.freeRate, o.nostrFreeRate, o.paidRate, o.paidRate, o.cashuRate, o.creditRate, o.unpaidRate, o.ttl, o.sessionIdle)
	writeTable(&report, samples)
	fmt.Fprintln(&report)
	writeVerdicts(&report, vs)
	fmt.Fprintln(&report)
	writeGrowth(&report, mid, end)
	for _, g := range []struct {
		when string
		top  []string
	}{{"at the end of the load", atLoad}, {"30 s after the last quote expired", drained}} {
		fmt.Fprintf(&report, "capvend's goroutines %s, by place (goroutines-*.txt):\n", g.when)
		for _, l := range g.top {
			fmt.Fprintf(&report, "  %s\n", l)
		}
	}
	fmt.Fprintf(&report, "capvend's Cashu wallet: %.2f MiB (ecash from Cashu payments and top-ups)\n", mib(wallet))
	fmt.Fprintf(&report, "unpaid flood: %s\n", l.outcomes.String())
	fmt.Print("\n" + report.String())
	if err := os.WriteFile(filepath.Join(dir, "soak.txt"), []byte(report.String()), 0o644); err != nil {
		return false, err
	}
	var csv strings.Builder
	writeCSV(&csv, samples)
	if err := os.WriteFile(filepath.Join(dir, "soak.csv"), []byte(csv.String()), 0o644); err != nil {
		return false, err
	}
	title := fmt.Sprintf("capvend serve under mixed load, %s (%s)", o.duration, time.Now().Format(time.DateOnly))
	if err := writePlot(filepath.Join(dir, "soak.png"), title, samples, marks); err != nil {
		return false, err
	}
	say("wrote %s, %s, %s", filepath.Join(dir, "soak.txt"), filepath.Join(dir, "soak.csv"), filepath.Join(dir, "soak.png"))
	ok := allOK(vs)
	if ok {
		say("every bound held")
	} else {
		say("some bounds did not hold")
	}
	return ok, nil
}

// eventLog is what happened during the current interval.
type eventLog struct {
	cur    []string
	hupped bool
}

func (e *eventLog) add(s string) { e.cur = append(e.cur, s) }

func (e *eventLog) take() string {
	s := strings.Join(e.cur, ", ")
	e.cur = nil
	return s
}

// writeGrowth lists the ledger's tables that grew from the middle of the
// run to its end.
func writeGrowth(w io.Writer, mid, end map[string]int64) {
	if mid == nil || end == nil {
		fmt.Fprintln(w, "ledger rows: not read")
		return
	}
	var names []string
	for n := range end {
		if end[n] != mid[n] {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return end[names[i]]-mid[names[i]] > end[names[j]]-mid[names[j]] })
	fmt.Fprintln(w, "ledger rows added over the second half, by table (rows at the end):")
	for _, n := range names {
		fmt.Fprintf(w, "  %-22s %+8d  (%d)\n", n, end[n]-mid[n], end[n])
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// buildBinaries builds capvend and example-tools into dir/bin unless o
// names them.
func buildBinaries(ctx context.Context, o *options, dir string) error {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if o.capvend == "" {
		say("building capvend…")
		exe, err := testnet.BuildCapvend(ctx, bin)
		if err != nil {
			return err
		}
		o.capvend = exe
	}
	if o.exampleTools == "" {
		gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
			return errors.New("building example-tools: run inside the capvend module, or give -example-tools")
		}
		out := filepath.Join(bin, "example-tools")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/example-tools")
		cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building example-tools: %w\n%s", err, b)
		}
		o.exampleTools = out
	}
	var err error
	if o.capvend, err = filepath.Abs(o.capvend); err != nil {
		return err
	}
	o.exampleTools, err = filepath.Abs(o.exampleTools)
	return err
}

// stack starts a regtest stack in dir/stack (stopped by done), or
// reattaches to the one in o.testnetDir (left running by done).
func stack(ctx context.Context, o options, dir string) (*testnet.Stack, func(), error) {
	if o.testnetDir != "" {
		st, err := testnet.Load(o.testnetDir, os.Stderr)
		if err != nil {
			return nil, nil, fmt.Errorf("the regtest stack in %s: %w", o.testnetDir, err)
		}
		return st, st.Release, nil
	}
	say("starting a regtest stack in %s…", filepath.Join(dir, "stack"))
	st, err := testnet.Start(ctx, testnet.Options{Dir: filepath.Join(dir, "stack"), Executable: o.capvend, Progress: os.Stderr})
	if err != nil {
		return nil, nil, err
	}
	return st, func() {
		if err := st.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "capvend-soak: stopping the stack:", err)
		}
	}, nil
}

// serve is the capvend serve under test.
type serve struct {
	cmd                        *exec.Cmd
	config, logPath, ledger    string
	mcpURL, metricsURL, server string
	o                          options
	st                         *testnet.Stack
	listen, admin              string
	exited                     chan struct{}
	stopOnce                   sync.Once
	stopErr                    error
}

// config is capvend.yaml for the stack: word_count free, sha256 at 21
// sats, slow_count (never called) at slowSats, which the SIGHUP changes.
func (sv *serve) writeConfig(slowSats int) error {
	vendor, ok := sv.st.Node(testnet.Vendor)
	if !ok {
		return errors.New("the stack has no vendor node")
	}
	cfg := fmt.Sprintf(`# Written by capvend-soak.
ledger:
  path: capvend.db
server:
  name: "capvend soak"
http:
  listen: %s
  session_idle: %s
admin:
  listen: %s
  pprof: true # the soak saves capvend's goroutines at the end of the load and after the drain
nostr:
  relays: [%s]
  nsec_file: capvend.nsec
  announce: false
lnd:
  host: %s
  tls_cert_file: %s
  macaroon_file: %s
cashu:
  mints: [%s]
  wallet_dir: cashu-wallet
credit:
  enabled: true
payments:
  ttl: %s
limits:
  requests_per_minute: 1000000 # the customers call from one address, many times a second
upstreams:
  - name: ex
    command: %s
    tools:
      %s: {}
      %s: {price_sats: %d}
      slow_count: {price_sats: %d}
`, sv.listen, sv.o.sessionIdle, sv.admin, sv.st.RelayURL, vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon,
		sv.st.MintURL, sv.o.ttl, sv.o.exampleTools, freeTool, paidTool, paidSats, slowSats)
	tmp := sv.config + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, sv.config)
}

func startServe(ctx context.Context, o options, dir string, st *testnet.Stack) (*serve, error) {
	ports, err := freeport.Ports(2)
	if err != nil {
		return nil, err
	}
	sv := &serve{o: o, st: st, config: filepath.Join(dir, "capvend.yaml"), logPath: filepath.Join(dir, "serve.log"),
		ledger: filepath.Join(dir, "capvend.db"), exited: make(chan struct{}),
		listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), admin: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	sv.mcpURL, sv.metricsURL = "http://"+sv.listen+"/mcp", "http://"+sv.admin+"/metrics"
	sk := nostr.GeneratePrivateKey()
	sv.server, _ = nostr.GetPublicKey(sk)
	if err := os.WriteFile(filepath.Join(dir, "capvend.nsec"), []byte(sk+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := sv.writeConfig(3); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(sv.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	sv.cmd = exec.Command(o.capvend, "serve", "--config", sv.config)
	sv.cmd.Dir = dir
	sv.cmd.Stdout, sv.cmd.Stderr = logf, logf
	sv.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // never outlives the soak
	if err := sv.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { sv.cmd.Wait(); close(sv.exited) }()
	deadline := time.After(2 * time.Minute) // it serves once its upstreams listed: seconds
	for !sv.logHas("serving MCP at " + sv.mcpURL) {
		select {
		case <-sv.exited:
			return nil, fmt.Errorf("capvend serve exited: see %s", sv.logPath)
		case <-deadline:
			sv.stop()
			return nil, fmt.Errorf("capvend serve did not serve at %s: see %s", sv.mcpURL, sv.logPath)
		case <-ctx.Done():
			sv.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return sv, nil
}

func (sv *serve) logHas(s string) bool {
	b, err := os.ReadFile(sv.logPath)
	return err == nil && strings.Contains(string(b), s)
}

// reload changes slow_count's price and sends SIGHUP.
func (sv *serve) reload() error {
	if err := sv.writeConfig(4); err != nil {
		return err
	}
	return sv.cmd.Process.Signal(syscall.SIGHUP)
}

// stop sends SIGTERM and waits (up to a minute, then SIGKILL).
func (sv *serve) stop() error {
	sv.stopOnce.Do(func() {
		sv.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-sv.exited:
			if st := sv.cmd.ProcessState; st != nil && !st.Success() {
				sv.stopErr = fmt.Errorf("capvend serve: %s", st)
			}
		case <-time.After(time.Minute):
			sv.cmd.Process.Kill()
			<-sv.exited
			sv.stopErr = errors.New("capvend serve did not stop within a minute of SIGTERM; killed")
		}
	})
	return sv.stopErr
}

// waitNostr waits until capvend answers a ping over the relay.
func waitNostr(ctx context.Context, relay, server string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, relay, server, ctxvmclient.Options{Kinds: []int{ctxvmclient.KindMessage}})
	if err != nil {
		return err
	}
	defer c.Close()
	return c.WaitReady(ctx)
}
