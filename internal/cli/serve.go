package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"

	"golang.org/x/sync/errgroup"

	"github.com/capvend/capvend/adapters/admin"
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
paid, and are recorded in the ledger; see docs/PAYING.md for how clients pay.
Over HTTP only MCP sessions it issued are served (404 otherwise), at most
http.max_sessions_per_source (100) per client (its next initialize evicts
its own session idle the longest, or gets 429), browser origins are
checked (http.allowed_origins), a bearer token can be required
(http.auth_token_file), and limits count clients by address
(http.trusted_proxies for X-Forwarded-For). With --stdio it serves one MCP client on
standard input and output instead (for desktop MCP clients that launch
their servers); logs then go to standard error only.

One serve at a time uses an SQLite ledger (it locks LEDGER.lock): a second
waits up to 40 s for the first to stop (a restart), then refuses. Several
serves share a PostgreSQL ledger (ledger.driver: postgres).

An item without a price is sold free (pricing.unpriced: free, the default)
or neither listed nor sold (refuse; an upstream's own unpriced: wins).
Every price must name a tool, prompt or resource its upstream lists (a
resource price that is a URI template names what it matches): upstreams
connect in the background, so each upstream's prices are checked when its
lists first arrive, and one naming nothing stops serve, naming it. If a
running upstream's lists change so that a price names nothing, it is
logged and /readyz fails, and serving goes on. A resources/read of a URI
not in RFC 3986 normal form (dot segments, needless percent-encoding) is
refused as invalid params.

SIGHUP reloads the prices (the tools:, prompts: and resources: sections of
the upstreams, their unpriced: and pricing.unpriced): a valid file takes
effect for new calls at once (calls already quoted keep their price), tool
lists change and Nostr announcements are republished; an invalid one, or
one with a price naming nothing an upstream listed, is logged and the old
prices stay. An explicit-gating grant paid for an item that became free is
refunded (owed back, see the ledger's liabilities:refunds); an unpaid one
is withdrawn. Other changes need a restart.

Stops on SIGINT or SIGTERM: it stops accepting calls, lets running ones
finish (http.shutdown_grace and nostr.shutdown_grace, 30 s each by
default), stops watching payments, and closes the ledger last. What was
paid and not yet answered is finished at the next start.

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

// serveGCPercent is the garbage collector's target for serve unless GOGC
// is set: a new cycle once the heap grew by twice what was live after the
// last. serve's live heap is small (20-30 MiB under load) and nearly all
// its garbage is per request: at Go's default (100) collecting (marking,
// assists, sweeping) was 3-4 % of its CPU per free Nostr call; at 200 it
// is half that, for a heap peaking at most half as high again.
const serveGCPercent = 200

// serve wires the concrete parts together and runs them until ctx ends.
func serve(ctx context.Context, e *env, cfg *Config, stdio bool) error {
	if err := cfg.checkSecrets(); err != nil {
		return err
	}
	if e.Getenv("GOGC") == "" {
		debug.SetGCPercent(serveGCPercent)
	}
	if cfg.Ledger.Driver != "postgres" {
		wait := serveLockWait
		if e.lockWait > 0 {
			wait = e.lockWait
		}
		release, err := lockLedger(ctx, cfg.Ledger.Path, wait, e.Stderr)
		if err != nil {
			return err
		}
		defer release() // after s.close below: the ledger is closed first
	}
	log := e.Log
	if cfg.Log != defaultConfig().Log {
		log = cfg.Log.logger(e.Stderr)
	}
	s := &vendServer{cfg: cfg, e: e, log: log, stdio: stdio}
	defer s.close()
	if err := s.open(ctx); err != nil {
		return err
	}
	if stdio {
		return s.runStdio(ctx)
	}
	return s.run(ctx)
}

// vendServer is what serve wires: the ledger, the payment backends, the
// upstreams, the Vendor, its fronts and the admin listener.
type vendServer struct {
	cfg   *Config
	e     *env
	log   *slog.Logger
	stdio bool

	l *ledger.Ledger
	// instance names this process among the instances sharing a
	// PostgreSQL ledger (its request claims and leases): see newInstanceID.
	instance string
	metrics  *admin.Metrics // nil without admin.listen
	admin    *admin.Server  // nil without admin.listen
	backends []vend.PaymentBackend
	closers  []func() error
	ups      *upstream.Manager
	prices   *priceCheck // the prices in force against the upstreams' lists
	v        *vend.Vendor
	front    *mcpfront.Server
	nostr    *ctxvm.Server // nil without relays (or with --stdio)

	frontMu        sync.Mutex // front and nostr are set after ups calls refresh
	refreshFront   *mcpfront.Server
	refreshNostr   *ctxvm.Server
	failpointCheck func(string)

	rc         reconcile.Config      // the reconciler's view of the backends
	reconciler *reconcile.Reconciler // nil: reconcile.interval 0, or nothing to compare
}

// open opens the ledger, connects the payment backends and makes the
// upstreams, the Vendor and the fronts. Nothing runs yet.
func (s *vendServer) open(ctx context.Context) error {
	cfg := s.cfg
	if cfg.Admin.Listen != "" {
		var err error
		if s.admin, s.metrics, err = newAdmin(cfg, s.log); err != nil {
			return err
		}
	}
	// Every priced call gets a log line: a paid one when it ends (vend),
	// one that ends unpaid when the ledger ends it (LogCallEnds).
	var metrics vend.Observer
	if s.metrics != nil {
		metrics = s.metrics
	}
	obs := vend.LogCallEnds(s.log, metrics)
	var err error
	// On SQLite serve holds the ledger's lock (serve above): no other
	// process stores replies.
	opts := ledger.Options{Observer: obs, ClaimTakeover: cfg.Ledger.ClaimTakeover, SoleReplyWriter: cfg.Ledger.Driver != "postgres"}
	if s.l, err = cfg.Ledger.open(ctx, "", opts); err != nil {
		return err
	}
	s.instance = newInstanceID()
	s.failpointCheck = failpoints(s.e.Getenv) // crash tests' builds only
	if err := s.openBackends(ctx); err != nil {
		return err
	}
	if s.ups, err = upstream.New(upstream.Config{Servers: upstreamServers(cfg), Logger: s.log, OnChange: s.refresh}); err != nil {
		return err
	}
	prices, err := cfg.PriceBook()
	if err != nil {
		return err
	}
	s.prices = newPriceCheck(cfg, prices, s.ups.Listings, s.log)
	if err := s.registerPrices(ctx); err != nil {
		return err
	}
	if s.v, err = vend.New(vend.Config{
		Ledger: s.l, Backends: s.backends, Tools: s.ups, Prices: prices, TTL: cfg.Payments.TTL,
		MaxUnpaidPerClient: cfg.Limits.MaxUnpaidPerClient, MaxUnpaidTotal: cfg.Limits.MaxUnpaidTotal,
		RequestsPerMinute: cfg.Limits.RequestsPerMinute, Log: s.log, Failpoint: s.failpointCheck, Observer: obs,
		Credit: vend.CreditConfig{Enabled: cfg.Credit.Enabled, MaxTopUp: vend.Msat(cfg.Credit.MaxTopUpSats * vend.MsatPerSat),
			ExpiresAfter: cfg.Credit.ExpiresAfter},
		Shared: s.shared(),
	}); err != nil {
		return err
	}
	if err := s.openReconciler(); err != nil {
		return err
	}
	fcfg, err := frontConfig(cfg)
	if err != nil {
		return err
	}
	// Prompts and resources reach the fronts through the Vendor's view of
	// them (what it offers, URIs in normal form).
	catalog := s.v.Offered(upstreamCatalog{s.ups})
	fcfg.Vendor, fcfg.Catalog, fcfg.Version, fcfg.Logger = s.v, catalog, buildVersion(), s.log
	if cfg.Ledger.Driver == "postgres" {
		fcfg.Sessions = s.l // any instance accepts a session any issued: see docs/OPERATING.md, Several instances
	}
	if s.front, err = mcpfront.New(fcfg); err != nil {
		return err
	}
	if !s.stdio && len(cfg.Nostr.Relays) > 0 {
		if s.nostr, err = nostrFront(cfg, s.v, catalog, s.l, s.claims(), s.backends, s.log); err != nil {
			return err
		}
	}
	s.frontMu.Lock()
	s.refreshFront, s.refreshNostr = s.front, s.nostr
	s.frontMu.Unlock()
	if s.admin != nil {
		return s.watch()
	}
	return nil
}

// openBackends connects the payment backends of the configuration.
func (s *vendServer) openBackends(ctx context.Context) error {
	cfg := s.cfg
	if cfg.LND.Host != "" {
		conn, err := lnd.Dial(cfg.LND.Host, cfg.LND.TLSCertFile, cfg.LND.MacaroonFile)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, conn.Close)
		mark, err := s.l.InvoiceMark(ctx)
		if err != nil {
			return err
		}
		b, err := lnd.New(ctx, lnrpc.NewLightningClient(conn), invoicesrpc.NewInvoicesClient(conn), s.l,
			lnd.Config{Node: cfg.LND.Host, Hold: cfg.LND.HoldInvoices, MaxHold: cfg.LND.MaxHoldInvoices, Log: s.log, Mark: mark})
		if err != nil {
			return fmt.Errorf("lnd %s: %w", cfg.LND.Host, err)
		}
		s.backends = append(s.backends, b)
		s.rc.LND, s.rc.Node = lnd.NewNode(lnrpc.NewLightningClient(conn), invoicesrpc.NewInvoicesClient(conn)), cfg.LND.Host
		s.rc.OwnsPreimage = lnd.Mark(mark).Owns
	}
	if len(cfg.Cashu.Mints) > 0 {
		b, err := cashu.New(cashu.Config{Mints: cfg.Cashu.Mints, WalletDir: cfg.Cashu.WalletDir,
			AcceptTokens: cfg.Cashu.AcceptTokens, MintQuotes: cfg.Cashu.MintQuotes, Log: s.log, Failpoint: s.failpointCheck}, s.l)
		if err != nil {
			return err
		}
		s.closers = append(s.closers, b.Close)
		s.backends = append(s.backends, b)
		s.rc.Wallet = b
	}
	if err := s.openNWC(ctx); err != nil {
		return err
	}
	s.backends = preferred(s.backends, cfg.Payments.Prefer)
	return nil
}

// openReconciler prepares the reconciliation of the books with the
// payment backends (reconcile.interval), repairs on, its differences a
// metric when the admin listener is on.
func (s *vendServer) openReconciler() error {
	if s.cfg.Reconcile.Interval <= 0 || (s.rc.LND == nil && s.rc.Wallet == nil && len(s.rc.NWC) == 0) {
		return nil
	}
	rc := s.rc
	rc.Store, rc.Repair, rc.Report, rc.Interval, rc.Log = s.l, true, s.v.Report, s.cfg.Reconcile.Interval, s.log
	if m := s.metrics; m != nil {
		rc.Observe = func(sum reconcile.Summary) {
			for k, n := range sum.ByKind() {
				m.SetReconcileDifferences(string(k), n)
			}
		}
	}
	var err error
	s.reconciler, err = reconcile.New(rc)
	return err
}

// refresh checks the prices against the upstreams' lists and tells the
// fronts that the lists changed.
func (s *vendServer) refresh() {
	if s.prices != nil {
		s.prices.listed()
	}
	s.frontMu.Lock()
	f, n := s.refreshFront, s.refreshNostr
	s.frontMu.Unlock()
	if f != nil {
		f.Refresh()
	}
	if n != nil {
		n.Refresh()
	}
}

// close closes what open opened, the ledger last.
func (s *vendServer) close() {
	for _, c := range s.closers {
		c()
	}
	if s.l != nil {
		s.l.Close()
	}
}

// runStdio serves one MCP client on stdin/stdout until it leaves or ctx
// ends, with the upstreams and payments running meanwhile.
func (s *vendServer) runStdio(ctx context.Context) error {
	adminLn, err := s.bindAdmin()
	if err != nil {
		return err
	}
	back, stopBack, backErr := s.runBackground(ctx)
	g, gctx := errgroup.WithContext(back)
	s.runAdmin(g, gctx, adminLn)
	g.Go(func() error {
		// A tools/list before the upstreams listed theirs would be empty.
		awaitUpstreams(gctx, s.ups, 30*time.Second)
		if s.prices.stopping() {
			return errStopped // the prices' error stops serve
		}
		err := s.front.ServeStdio(gctx, s.e.Stdin, s.e.Stdout)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return errStop(err) // the client left: stop everything
	})
	err = g.Wait()
	if errors.Is(err, errStopped) {
		err = nil
	}
	stopBack()
	return errors.Join(err, backErr())
}

// errStopped ends an errgroup without being an error (see errStop).
var errStopped = errors.New("stopped")

// errStop is err, or errStopped when err is nil.
func errStop(err error) error {
	if err == nil {
		return errStopped
	}
	return err
}

// runBackground starts what runs behind the fronts until they have
// stopped: the upstreams, the payment watchers (Vendor.Run), the reload
// on SIGHUP and the pruning of stored replies and results. It returns
// the context the fronts run with (ctx, ended early if a background part
// fails), stop to end the background parts once the fronts are done, and
// wait, which returns their error after stop.
func (s *vendServer) runBackground(ctx context.Context) (fronts context.Context, stop func(), wait func() error) {
	fronts, stopFronts := context.WithCancel(ctx)
	// The background outlives ctx: in-flight calls finish while the
	// fronts drain, and need the upstreams and payment watchers for that.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var g errgroup.Group
	part := func(name string, run func(context.Context) error) {
		g.Go(func() error {
			if err := run(bctx); err != nil && bctx.Err() == nil {
				stopFronts()
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	part("upstreams", s.ups.Run)
	g.Go(func() error {
		// Not gated on bctx like the other parts: a price naming nothing
		// stops the fronts before they start, and serve may end bctx
		// before this returns; the error must still be serve's.
		if err := s.prices.Run(bctx); err != nil {
			stopFronts()
			return fmt.Errorf("prices: %w", err)
		}
		return nil
	})
	part("payments", s.v.Run)
	if r := s.reconciler; r != nil {
		part("reconcile", func(ctx context.Context) error {
			// After Recover has finished the previous run's calls: a
			// repair then never races the start's own catching up.
			// Sharing the ledger, on the instance holding the work lease
			// only (see vend.SharedConfig).
			return s.v.WhileLeading(ctx, func(ctx context.Context) error {
				select {
				case <-s.v.Recovered():
				case <-ctx.Done():
					return nil
				}
				if !backendsCaughtUp(ctx, s.backends, caughtUpWait) {
					if ctx.Err() != nil {
						return nil
					}
					s.log.Warn("reconcile: a payment backend has not caught up yet; reconciling anyway", "waited", caughtUpWait)
				}
				return r.Run(ctx)
			})
		})
	}
	endFreedGrants(s.v, s.log) // the prices may have changed while capvend was stopped
	var reload sync.WaitGroup
	if s.cfg.path != "" {
		reloaded := func(next *Config) { pricesReloaded(bctx, s.l, s.instance, next, s.log) }
		reloadOnHUP(bctx, &reload, s.cfg, s.e.Getenv, checkedVendor{s.v, s.prices}, s.refresh, reloaded, s.log)
	}
	if r := s.cfg.Ledger.ResultsRetention; r > 0 {
		// On the instance holding the work lease only, when several
		// share a PostgreSQL ledger (one pruner is enough).
		part("result pruning", func(ctx context.Context) error {
			return s.v.WhileLeading(ctx, func(ctx context.Context) error {
				pruneResults(ctx, s.l, r, s.log)
				return nil
			})
		})
	}
	if s.nostr != nil {
		part("reply pruning", func(ctx context.Context) error {
			pruneReplies(ctx, s.l, s.cfg.Nostr.Window, s.claims() != nil, s.log)
			return nil
		})
	}
	stop = func() { cancel(); stopFronts() }
	wait = func() error {
		err := g.Wait()
		reload.Wait()
		return err
	}
	return fronts, stop, wait
}

// run serves the fronts (MCP HTTP, Nostr) and the admin listener until
// ctx ends or one fails, then stops them in order: the fronts stop
// accepting and drain (http.shutdown_grace, nostr.shutdown_grace), then
// the payment watchers and the upstreams stop; the ledger is closed last
// (by close).
func (s *vendServer) run(ctx context.Context) error {
	adminLn, err := s.bindAdmin()
	if err != nil {
		return err
	}
	var ln net.Listener
	if s.cfg.HTTP.Listen != "" {
		if ln, err = net.Listen("tcp", s.cfg.HTTP.Listen); err != nil {
			if adminLn != nil {
				adminLn.Close()
			}
			return fmt.Errorf("http.listen %s: %w", s.cfg.HTTP.Listen, err)
		}
	}
	fctx, stopBack, backErr := s.runBackground(ctx)
	g, gctx := errgroup.WithContext(fctx)
	s.runAdmin(g, gctx, adminLn)
	if s.nostr != nil {
		g.Go(func() error {
			// Requests replayed from relays at start would find no tool.
			awaitUpstreams(gctx, s.ups, 30*time.Second)
			if s.prices.stopping() {
				return nil // the prices' error stops serve
			}
			// It drains its requests in flight (nostr.shutdown_grace)
			// after gctx ends; it fails only at start, joining the
			// instances sharing a PostgreSQL ledger.
			return s.nostr.Run(gctx)
		})
		g.Go(func() error { s.sayServingNostr(gctx); return nil })
	}
	if ln != nil {
		g.Go(func() error { return s.serveHTTP(gctx, ln) })
	}
	err = g.Wait()
	stopBack()
	return errors.Join(err, backErr())
}

func describeBackends(bs []vend.PaymentBackend) string {
	if len(bs) == 0 {
		return "no payment backend: free tools only"
	}
	s := "payments:"
	for _, b := range bs {
		s += " " + string(b.Name())
		if h, ok := b.(vend.HoldSettler); ok && h.CanHold() {
			s += " (hold invoices)"
		}
	}
	return s
}

// caughtUpWait bounds how long the first reconciliation waits for the
// payment backends to catch up (an unreachable mint must not hold it off).
const caughtUpWait = 30 * time.Second

// backendsCaughtUp waits until every backend that catches up at start
// (billing/cashu: quotes paid and lost quotes minted while capvend was
// down) has, at most limit: a reconciliation before then reports what
// the backend is about to book as differences. It reports whether all
// did.
func backendsCaughtUp(ctx context.Context, backends []vend.PaymentBackend, limit time.Duration) bool {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for _, b := range backends {
		c, ok := b.(interface{ CaughtUp() <-chan struct{} })
		if !ok {
			continue
		}
		select {
		case <-c.CaughtUp():
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}
