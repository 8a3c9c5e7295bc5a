package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/capvend/capvend/adapters/admin"
	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/internal/replica"
	"github.com/capvend/capvend/pricing"
)

var (
	upstreamName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	toolPrefix   = regexp.MustCompile(`^[A-Za-z0-9_.-]{0,32}$`)
	hex64        = regexp.MustCompile(`^[0-9a-fA-F]{64,}$`)
	headerName   = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
)

// Validate checks the configuration and names the first bad field with what
// is allowed there.
func (c *Config) Validate() error {
	var p problems
	c.validateServer(&p)
	c.validateHTTP(&p)
	c.validateNostr(&p)
	c.validateLND(&p)
	c.validatePayments(&p)
	c.validateNWC(&p)
	p.errs = append(p.errs, c.Admin.validate(), c.Log.validate())
	if c.validateUpstreams(&p) && len(c.backendNames()) == 0 {
		p.bad("lnd.host", "a tool (prompt, resource) has a price but no payment backend is configured: set lnd.host, nwc.uri_file or cashu.mints")
	}
	return errors.Join(p.errs...)
}

// The bounds of ledger.results_retention (other than 0): a paid call's
// client retries for its answer within minutes, a Nostr request is
// delivered again within twice nostr.window; 100 years is forever.
const (
	minResultsRetention = time.Hour
	maxResultsRetention = 100 * 365 * 24 * time.Hour
)

// problems collects what Validate finds wrong, one error per field.
type problems struct{ errs []error }

// bad records that field is wrong, saying how.
func (p *problems) bad(field, format string, a ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
}

// validateServer checks the ledger and server sections.
func (c *Config) validateServer(p *problems) {
	switch c.Ledger.Driver {
	case "", "sqlite":
		if c.Ledger.Path == "" {
			p.bad("ledger.path", "required: the SQLite ledger file")
		}
	case "postgres":
		if c.Ledger.DSNFile == "" {
			p.bad("ledger.dsn_file", "required with driver postgres: a file holding the PostgreSQL DSN")
		}
	default:
		p.bad("ledger.driver", "%q is not a ledger driver: sqlite (the default) or postgres", c.Ledger.Driver)
	}
	if c.Ledger.LeaseTTL < 3*time.Second || c.Ledger.LeaseTTL > 10*time.Minute {
		p.bad("ledger.lease_ttl", "%s is outside 3s .. 10m", c.Ledger.LeaseTTL)
	}
	if c.Ledger.ClaimTakeover <= c.Ledger.LeaseTTL || c.Ledger.ClaimTakeover > time.Hour {
		p.bad("ledger.claim_takeover", "%s must be longer than ledger.lease_ttl (%s) and at most 1h", c.Ledger.ClaimTakeover, c.Ledger.LeaseTTL)
	}
	if r := c.Ledger.ResultsRetention; r != 0 && (r < minResultsRetention || r < 2*c.Nostr.Window || r > maxResultsRetention) {
		p.bad("ledger.results_retention", "%s: want 0 (keep forever) or from %s (and twice nostr.window, %s) to %s",
			r, minResultsRetention, 2*c.Nostr.Window, maxResultsRetention)
	}
	if c.Ledger.Replica != "" {
		u, err := replica.ParseURL(c.Ledger.Replica)
		switch {
		case err != nil:
			p.bad("ledger.replica", "%v", err)
		case c.Ledger.Driver == "postgres":
			p.bad("ledger.replica", "Litestream replicates an SQLite ledger: back up PostgreSQL with its own tools (see docs/OPERATING.md, Backups)")
		case u.Scheme == "file" && c.Ledger.ReplicaCredentialsFile != "":
			p.bad("ledger.replica_credentials_file", "a file:// replica takes no credentials")
		}
	} else if c.Ledger.ReplicaCredentialsFile != "" {
		p.bad("ledger.replica_credentials_file", "set without ledger.replica")
	}
	if c.Server.Name == "" {
		p.bad("server.name", "required: a short name clients see")
	}
	if c.Server.Website != "" {
		if u, err := url.Parse(c.Server.Website); err != nil || (u.Scheme != "https" && u.Scheme != "http") {
			p.bad("server.website", "%q is not an http(s) URL", c.Server.Website)
		}
	}
}

// validateHTTP checks the http section.
func (c *Config) validateHTTP(p *problems) {
	if c.HTTP.Listen != "" {
		if _, _, err := net.SplitHostPort(c.HTTP.Listen); err != nil {
			p.bad("http.listen", "%q is not host:port (e.g. 127.0.0.1:8402), or leave it empty to disable the HTTP front", c.HTTP.Listen)
		}
	}
	if c.HTTP.MaxRequestBytes < 1024 || c.HTTP.MaxRequestBytes > 64<<20 {
		p.bad("http.max_request_bytes", "%d is outside 1024 .. 67108864", c.HTTP.MaxRequestBytes)
	}
	if c.HTTP.SessionIdle < 10*time.Second || c.HTTP.SessionIdle > 24*time.Hour {
		p.bad("http.session_idle", "%s is outside 10s .. 24h", c.HTTP.SessionIdle)
	}
	if c.HTTP.MaxSessions < 1 || c.HTTP.MaxSessions > 1_000_000 {
		p.bad("http.max_sessions", "%d is outside 1 .. 1000000", c.HTTP.MaxSessions)
	}
	if c.HTTP.MaxSessionsPerSource < 1 || c.HTTP.MaxSessionsPerSource > 1_000_000 {
		p.bad("http.max_sessions_per_source", "%d is outside 1 .. 1000000", c.HTTP.MaxSessionsPerSource)
	}
	if c.HTTP.MaxConnections < 1 || c.HTTP.MaxConnections > 1_000_000 {
		p.bad("http.max_connections", "%d is outside 1 .. 1000000", c.HTTP.MaxConnections)
	}
	for _, d := range []struct {
		name      string
		v, lo, hi time.Duration
	}{
		{"http.read_timeout", c.HTTP.ReadTimeout, time.Second, 10 * time.Minute},
		{"http.write_timeout", c.HTTP.WriteTimeout, time.Second, 10 * time.Minute},
		{"http.idle_timeout", c.HTTP.IdleTimeout, time.Second, time.Hour},
		{"http.shutdown_grace", c.HTTP.ShutdownGrace, time.Second, 10 * time.Minute},
	} {
		if d.v < d.lo || d.v > d.hi {
			p.bad(d.name, "%s is outside %s .. %s", d.v, d.lo, d.hi)
		}
	}
	for i, o := range c.HTTP.AllowedOrigins {
		if err := mcpfront.CheckAllowedOrigin(o); err != nil {
			p.bad(fmt.Sprintf("http.allowed_origins[%d]", i), "%q is not an origin: write scheme://host[:port] (e.g. https://app.example.com, http://localhost:*), or *", o)
		}
	}
	if _, err := c.HTTP.Prefixes(); err != nil {
		p.errs = append(p.errs, err)
	}
	if h := c.HTTP.ClientIDHeader; h != "" {
		if len(c.HTTP.TrustedProxies) == 0 {
			p.bad("http.client_id_header", "needs http.trusted_proxies: only a trusted proxy may say who the client is, anyone could send %s", h)
		}
		if !headerName.MatchString(h) {
			p.bad("http.client_id_header", "%q is not a header name", h)
		}
	}
}

// validateNostr checks the nostr section.
func (c *Config) validateNostr(p *problems) {
	if c.Nostr.Shard && c.Ledger.Driver != "postgres" {
		p.bad("nostr.shard", "needs ledger.driver: postgres (several instances share a PostgreSQL ledger)")
	}
	if c.Nostr.ShardSample != 0 && (c.Nostr.ShardSample < 100*time.Millisecond || c.Nostr.ShardSample > 5*time.Second) {
		// Above 5 s a view would go stale (3 samples) after the member
		// lease's renewal is due (a third of its 30 s).
		p.bad("nostr.shard_sample", "%s is outside 100ms .. 5s", c.Nostr.ShardSample)
	}
	if len(c.Nostr.Relays) > 0 {
		if c.Nostr.NsecFile == "" {
			p.bad("nostr.nsec_file", "required when nostr.relays is set: a file holding the server's secret key")
		}
		for i, r := range c.Nostr.Relays {
			if u, err := url.Parse(r); err != nil || (u.Scheme != "wss" && u.Scheme != "ws") || u.Host == "" {
				p.bad(fmt.Sprintf("nostr.relays[%d]", i), "%q is not a ws:// or wss:// relay URL", r)
			}
		}
	}
	if base := filepath.Base(c.Nostr.NsecFile); strings.HasPrefix(base, "nsec1") || hex64.MatchString(base) {
		p.bad("nostr.nsec_file", "must be the path of a file holding the key, not the key itself")
	}
	if c.Nostr.Window < 10*time.Second || c.Nostr.Window > time.Hour {
		p.bad("nostr.window", "%s is outside 10s .. 1h", c.Nostr.Window)
	}
	if c.Nostr.ShutdownGrace < time.Second || c.Nostr.ShutdownGrace > 10*time.Minute {
		p.bad("nostr.shutdown_grace", "%s is outside 1s .. 10m", c.Nostr.ShutdownGrace)
	}
	if c.Nostr.MaxRequestBytes != 0 && (c.Nostr.MaxRequestBytes < 1024 || c.Nostr.MaxRequestBytes > 64<<20) {
		p.bad("nostr.max_request_bytes", "%d is outside 1024 .. 67108864", c.Nostr.MaxRequestBytes)
	}
	if c.Nostr.PowDifficulty < 0 || c.Nostr.PowDifficulty > 64 {
		p.bad("nostr.pow_difficulty", "%d is outside 0 (off) .. 64 leading zero bits", c.Nostr.PowDifficulty)
	}
	switch c.Nostr.Encryption {
	case "optional", "required", "disabled":
	default:
		p.bad("nostr.encryption", "%q is not one of optional, required, disabled", c.Nostr.Encryption)
	}
	for _, l := range []struct {
		name string
		keys []string
	}{{"nostr.allow", c.Nostr.Allow}, {"nostr.deny", c.Nostr.Deny}} {
		for i, k := range l.keys {
			if _, err := ctxvm.ParsePublicKey(k); err != nil {
				p.bad(fmt.Sprintf("%s[%d]", l.name, i), "%q is not a pubkey: write an npub1… or 64 hex characters", k)
			}
		}
	}
}

// validateLND checks the lnd section.
func (c *Config) validateLND(p *problems) {
	if c.LND.Host != "" {
		if _, _, err := net.SplitHostPort(c.LND.Host); err != nil {
			p.bad("lnd.host", "%q is not host:port (LND's gRPC address, e.g. 127.0.0.1:10009)", c.LND.Host)
		}
		if c.LND.TLSCertFile == "" {
			p.bad("lnd.tls_cert_file", "required when lnd.host is set: the path of LND's tls.cert")
		}
		if c.LND.MaxHoldInvoices < 1 {
			p.bad("lnd.max_hold_invoices", "must be at least 1, got %d (set hold_invoices: false for plain invoices only)", c.LND.MaxHoldInvoices)
		}
		if c.LND.MacaroonFile == "" {
			p.bad("lnd.macaroon_file", "required when lnd.host is set: the path of invoice.macaroon (or a macaroon with invoices:read and invoices:write)")
		}
	}
	if strings.HasPrefix(filepath.Base(c.LND.TLSCertFile), "-----BEGIN") {
		p.bad("lnd.tls_cert_file", "must be the path of the certificate file, not the certificate itself")
	}
	if hex64.MatchString(filepath.Base(c.LND.MacaroonFile)) {
		p.bad("lnd.macaroon_file", "must be the path of the macaroon file, not the macaroon itself")
	}
}

// validatePayments checks the cashu, payments, credit, limits, pricing
// and reconcile sections.
func (c *Config) validatePayments(p *problems) {
	for i, m := range c.Cashu.Mints {
		if u, err := url.Parse(m); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			p.bad(fmt.Sprintf("cashu.mints[%d]", i), "%q is not an http(s) mint URL", m)
		}
	}
	if len(c.Cashu.Mints) > 0 && c.Cashu.WalletDir == "" {
		p.bad("cashu.wallet_dir", "required when cashu.mints is set: where capvend keeps its ecash")
	}
	if c.Reconcile.Interval != 0 && c.Reconcile.Interval < 10*time.Second {
		p.bad("reconcile.interval", "%s is too short: at least 10s (each run lists LND's new invoices and asks the mints), or 0 to turn it off", c.Reconcile.Interval)
	}
	if u := c.HTTP.PublicURL; u != "" {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "https" && pu.Scheme != "http") || pu.Host == "" {
			p.bad("http.public_url", "%q is not an http(s) URL", u)
		}
	}
	seen := map[string]bool{}
	for i, n := range c.Payments.HTTP402Schemes {
		switch n {
		case mcpfront.SchemeL402, mcpfront.SchemeMPP, mcpfront.SchemeX402, mcpfront.SchemeCashu:
		default:
			p.bad(fmt.Sprintf("payments.http_402_schemes[%d]", i), "%q is not one of l402, mpp, x402, cashu", n)
		}
		if seen[n] {
			p.bad(fmt.Sprintf("payments.http_402_schemes[%d]", i), "%q is listed twice", n)
		}
		seen[n] = true
	}
	if c.Payments.TTL < 30*time.Second || c.Payments.TTL > 24*time.Hour {
		p.bad("payments.ttl", "%s is outside 30s .. 24h", c.Payments.TTL)
	}
	if c.Credit.MaxTopUpSats < 0 || c.Credit.MaxTopUpSats > 100_000_000 {
		p.bad("credit.max_topup_sats", "%d is outside 0 (the default, 1,000,000) .. 100,000,000", c.Credit.MaxTopUpSats)
	}
	if c.Credit.ExpiresAfter < 0 || c.Credit.ExpiresAfter > 0 && c.Credit.ExpiresAfter < time.Minute {
		p.bad("credit.expires_after", "%s must be 0 (never) or at least 1m", c.Credit.ExpiresAfter)
	}
	if c.Limits.MaxUnpaidPerClient < 1 {
		p.bad("limits.max_unpaid_per_client", "must be at least 1, got %d", c.Limits.MaxUnpaidPerClient)
	}
	if c.Limits.MaxUnpaidTotal < c.Limits.MaxUnpaidPerClient {
		p.bad("limits.max_unpaid_total", "must be at least limits.max_unpaid_per_client (%d), got %d", c.Limits.MaxUnpaidPerClient, c.Limits.MaxUnpaidTotal)
	}
	if c.Limits.RequestsPerMinute < 1 {
		p.bad("limits.requests_per_minute", "must be at least 1, got %d", c.Limits.RequestsPerMinute)
	}
	if !pricing.Unpriced(c.Pricing.Unpriced).Valid() {
		p.bad("pricing.unpriced", "%q is not free (the default: an item without a price is sold free) or refuse (it is neither listed nor sold)", c.Pricing.Unpriced)
	}
}

// validateUpstreams checks the upstreams and their prices, and says
// whether anything has a price.
func (c *Config) validateUpstreams(p *problems) (priced bool) {
	seen := map[string]bool{}
	for i, u := range c.Upstreams {
		field := fmt.Sprintf("upstreams[%d]", i)
		if !upstreamName.MatchString(u.Name) {
			p.bad(field+".name", "%q must be 1-32 characters of a-z 0-9 _ - starting with a letter or digit", u.Name)
		} else if seen[u.Name] {
			p.bad(field+".name", "%q is used by another upstream", u.Name)
		} else if u.Name == "capvend" {
			p.bad(field+".name", "%q is reserved: capvend books its own top-ups under it", u.Name)
		}
		seen[u.Name] = true
		switch {
		case u.Command == "" && u.URL == "":
			p.bad(field, "set command (a stdio MCP server to start) or url (a Streamable HTTP MCP endpoint)")
		case u.Command != "" && u.URL != "":
			p.bad(field, "set command or url, not both")
		case u.URL != "":
			if pu, err := url.Parse(u.URL); err != nil || (pu.Scheme != "https" && pu.Scheme != "http") || pu.Host == "" {
				p.bad(field+".url", "%q is not an http(s) URL", u.URL)
			}
			if len(u.Args) > 0 || len(u.Env) > 0 || u.Cwd != "" {
				p.bad(field, "args, env and cwd only apply to a command")
			}
		}
		if !toolPrefix.MatchString(u.Prefix) {
			p.bad(field+".prefix", "%q must be at most 32 characters of A-Z a-z 0-9 _ . -", u.Prefix)
		}
		if u.Unpriced != "" && !pricing.Unpriced(u.Unpriced).Valid() {
			p.bad(field+".unpriced", "%q is not free or refuse (or leave it out for pricing.unpriced)", u.Unpriced)
		}
		if u.ClientPubkey && len(c.Nostr.Relays) == 0 {
			p.bad(field+".client_pubkey", "only Nostr clients have a pubkey to give: set nostr.relays, or leave it out")
		}
		errs, hasPrice := u.prices().Check(field)
		p.errs = append(p.errs, errs...)
		if hasPrice {
			priced = true
		}
	}
	return priced
}

// validate checks the admin section.
func (a AdminConfig) validate() error {
	switch {
	case a.Listen == "" && a.Pprof:
		return errors.New("admin.pprof: profiles are served on the admin listener: set admin.listen too")
	case a.Listen == "":
		return nil
	case !validHostPort(a.Listen):
		return fmt.Errorf("admin.listen: %q is not host:port (e.g. 127.0.0.1:9402), or leave it empty to disable the admin listener", a.Listen)
	case a.TokenFile == "" && !admin.Loopback(a.Listen):
		return fmt.Errorf("admin.listen: %s is not a loopback address: set admin.token_file (a bearer token every admin request must carry), or listen on 127.0.0.1", a.Listen)
	}
	return nil
}

func validHostPort(addr string) bool {
	_, _, err := net.SplitHostPort(addr)
	return err == nil
}

// validate checks the log section.
func (l LogConfig) validate() error {
	var errs []error
	if l.Format != "text" && l.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format: %q is not text or json", l.Format))
	}
	if _, ok := logLevels[l.Level]; !ok {
		errs = append(errs, fmt.Errorf("log.level: %q is not one of debug, info, warn, error", l.Level))
	}
	return errors.Join(errs...)
}
