package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/ctxvm/oversized"
	"github.com/capvend/capvend/adapters/upstream"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/internal/replica"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// checkTimeout bounds each of doctor's checks that talks to something.
const checkTimeout = 20 * time.Second

// outcome is one line of doctor's report.
type outcome struct {
	status string // ok, FAIL, skip
	name   string
	detail string
	fix    string // for FAIL and skip
}

func passed(name, format string, a ...any) outcome {
	return outcome{status: "ok", name: name, detail: fmt.Sprintf(format, a...)}
}

func failed(name, fix, format string, a ...any) outcome {
	return outcome{status: "FAIL", name: name, detail: fmt.Sprintf(format, a...), fix: fix}
}

// warned is a check that passes with a warning: nothing is broken now,
// but something should be done (doctor still exits 0).
func warned(name, fix, format string, a ...any) outcome {
	return outcome{status: "WARN", name: name, detail: fmt.Sprintf(format, a...), fix: fix}
}

func skipped(name, fix, format string, a ...any) outcome {
	return outcome{status: "skip", name: name, detail: fmt.Sprintf(format, a...), fix: fix}
}

func doctorCommand() *command {
	var configFile string
	return &command{
		Name:    "doctor",
		Summary: "check a deployment: config, ledger, LND, liquidity, mints, relays, upstreams, clock, secrets; exit 1 if any fails",
		Help: `Checks what a first real deployment gets wrong, one line each, with the fix
for anything that fails:
  - the configuration is valid;
  - the ledger opens, and its schema version;
  - with ledger.replica, the replica's lag: the books' last change
    against the newest change Litestream replicated (to the second;
    behind by more than 5 s warns, by more than a minute fails: the
    Litestream beside serve is not replicating);
  - LND is reachable and the macaroon allows what capvend needs;
  - the inbound liquidity can receive the highest price (needs a macaroon
    that may read channel balances; skipped otherwise);
  - each mint is reachable, with its keysets and input fees;
  - each relay is reachable and takes our kinds: an ephemeral probe event
    (kind 25910, signed with the server's key) is published and read back,
    and one as large as capvend sends whole to it (its NIP-11
    max_message_length, or 48000 bytes) is taken: a relay that refuses
    our events fails, with its reason;
  - each upstream starts and lists its tools, and every price (of a tool,
    prompt or resource) names something it lists; and what an item
    without a price is (pricing.unpriced: free or refuse);
  - the clock agrees with the mints' (within the Nostr window);
  - secret files (nsec, macaroon, wallet, bearer token) are readable only
    by their owner.
Safe while 'capvend serve' runs (it starts its own copies of the
upstreams). Exits 0 when every check passes (skips do not fail), 1 if any
fails.

Example:
  capvend doctor --config capvend.yaml`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&configFile, "config", "", "configuration `FILE` (default $CAPVEND_CONFIG, else ./capvend.yaml)")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("capvend doctor takes no arguments")
			}
			cfg, err := loadConfig(configFile, e.Getenv)
			if err != nil {
				writeOutcome(e.Stdout, failed("config", "edit the file: the message names the field", "%v", err))
				return &exitError{code: 1, err: errors.New("doctor: the configuration is not valid")}
			}
			nfail := 0
			for _, o := range doctor(ctx, cfg) {
				writeOutcome(e.Stdout, o)
				if o.status == "FAIL" {
					nfail++
				}
			}
			if nfail > 0 {
				return &exitError{code: 1, err: fmt.Errorf("doctor: %d check(s) failed", nfail)}
			}
			return nil
		},
	}
}

func writeOutcome(w io.Writer, o outcome) {
	line := fmt.Sprintf("%-4s  %s: %s", o.status, o.name, o.detail)
	if o.fix != "" {
		line += " -- fix: " + o.fix
	}
	fmt.Fprintln(w, line)
}

// doctor runs every check that applies to cfg, in order.
func doctor(ctx context.Context, cfg *Config) []outcome {
	name := cfg.path
	if name == "" {
		name = "(defaults)"
	}
	out := []outcome{passed("config", "%s is valid", name)}
	out = append(out, checkLedger(ctx, cfg))
	if cfg.Ledger.Replica != "" {
		out = append(out, checkReplica(ctx, cfg, time.Now()))
	}
	if cfg.LND.Host != "" {
		out = append(out, checkLND(ctx, cfg)...)
	}
	out = append(out, checkNWC(ctx, cfg)...)
	for _, m := range cfg.Cashu.Mints {
		out = append(out, checkMint(ctx, m))
	}
	if len(cfg.Cashu.Mints) > 0 && cfg.Cashu.WalletDir != "" {
		out = append(out, checkCashuSeed(cfg.Cashu.WalletDir))
	}
	if len(cfg.Nostr.Relays) > 0 {
		out = append(out, checkRelays(ctx, cfg)...)
	}
	out = append(out, checkUpstreams(ctx, cfg)...)
	out = append(out, checkClock(ctx, cfg))
	out = append(out, checkSecretFiles(cfg))
	return out
}

func checkLedger(ctx context.Context, cfg *Config) outcome {
	l, err := cfg.Ledger.open(ctx, "", ledger.Options{MustExist: true})
	switch {
	case errors.Is(err, ledger.ErrNoLedger) && cfg.Ledger.Driver == "postgres":
		return passed("ledger", "the database of ledger.dsn_file has no capvend ledger yet: 'capvend serve' creates its tables")
	case errors.Is(err, ledger.ErrNoLedger):
		dir := filepath.Dir(cfg.Ledger.Path)
		if st, derr := os.Stat(dir); derr != nil || !st.IsDir() {
			return failed("ledger", "create the directory "+dir+" or change ledger.path", "%s does not exist and neither does its directory", cfg.Ledger.Path)
		}
		return passed("ledger", "%s does not exist yet: 'capvend serve' creates it", cfg.Ledger.Path)
	case errors.Is(err, ledger.ErrNewerSchema):
		return failed("ledger", "run the capvend that wrote it, or a newer one", "%v", err)
	case err != nil:
		return failed("ledger", "check ledger.path (or ledger.dsn_file) and its permissions", "%v", err)
	}
	defer l.Close()
	applied, known, err := l.SchemaVersion(ctx)
	if err != nil {
		return failed("ledger", "run 'capvend ledger verify'", "%v", err)
	}
	return passed("ledger", "%s opens, schema version %d (this capvend knows up to %d)", l.Path(), applied, known)
}

// checkLND checks LND is reachable with the macaroon's permissions, and
// its inbound liquidity against the highest price.
func checkLND(ctx context.Context, cfg *Config) []outcome {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	conn, err := lnd.Dial(cfg.LND.Host, cfg.LND.TLSCertFile, cfg.LND.MacaroonFile)
	if err != nil {
		return []outcome{failed("lnd", "check lnd.tls_cert_file and lnd.macaroon_file", "%v", err)}
	}
	defer conn.Close()
	ln := lnrpc.NewLightningClient(conn)
	_, err = lnd.New(ctx, ln, invoicesrpc.NewInvoicesClient(conn), nil, lnd.Config{Hold: cfg.LND.HoldInvoices})
	switch {
	case errors.Is(err, lnd.ErrPermission):
		return []outcome{failed("lnd", "set lnd.macaroon_file to this node's invoice.macaroon (or one baked with invoices:read and invoices:write)",
			"%s: %v", cfg.LND.Host, err)}
	case err != nil:
		return []outcome{failed("lnd", "check that LND runs at lnd.host, and that lnd.tls_cert_file is its tls.cert and lnd.macaroon_file one of its macaroons",
			"%s: %v", cfg.LND.Host, err)}
	}
	out := []outcome{passed("lnd", "%s reachable; the macaroon allows reading and writing invoices", cfg.LND.Host)}
	return append(out, checkLiquidity(ctx, cfg, ln))
}

// checkLiquidity compares LND's inbound capacity with the highest price.
func checkLiquidity(ctx context.Context, cfg *Config, ln lnrpc.LightningClient) outcome {
	top, what := highestPrice(cfg)
	if top == 0 {
		return passed("liquidity", "nothing is priced")
	}
	bal, err := ln.ChannelBalance(ctx, &lnrpc.ChannelBalanceRequest{})
	if err != nil {
		return skipped("liquidity", fmt.Sprintf("check with 'lncli channelbalance' that remote_balance is at least %d sat", (top+999)/1000),
			"the macaroon cannot read channel balances (%v)", status(err))
	}
	in := vend.Msat(0)
	if bal.RemoteBalance != nil {
		in = vend.Msat(bal.RemoteBalance.Msat)
	}
	if in < top {
		return failed("liquidity", "open a channel to this node or buy inbound liquidity (a channel lease, a loop out)",
			"inbound %d msat cannot receive the highest price, %d msat (%s)", in, top, what)
	}
	return passed("liquidity", "inbound %d msat covers the highest price, %d msat (%s)", in, top, what)
}

// status is a gRPC error's message.
func status(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "desc = "); i >= 0 {
		msg = msg[i+len("desc = "):]
	}
	return msg
}

// highestPrice is the most one priced call can cost, and which.
func highestPrice(cfg *Config) (vend.Msat, string) {
	book, err := cfg.PriceBook()
	if err != nil {
		return 0, ""
	}
	var top vend.Msat
	var what string
	for _, u := range cfg.Upstreams {
		for name := range u.Tools {
			if _, hi := book.Listed(u.Name, name); hi > top {
				top, what = hi, u.Name+"/"+name
			}
		}
	}
	return top, what
}

// checkMint asks a mint for its keysets (NUT-02).
func checkMint(ctx context.Context, mint string) outcome {
	name := "mint " + mint
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	n, err := cashu.NormalizeMintURL(mint)
	if err != nil {
		return failed(name, "fix cashu.mints", "%v", err)
	}
	var ks struct {
		Keysets []struct {
			ID       string `json:"id"`
			Unit     string `json:"unit"`
			Active   bool   `json:"active"`
			InputFee uint64 `json:"input_fee_ppk"`
		} `json:"keysets"`
	}
	if _, err := getJSON(ctx, n+"/v1/keysets", &ks); err != nil {
		return failed(name, "check the URL in cashu.mints and that the mint runs", "unreachable: %v", err)
	}
	var active []string
	for _, k := range ks.Keysets {
		if k.Unit == "sat" && k.Active {
			active = append(active, fmt.Sprintf("%s (input fee %d ppk)", k.ID, k.InputFee))
		}
	}
	if len(active) == 0 {
		return failed(name, "use a mint with an active sat keyset", "%d keysets, none active in sat", len(ks.Keysets))
	}
	return passed(name, "reachable, %d keysets; active in sat: %s", len(ks.Keysets), strings.Join(active, ", "))
}

// getJSON GETs u into v and returns the answer's Date header.
func getJSON(ctx context.Context, u string, v any) (time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("HTTP %d from %s", resp.StatusCode, u)
	}
	date, _ := http.ParseTime(resp.Header.Get("Date"))
	return date, json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// checkRelays publishes an ephemeral probe on each relay and reads it
// back through a subscription opened first.
func checkRelays(ctx context.Context, cfg *Config) []outcome {
	sk, err := ctxvm.LoadSecretKey(cfg.Nostr.NsecFile)
	if err != nil {
		return []outcome{failed("nostr key", "set nostr.nsec_file to a file holding the server's nsec ('capvend init' makes one)", "%v", err)}
	}
	var out []outcome
	for _, url := range cfg.Nostr.Relays {
		out = append(out, probeRelay(ctx, url, sk))
	}
	return out
}

func probeRelay(ctx context.Context, url, sk string) outcome {
	name := "relay " + url
	const fix = "check the URL in nostr.relays, or pick a relay that accepts ephemeral events (kind 25910) from any key"
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	r, err := nostr.RelayConnect(ctx, url)
	if err != nil {
		return failed(name, fix, "unreachable: %v", err)
	}
	defer r.Close()
	pk, _ := nostr.GetPublicKey(sk)
	since := nostr.Timestamp(time.Now().Add(-time.Minute).Unix())
	sub, err := r.Subscribe(ctx, nostr.Filters{{Kinds: []int{ctxvm.KindMessage}, Authors: []string{pk}, Since: &since}})
	if err != nil {
		return failed(name, fix, "subscribe: %v", err)
	}
	defer sub.Unsub()
	// A relay drops an ephemeral event nobody listens to: publish only
	// once it has taken the subscription.
	select {
	case <-sub.EndOfStoredEvents:
	case <-ctx.Done():
		return failed(name, fix, "did not answer the subscription within %s", checkTimeout)
	}
	ev := nostr.Event{Kind: ctxvm.KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", pk}},
		Content: `{"jsonrpc":"2.0","method":"notifications/ping","params":{"capvend":"doctor probe"}}`}
	if err := ev.Sign(sk); err != nil {
		return failed(name, "check nostr.nsec_file", "sign: %v", err)
	}
	start := time.Now()
	if err := r.Publish(ctx, ev); err != nil {
		return failed(name, fix, "refused the probe: %v", err)
	}
	for {
		select {
		case got, open := <-sub.Events:
			if !open {
				return failed(name, fix, "the subscription ended before the probe came back")
			}
			if got.ID == ev.ID {
				took := time.Since(start).Round(time.Millisecond)
				limit, detail, err := probeSize(ctx, r, url, sk, pk)
				if err != nil {
					return failed(name, "pick a relay that takes events of "+strconv.Itoa(limit)+" bytes, or one that advertises its limit in NIP-11 (capvend then cuts answers to it)",
						"refuses our events of %d bytes (%s): %v", limit, detail, err)
				}
				return passed(name, "reachable; published and read back an ephemeral kind %d probe in %s; takes our events of %d bytes (%s)",
					ctxvm.KindMessage, took, limit, detail)
			}
		case <-ctx.Done():
			return failed(name, fix, "took the probe but did not deliver it back within %s", checkTimeout)
		}
	}
}

// probeSize publishes an ephemeral event as large as capvend sends whole
// to the relay at url (on r): its advertised NIP-11 max_message_length,
// or oversized.DefaultThreshold when it advertises none (larger answers
// go as CEP-22 frames). It returns that size, what it is, and the
// relay's refusal.
func probeSize(ctx context.Context, r *nostr.Relay, url, sk, pk string) (int, string, error) {
	limit, detail := oversized.DefaultThreshold, "it advertises no limit: capvend sends at most this whole"
	if info, err := nip11.Fetch(ctx, url); err == nil && info.Limitation != nil && info.Limitation.MaxMessageLength > 0 {
		limit, detail = info.Limitation.MaxMessageLength, "its advertised max_message_length"
	}
	ev := nostr.Event{Kind: ctxvm.KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", pk}}}
	// Sized from the envelope of an empty probe: the rest is content.
	ev.Content = `{"jsonrpc":"2.0","method":"notifications/ping","params":{"capvend":"doctor size probe","pad":""}}`
	if err := ev.Sign(sk); err != nil {
		return limit, detail, err
	}
	env, _ := nostr.EventEnvelope{Event: ev}.MarshalJSON()
	pad := strings.Repeat("x", max(limit-len(env)-16, 0))
	ev.Content = `{"jsonrpc":"2.0","method":"notifications/ping","params":{"capvend":"doctor size probe","pad":"` + pad + `"}}`
	if err := ev.Sign(sk); err != nil {
		return limit, detail, err
	}
	err := r.Publish(ctx, ev)
	if err == nil && !r.IsConnected() {
		err = errors.New("it closed the connection")
	}
	return limit, detail, err
}

// checkUpstreams starts every upstream (its own copy), waits until each
// connected or failed, and checks every price names something its
// upstream lists (see priceCheck); then says what unpriced items are.
func checkUpstreams(ctx context.Context, cfg *Config) []outcome {
	if len(cfg.Upstreams) == 0 {
		return []outcome{failed("upstreams", "add an upstream MCP server under upstreams:", "none configured: nothing to sell")}
	}
	book, err := cfg.PriceBook()
	if err != nil {
		return []outcome{failed("upstreams", "fix the prices under upstreams:", "%v", err)}
	}
	ups, err := upstream.New(upstream.Config{Servers: upstreamServers(cfg)})
	if err != nil {
		return []outcome{failed("upstreams", "fix upstreams: in the configuration", "%v", err)}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ups.Run(ctx) }()
	defer func() { cancel(); <-done }()
	listedAll(ctx, ups, checkTimeout)
	listings := ups.Listings()
	var out []outcome
	for i, st := range ups.Status() {
		u := cfg.Upstreams[i]
		name := "upstream " + st.Server
		if !st.Up {
			why := st.LastErr
			if why == "" {
				why = "did not answer within " + checkTimeout.String()
			}
			out = append(out, failed(name, "check its command/args (or url) and run it by hand", "does not start: %s", why))
			continue
		}
		var missing []string
		for _, key := range book.Unmatched(u.Name, listings[u.Name]) {
			missing = append(missing, configKey(key))
		}
		if len(missing) > 0 {
			out = append(out, failed(name, "correct the names under its tools:, prompts:, resources: (the upstream's names, without the prefix; a resource's URI, or a URI template)",
				"lists %d tools, but nothing the prices %s name", st.Tools, strings.Join(missing, ", ")))
			continue
		}
		n := len(u.Tools) + len(u.Prompts) + len(u.Resources)
		out = append(out, passed(name, "started and lists %d tools; all %d prices name something it lists", st.Tools, n))
	}
	return append(out, passed("unpriced", "%s", unpricedSummary(cfg)))
}

// listedAll waits until every upstream has listed its tools or failed,
// at most limit.
func listedAll(ctx context.Context, ups *upstream.Manager, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		settled := true
		for _, st := range ups.Status() {
			settled = settled && ((st.Up && st.Tools > 0) || st.LastErr != "")
		}
		if settled {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkClock compares the local clock with the mints' (their HTTP Date):
// Nostr requests outside nostr.window of our clock are dropped.
func checkClock(ctx context.Context, cfg *Config) outcome {
	for _, m := range cfg.Cashu.Mints {
		n, err := cashu.NormalizeMintURL(m)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		var info json.RawMessage
		before := time.Now()
		date, err := getJSON(cctx, n+"/v1/info", &info)
		cancel()
		if err != nil || date.IsZero() {
			continue
		}
		mid := before.Add(time.Since(before) / 2)
		off := mid.Sub(date).Round(time.Second)
		if off < 0 {
			off = -off
		}
		// The Date header has whole seconds: allow 2 s of it.
		if off > cfg.Nostr.Window/2 && off > 2*time.Second {
			return failed("clock", "sync the clock (systemd-timesyncd, chrony)", "%s off the clock of %s; Nostr requests are dropped beyond %s", off, n, cfg.Nostr.Window)
		}
		return passed("clock", "within %s of %s (the Nostr window is %s)", max(off, 2*time.Second), n, cfg.Nostr.Window)
	}
	return skipped("clock", "keep the clock synced (systemd-timesyncd, chrony)", "no mint answered with a Date to compare with")
}

// checkSecretFiles is serve's own refusal of secrets others can read.
func checkSecretFiles(cfg *Config) outcome {
	if err := cfg.checkSecrets(); err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		return failed("secrets", "chmod 600 each file named (700 for the wallet directory)", "%s", msg)
	}
	return passed("secrets", "readable only by their owner")
}

// checkCashuSeed warns while the Cashu wallet's seed was never exported:
// the wallet file alone holds the ecash capvend earned.
func checkCashuSeed(dir string) outcome {
	if _, err := os.Stat(filepath.Join(dir, "wallet.db")); err != nil {
		return passed("cashu seed", "no wallet in %s yet ('capvend serve' makes it; export its seed then)", dir)
	}
	if at := cashu.SeedExported(dir); !at.IsZero() {
		return passed("cashu seed", "exported %s", at.Format(time.RFC3339))
	}
	return warned("cashu seed", "stop serve, run 'capvend cashu seed --to FILE' and keep FILE offline",
		"the wallet's seed was never exported: if %s is lost, so is its ecash", dir)
}

// Replica lag bounds: Litestream ships a change within about a second
// (its sync interval) and lists its files to the second, so a few seconds
// behind is normal; a minute means it is not replicating.
const (
	replicaLagWarn = 5 * time.Second
	replicaLagFail = time.Minute
)

// checkReplica measures how far ledger.replica lags behind the ledger:
// the books' last change (ledger.LastChange) against the time of the
// newest file Litestream wrote to the replica. Changes the books made
// after that file are not in the replica.
func checkReplica(ctx context.Context, cfg *Config, now time.Time) outcome {
	const name = "replica"
	ls, err := cfg.Ledger.litestream("")
	if err != nil {
		return failed(name, "fix ledger.replica, ledger.replica_credentials_file or ledger.litestream", "%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	pos, err := ls.Newest(ctx)
	if err != nil {
		return failed(name, "check that Litestream "+replica.Version+" is installed, the replica reachable and its credentials right", "%s: %v", ls.Redacted(), err)
	}
	l, err := cfg.Ledger.open(ctx, "", ledger.Options{MustExist: true})
	if errors.Is(err, ledger.ErrNoLedger) {
		return passed(name, "%s: no ledger yet, nothing to replicate", ls.Redacted())
	}
	if err != nil {
		return failed(name, "see the ledger check", "%v", err)
	}
	defer l.Close()
	last, err := l.LastChange(ctx)
	if err != nil {
		return failed(name, "run 'capvend ledger verify'", "%v", err)
	}
	start := "run Litestream beside capvend serve: capvend ledger litestream-config > litestream.yml; litestream replicate -config litestream.yml (see docs/OPERATING.md, Continuous backup)"
	if pos.Files == 0 {
		if last.IsZero() {
			return passed(name, "%s holds nothing yet, and the books are empty", ls.Redacted())
		}
		return failed(name, start, "%s holds no backup of the ledger (the books last changed %s)", ls.Redacted(), last.UTC().Format(time.RFC3339))
	}
	// pos.Time is to the second: a change in the same second as the
	// newest file counts as replicated.
	lag := last.Truncate(time.Second).Sub(pos.Time)
	detail := fmt.Sprintf("%s: newest replicated change %s (transaction %d, %s ago), the books' last change %s",
		ls.Redacted(), pos.Time.UTC().Format(time.RFC3339), pos.TXID, now.Sub(pos.Time).Round(time.Second), last.UTC().Format(time.RFC3339))
	switch {
	case lag <= 0:
		return passed(name, "lag 0s: %s", detail)
	case lag > replicaLagFail:
		return failed(name, start, "lag %s: changes to the books since %s are not replicated: %s", lag, pos.Time.UTC().Format(time.RFC3339), detail)
	case lag > replicaLagWarn:
		return warned(name, "check that Litestream is running: "+start, "lag %s: %s", lag, detail)
	}
	return passed(name, "lag %s: %s", lag, detail)
}
