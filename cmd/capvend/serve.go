package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/adapters/upstream"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

func serveCommand() *command {
	var configFile, listen string
	var stdio bool
	return &command{
		Name:    "serve",
		Summary: "sell the configured MCP servers' tools over MCP HTTP, stdio and Nostr",
		Help: `Connects the upstream MCP servers of the configuration, the payment backends
(LND, Cashu) and the ledger, and answers MCP clients at http://LISTEN/mcp
(http.listen) and Nostr clients (ContextVM, DVMCP) on nostr.relays, where it
also announces its tools and prices (nostr.announce). Priced tool calls
send notifications/payment_required with a Lightning invoice, run once
paid, and are recorded in the ledger; see the README for how clients pay.
Over HTTP only MCP sessions it issued are served (404 otherwise), browser
origins are checked (http.allowed_origins), a bearer token can be required
(http.auth_token_file), and limits count clients by address
(http.trusted_proxies for X-Forwarded-For). With --stdio it serves one MCP client on
standard input and output instead (for desktop MCP clients that launch
their servers); logs then go to standard error only.

SIGHUP reloads the prices (the tools:, prompts: and resources: sections of
the upstreams): a valid file takes effect for new calls at once (calls
already quoted keep their price), tool lists change and Nostr announcements
are republished; an invalid one is logged and the old prices stay. An
explicit-gating grant paid for an item that became free is refunded (owed
back, see the ledger's liabilities:refunds); an unpaid one is withdrawn.
Other changes need a restart.

Stops on SIGINT or SIGTERM: it stops accepting calls, lets running ones
finish (up to 30 s), stops watching payments, and closes the ledger last.
What was paid and not yet answered is finished at the next start.

Crash tests set CAPVEND_FAILPOINT to a step of a paid call (after_quote,
after_invoice, after_settlement, during_execution, after_result; Cashu:
after_swap, between a token's swap and its record, and after_mint, between
minting a paid quote and its record): capvend then kills itself with
SIGKILL there.

A paid call that fails is refunded: a hold invoice is canceled; a Cashu
payment is paid back at once with a token from the wallet, in the answer;
a plain invoice's payment is owed ('capvend refunds').`,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&configFile, "config", "", "configuration `FILE` (default $CAPVEND_CONFIG, else ./capvend.yaml)")
			fs.StringVar(&listen, "listen", "", "`ADDR` to serve MCP HTTP on, overriding http.listen")
			fs.BoolVar(&stdio, "stdio", false, "serve one MCP client on standard input/output instead of HTTP")
		},
		Run: func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usageError("serve takes no arguments")
			}
			cfg, err := loadConfig(configFile, e.Getenv)
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.HTTP.Listen = listen
			}
			if !stdio && cfg.HTTP.Listen == "" && len(cfg.Nostr.Relays) == 0 {
				return errors.New("nothing to serve: set http.listen or nostr.relays, or use --stdio")
			}
			return serve(ctx, e, cfg, stdio)
		},
	}
}

// serve wires the concrete parts together and runs them until ctx ends.
func serve(ctx context.Context, e *env, cfg *Config, stdio bool) error {
	log := e.Log
	if err := cfg.checkSecrets(); err != nil {
		return err
	}
	l, err := ledger.Open(ctx, cfg.Ledger.Path, ledger.Options{})
	if err != nil {
		return err
	}
	defer l.Close() // last: everything else has stopped by then

	var failpoint func(string)
	if step := e.Getenv("CAPVEND_FAILPOINT"); step != "" {
		// Crash tests: die like a power cut at that step of a paid call.
		failpoint = func(s string) {
			if s == step {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	var backends []vend.PaymentBackend
	var rc reconcile.Config // the reconciler's view of the same backends
	var closers []func() error
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	if cfg.LND.Host != "" {
		conn, err := lnd.Dial(cfg.LND.Host, cfg.LND.TLSCertFile, cfg.LND.MacaroonFile)
		if err != nil {
			return err
		}
		closers = append(closers, conn.Close)
		b, err := lnd.New(ctx, lnrpc.NewLightningClient(conn), invoicesrpc.NewInvoicesClient(conn), l,
			lnd.Config{Node: cfg.LND.Host, Hold: cfg.LND.HoldInvoices, MaxHold: cfg.LND.MaxHoldInvoices, Log: log})
		if err != nil {
			return fmt.Errorf("lnd %s: %w", cfg.LND.Host, err)
		}
		backends = append(backends, b)
		rc.LND, rc.Node = lnd.NewNode(lnrpc.NewLightningClient(conn), invoicesrpc.NewInvoicesClient(conn)), cfg.LND.Host
	}
	if len(cfg.Cashu.Mints) > 0 {
		// gonuts' wallet calls the mint through http.DefaultClient, which
		// has no timeout: a hung mint must not hang capvend.
		if http.DefaultClient.Timeout == 0 {
			http.DefaultClient.Timeout = 30 * time.Second
		}
		b, err := cashu.New(cashu.Config{Mints: cfg.Cashu.Mints, WalletDir: cfg.Cashu.WalletDir,
			AcceptTokens: cfg.Cashu.AcceptTokens, MintQuotes: cfg.Cashu.MintQuotes, Log: log, Failpoint: failpoint}, l)
		if err != nil {
			return err
		}
		closers = append(closers, b.Close)
		backends = append(backends, b)
		rc.Wallet = b
	}

	var front *mcpfront.Server
	var nf *ctxvm.Server
	var frontMu sync.Mutex
	refresh := func() {
		frontMu.Lock()
		f, n := front, nf
		frontMu.Unlock()
		if f != nil {
			f.Refresh()
		}
		if n != nil {
			n.Refresh()
		}
	}
	ups, err := upstream.New(upstream.Config{Servers: upstreamServers(cfg), Logger: log, OnChange: refresh})
	if err != nil {
		return err
	}
	prices, err := cfg.PriceBook()
	if err != nil {
		return err
	}
	vcfg := vend.Config{
		Ledger: l, Backends: backends, Tools: ups, Prices: prices, TTL: cfg.Payments.TTL,
		MaxUnpaidPerClient: cfg.Limits.MaxUnpaidPerClient, MaxUnpaidTotal: cfg.Limits.MaxUnpaidTotal,
		RequestsPerMinute: cfg.Limits.RequestsPerMinute, Log: log, Failpoint: failpoint,
		Credit: vend.CreditConfig{Enabled: cfg.Credit.Enabled, MaxTopUp: vend.Msat(cfg.Credit.MaxTopUpSats * vend.MsatPerSat),
			ExpiresAfter: cfg.Credit.ExpiresAfter},
	}
	v, err := vend.New(vcfg)
	if err != nil {
		return err
	}
	fcfg, err := frontConfig(cfg)
	if err != nil {
		return err
	}
	fcfg.Vendor, fcfg.Catalog, fcfg.Version, fcfg.Logger = v, upstreamCatalog{ups}, buildVersion(), log
	f, err := mcpfront.New(fcfg)
	if err != nil {
		return err
	}
	var n *ctxvm.Server
	if !stdio && len(cfg.Nostr.Relays) > 0 {
		if n, err = nostrFront(cfg, v, upstreamCatalog{ups}, l, backends, e); err != nil {
			return err
		}
	}
	frontMu.Lock()
	front, nf = f, n
	frontMu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	runPart := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	runPart("upstreams", ups.Run)
	runPart("payments", v.Run)
	if cfg.Reconcile.Interval > 0 && (rc.LND != nil || rc.Wallet != nil) {
		rc.Store, rc.Repair, rc.Report, rc.Interval, rc.Log = l, true, v.Report, cfg.Reconcile.Interval, log
		r, err := reconcile.New(rc)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		runPart("reconcile", func(ctx context.Context) error {
			// After Recover has finished the previous run's calls: a
			// repair then never races the start's own catching up.
			select {
			case <-v.Recovered():
			case <-ctx.Done():
				return nil
			}
			return r.Run(ctx)
		})
	}
	endFreedGrants(v, log) // the prices may have changed while capvend was stopped
	if cfg.path != "" {
		reloadOnHUP(ctx, &wg, cfg, e.Getenv, v, refresh, log)
	}

	if stdio {
		err := f.ServeStdio(ctx, e.Stdin, e.Stdout)
		cancel()
		wg.Wait()
		close(errs)
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return <-errs
	}

	// The Nostr front runs until ctx ends, then drains its requests.
	nostrDone := make(chan struct{})
	if nf != nil {
		runPart("reply pruning", func(ctx context.Context) error {
			pruneReplies(ctx, l, cfg.Nostr.Window, log)
			return nil
		})
		go func() {
			defer close(nostrDone)
			// Requests replayed from relays at start would find no tool.
			awaitUpstreams(ctx, ups, 30*time.Second)
			nf.Run(ctx)
		}()
		fmt.Fprintf(e.Stderr, "capvend: serving ContextVM as %s on %d relay(s) (%s)\n", nf.PublicKey(), len(cfg.Nostr.Relays), describeBackends(backends))
	} else {
		close(nostrDone)
	}
	var srv *http.Server
	serveErr := make(chan error, 1)
	if cfg.HTTP.Listen != "" {
		ln, err := net.Listen("tcp", cfg.HTTP.Listen)
		if err != nil {
			cancel()
			<-nostrDone
			wg.Wait()
			return fmt.Errorf("http.listen %s: %w", cfg.HTTP.Listen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/mcp", f.Handler())
		mux.Handle(mcpfront.DiscoveryPath, f.Discovery(discoveryInfo(cfg, nf)))
		srv = httpServer(cfg.HTTP, mux)
		fmt.Fprintf(e.Stderr, "capvend: serving MCP at http://%s/mcp (%s)\n", ln.Addr(), describeBackends(backends))
		go func() { serveErr <- srv.Serve(newLimitListener(ln, cfg.HTTP.MaxConnections)) }()
	}
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		errs <- fmt.Errorf("http: %w", err)
	}
	if srv != nil {
		shutdown, stop := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		f.CloseStreams()       // long-lived listen streams would hold Shutdown
		srv.Shutdown(shutdown) // stop accepting; in-flight calls finish
		stop()
	}
	cancel()
	<-nostrDone // its requests in flight had up to 30 s too
	wg.Wait()
	close(errs)
	return <-errs
}

// frontConfig is the MCP front's configuration from cfg's server and http
// sections (the bearer token read from its file).
func frontConfig(cfg *Config) (mcpfront.Config, error) {
	proxies, err := cfg.HTTP.Prefixes()
	if err != nil {
		return mcpfront.Config{}, err
	}
	fc := mcpfront.Config{
		Name: cfg.Server.Name, MaxBodyBytes: cfg.HTTP.MaxRequestBytes,
		SessionIdle: cfg.HTTP.SessionIdle, MaxSessions: cfg.HTTP.MaxSessions,
		TrustedProxies: proxies, ClientIDHeader: cfg.HTTP.ClientIDHeader,
		AllowedOrigins: cfg.HTTP.AllowedOrigins, WriteTimeout: cfg.HTTP.WriteTimeout,
		LegacyGatingCode: cfg.Payments.LegacyGatingCode, HTTP402: cfg.Payments.HTTP402,
	}
	if cfg.Cashu.AcceptTokens {
		fc.CashuMints = cfg.Cashu.Mints // X-Cashu's payment request names them
	}
	if cfg.HTTP.AuthTokenFile != "" {
		if fc.BearerToken, err = readTokenFile(cfg.HTTP.AuthTokenFile); err != nil {
			return mcpfront.Config{}, err
		}
	}
	return fc, nil
}

// httpServer is the MCP front's http.Server: every phase of a connection
// is bounded. The write timeout is per write: the front moves the
// deadline before each one (mcpfront.Config.WriteTimeout), so a response
// stream may wait quietly for a payment (up to payments.ttl) while a
// client that stops reading is cut off.
func httpServer(h HTTPConfig, handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(10*time.Second, h.ReadTimeout),
		ReadTimeout:       h.ReadTimeout,
		WriteTimeout:      h.WriteTimeout,
		IdleTimeout:       h.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// awaitUpstreams returns once every upstream has connected or failed once,
// after limit, or when ctx ends.
func awaitUpstreams(ctx context.Context, ups *upstream.Manager, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		settled := true
		for _, st := range ups.Status() {
			settled = settled && (st.Up || st.LastErr != "")
		}
		if settled {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pruneReplies deletes, every hour until ctx ends, the stored answers to
// Nostr requests older than twice the window: their replays are refused
// as too old anyway.
func pruneReplies(ctx context.Context, l *ledger.Ledger, window time.Duration, log *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := l.PruneReplies(ctx, time.Now().Add(-2*window)); err != nil && ctx.Err() == nil {
			log.Warn("pruning stored Nostr replies failed", "err", err)
		} else if n > 0 {
			log.Debug("pruned stored Nostr replies", "n", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// The Vendor gives known payers their reserve of request slots and their
// own subscription (see ctxvm's PayerKnower and PayerLister).
var (
	_ ctxvm.PayerKnower = (*vend.Vendor)(nil)
	_ ctxvm.PayerLister = (*vend.Vendor)(nil)
)

// nostrFront returns the ContextVM front of cfg.Nostr, selling v's tools.
func nostrFront(cfg *Config, v *vend.Vendor, cat ctxvm.Catalog, replies ctxvm.ReplyStore, backends []vend.PaymentBackend, e *env) (*ctxvm.Server, error) {
	sk, err := ctxvm.LoadSecretKey(cfg.Nostr.NsecFile)
	if err != nil {
		return nil, fmt.Errorf("nostr.nsec_file: %w", err)
	}
	var pmis []string
	if len(backends) > 0 {
		pmis = append(pmis, vend.PMILightning) // every backend takes bolt11
	}
	if len(cfg.Cashu.Mints) > 0 && cfg.Cashu.AcceptTokens {
		pmis = append(pmis, vend.PMICashu)
	}
	return ctxvm.New(ctxvm.Config{
		Vendor: v, Catalog: cat, Replies: replies, SecretKey: sk, Relays: cfg.Nostr.Relays,
		Name: cfg.Server.Name, Version: buildVersion(), About: cfg.Server.About, Website: cfg.Server.Website, Picture: cfg.Server.Picture,
		PMIs: pmis, Encryption: ctxvm.Encryption(cfg.Nostr.Encryption), Window: cfg.Nostr.Window, Logger: e.Log,
		Announce: cfg.Nostr.Announce, Allow: hexPubkeys(cfg.Nostr.Allow), Deny: hexPubkeys(cfg.Nostr.Deny),
		PowDifficulty: cfg.Nostr.PowDifficulty,
	})
}

func describeBackends(bs []vend.PaymentBackend) string {
	if len(bs) == 0 {
		return "no payment backend: free tools only"
	}
	s := "payments:"
	for _, b := range bs {
		s += " " + string(b.Backend())
		if h, ok := b.(vend.HoldSettler); ok && h.CanHold() {
			s += " (hold invoices)"
		}
	}
	return s
}

func upstreamServers(cfg *Config) []upstream.ServerConfig {
	out := make([]upstream.ServerConfig, 0, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		sc := upstream.ServerConfig{Name: u.Name, Prefix: u.Prefix, Command: u.Command, Args: u.Args, Dir: u.Cwd, URL: u.URL}
		if len(u.Env) > 0 {
			keys := make([]string, 0, len(u.Env))
			for k := range u.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys { // with PATH and HOME, the child's whole environment
				sc.Env = append(sc.Env, k+"="+u.Env[k])
			}
		}
		out = append(out, sc)
	}
	return out
}

// upstreamCatalog serves the upstreams' prompts and resources on the MCP
// and Nostr fronts (priced ones are sold through the Vendor instead).
type upstreamCatalog struct{ m *upstream.Manager }

var (
	_ mcpfront.Catalog = upstreamCatalog{}
	_ ctxvm.Catalog    = upstreamCatalog{}
)

func (c upstreamCatalog) Prompts() []mcpfront.Prompt {
	ps := c.m.Prompts()
	out := make([]mcpfront.Prompt, len(ps))
	for i, p := range ps {
		out[i] = mcpfront.Prompt{Name: p.Name, Definition: p.Definition}
	}
	return out
}

func (c upstreamCatalog) Resources() []mcpfront.Resource {
	rs := c.m.Resources()
	out := make([]mcpfront.Resource, len(rs))
	for i, r := range rs {
		out[i] = mcpfront.Resource{URI: r.URI, Definition: r.Definition}
	}
	return out
}

func (c upstreamCatalog) ResourceTemplates() []mcpfront.ResourceTemplate {
	ts := c.m.ResourceTemplates()
	out := make([]mcpfront.ResourceTemplate, len(ts))
	for i, t := range ts {
		out[i] = mcpfront.ResourceTemplate{URITemplate: t.URITemplate, Definition: t.Definition}
	}
	return out
}

func (c upstreamCatalog) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	return c.m.GetPrompt(ctx, name, args)
}

func (c upstreamCatalog) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	return c.m.ReadResource(ctx, uri)
}

// discoveryInfo is what the discovery document (GET
// /.well-known/capvend.json) says of cfg's payment setup and of the
// Nostr front nf (nil if none).
func discoveryInfo(cfg *Config, nf *ctxvm.Server) mcpfront.DiscoveryInfo {
	info := mcpfront.DiscoveryInfo{MCPPath: "/mcp", Mints: cfg.Cashu.Mints, L402: cfg.LND.Host != ""}
	if cfg.LND.Host != "" || (len(cfg.Cashu.Mints) > 0 && cfg.Cashu.MintQuotes) {
		info.PMIs = append(info.PMIs, vend.PMILightning)
	}
	if len(cfg.Cashu.Mints) > 0 && cfg.Cashu.AcceptTokens {
		info.PMIs = append(info.PMIs, vend.PMICashu)
	}
	if nf != nil {
		info.RelayPubkey, info.Relays = nf.PublicKey(), cfg.Nostr.Relays
	}
	return info
}
