package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/vend"
)

// sayServingNostr prints "serving ContextVM" once the Nostr front's
// subscription is ready: every relay sent the end of its stored events or
// failed (each failed relay is named), and at least one is subscribed. A
// request published after the line reaches it.
func (s *vendServer) sayServingNostr(ctx context.Context) {
	select {
	case <-s.nostr.Settled():
	case <-ctx.Done():
		return
	}
	for _, st := range s.nostr.RelayStates() {
		if !st.Subscribed {
			fmt.Fprintf(s.e.Stderr, "capvend: nostr relay %s: not subscribed: %s (trying again every 5 s)\n", st.URL, st.Err)
		}
	}
	select {
	case <-s.nostr.Up():
	case <-ctx.Done():
		return
	}
	up := 0
	for _, st := range s.nostr.RelayStates() {
		if st.Subscribed {
			up++
		}
	}
	fmt.Fprintf(s.e.Stderr, "capvend: serving ContextVM as %s on %d of %d relay(s) (%s)\n", s.nostr.PublicKey(), up, len(s.nostr.RelayStates()), describeBackends(s.backends))
}

// serveHTTP serves the MCP front on ln until ctx ends, then stops
// accepting and lets in-flight calls finish (http.shutdown_grace). It
// answers only once the upstreams listed their tools (or failed, or 30 s
// passed): a tools/list before would be empty, and a call of a tool not
// listed yet refused. Connections made meanwhile wait in the listen backlog.
func (s *vendServer) serveHTTP(ctx context.Context, ln net.Listener) error {
	awaitUpstreams(ctx, s.ups, 30*time.Second)
	if ctx.Err() != nil || s.prices.stopping() {
		ln.Close()
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", s.front.Handler())
	mux.Handle(mcpfront.DiscoveryPath, s.front.Discovery(discoveryInfo(s.cfg, s.nostr)))
	mux.Handle(mcpfront.PayPagePath, s.front.PayPage())
	srv := httpServer(s.cfg.HTTP, mux)
	fmt.Fprintf(s.e.Stderr, "capvend: serving MCP at http://%s/mcp (%s)\n", ln.Addr(), describeBackends(s.backends))
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(newLimitListener(ln, s.cfg.HTTP.MaxConnections)) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	shutdown, stop := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.HTTP.ShutdownGrace)
	defer stop()
	s.front.CloseStreams() // long-lived listen streams would hold Shutdown
	// Stop accepting; in-flight calls finish, or their connections are
	// closed after the grace (their handlers see their requests end).
	if srv.Shutdown(shutdown) != nil {
		srv.Close()
	}
	<-serveErr
	return nil
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
		SessionIdle: cfg.HTTP.SessionIdle, MaxSessions: cfg.HTTP.MaxSessions, MaxSessionsPerSource: cfg.HTTP.MaxSessionsPerSource,
		TrustedProxies: proxies, ClientIDHeader: cfg.HTTP.ClientIDHeader,
		AllowedOrigins: cfg.HTTP.AllowedOrigins, WriteTimeout: cfg.HTTP.WriteTimeout,
		LegacyGatingCode: cfg.Payments.LegacyGatingCode, HTTP402: cfg.Payments.HTTP402, HTTP402Schemes: cfg.Payments.HTTP402Schemes,
		PayBaseURL: cfg.HTTP.payBaseURL(),
	}
	if cfg.Cashu.AcceptTokens {
		fc.CashuMints = cfg.Cashu.Mints // X-Cashu's payment request names them
	}
	if cfg.HTTP.AuthTokenFile != "" {
		if fc.BearerToken, err = readTokenFile("http.auth_token_file", cfg.HTTP.AuthTokenFile); err != nil {
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

// The Vendor gives known payers their reserve of request slots and their
// own subscription (see ctxvm's PayerKnower and PayerLister).
var (
	_ ctxvm.PayerKnower = (*vend.Vendor)(nil)
	_ ctxvm.PayerLister = (*vend.Vendor)(nil)
)

// nostrFront returns the ContextVM front of cfg.Nostr, selling v's tools.
// With claims (a shared ledger), each request is served by the instance
// that claims it first.
func nostrFront(cfg *Config, v *vend.Vendor, cat ctxvm.Catalog, replies ctxvm.ReplyStore, claims *instanceClaims, backends []vend.PaymentBackend, log *slog.Logger) (*ctxvm.Server, error) {
	sk, err := ctxvm.LoadSecretKey(cfg.Nostr.NsecFile)
	if err != nil {
		return nil, fmt.Errorf("nostr.nsec_file: %w", err)
	}
	var pmis []string
	if len(backends) > 0 {
		pmis = append(pmis, vend.PMILightning) // every backend takes bolt11
	}
	if len(cfg.Cashu.Mints) > 0 && cfg.Cashu.AcceptTokens {
		// A token in _meta, and in a CEP-8 direct_payment tag.
		pmis = append(pmis, vend.PMICashu, ctxvm.PMICashuDirect)
	}
	return ctxvm.New(ctxvm.Config{
		Vendor: v, Catalog: cat, Replies: replies, SecretKey: sk, Relays: cfg.Nostr.Relays,
		Name: cfg.Server.Name, Version: buildVersion(), About: cfg.Server.About, Website: cfg.Server.Website, Picture: cfg.Server.Picture,
		PMIs: pmis, Encryption: ctxvm.Encryption(cfg.Nostr.Encryption), Window: cfg.Nostr.Window, Logger: log,
		Announce: cfg.Nostr.Announce, Profile: true, Allow: hexPubkeys(cfg.Nostr.Allow), Deny: hexPubkeys(cfg.Nostr.Deny),
		PowDifficulty: cfg.Nostr.PowDifficulty, MaxRequestBytes: cfg.Nostr.MaxRequestBytes, Claims: claims.claimer(), Instance: claims.id(), Members: claims.memberSet(),
		SeenFor: cfg.Ledger.ClaimTakeover, ShardSample: cfg.Nostr.ShardSample, ShutdownGrace: cfg.Nostr.ShutdownGrace,
	})
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
