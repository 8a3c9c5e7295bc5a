package cli

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/reconcile"
)

// Config is capvend.yaml. Paths are resolved against the directory of the
// configuration file. Secrets (macaroons, Nostr keys, mint wallet keys) are
// only ever named by file path: the values are read when used and never
// logged.
type Config struct {
	Ledger    LedgerConfig     `yaml:"ledger"`
	Server    ServerConfig     `yaml:"server"`
	HTTP      HTTPConfig       `yaml:"http"`
	Nostr     NostrConfig      `yaml:"nostr"`
	LND       LNDConfig        `yaml:"lnd"`
	Cashu     CashuConfig      `yaml:"cashu"`
	NWC       NWCConfig        `yaml:"nwc"`
	Payments  PaymentsConfig   `yaml:"payments"`
	Limits    LimitsConfig     `yaml:"limits"`
	Credit    CreditConfig     `yaml:"credit"`
	Pricing   PricingConfig    `yaml:"pricing"`
	Reconcile ReconcileConfig  `yaml:"reconcile"`
	Upstreams []UpstreamConfig `yaml:"upstreams"`
	Admin     AdminConfig      `yaml:"admin"`
	Log       LogConfig        `yaml:"log"`

	path string // the file it was read from, "" for defaults
}

// AdminConfig is the operator's listener: /metrics, /healthz, /readyz.
type AdminConfig struct {
	// Listen is its host:port; empty (the default) disables it. Off
	// loopback it needs TokenFile.
	Listen string `yaml:"listen"`
	// TokenFile names a file holding the bearer token every admin request
	// must carry (required when Listen is not a loopback address).
	TokenFile string `yaml:"token_file"`
	// Pprof serves Go's profiles (net/http/pprof) under /debug/pprof/ on
	// the admin listener, behind its token: off by default.
	Pprof bool `yaml:"pprof"`
}

// LogConfig is how capvend logs (to standard error).
type LogConfig struct {
	Format string `yaml:"format"` // text (default) or json
	Level  string `yaml:"level"`  // debug, info (default), warn, error
}

// LedgerConfig locates the ledger: an SQLite file (the default), or a
// PostgreSQL database whose DSN is in a secret file.
type LedgerConfig struct {
	// Driver is the engine: sqlite (default) or postgres.
	Driver string `yaml:"driver"`
	// Path is the SQLite ledger file (driver sqlite).
	Path string `yaml:"path"`
	// DSNFile names a file holding the PostgreSQL DSN (driver postgres):
	// a secret (it may hold a password), read when the ledger opens,
	// never logged.
	DSNFile string `yaml:"dsn_file"`
	// LeaseTTL (driver postgres) is how long an instance's leases last
	// unrenewed (renewed every third of it): a dead instance's calls and
	// work are taken over within LeaseTTL plus a third of it.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// ClaimTakeover (driver postgres) is how long a Nostr request claimed
	// by an instance that died stands before another instance serves it
	// when the client sends it again; also how long an instance drops
	// copies of a request it let in. Longer than LeaseTTL.
	ClaimTakeover time.Duration `yaml:"claim_takeover"`
	// ResultsRetention is how long stored answers (the results of calls,
	// the replies to Nostr requests) are kept whole; then serve replaces
	// each by its SHA-256, size and error flag, and a replay of that
	// request gets an error saying its answer expired. 0 keeps them
	// forever. Money records are never pruned. Default 30 days
	// (ledger.DefaultResultsRetention).
	ResultsRetention time.Duration `yaml:"results_retention"`
	// Replica is where Litestream, run beside serve, replicates the
	// SQLite ledger (file:///PATH or s3://BUCKET/PATH): what 'capvend
	// ledger restore' restores from and 'capvend doctor' measures the
	// lag of. Empty: no continuous backup.
	Replica string `yaml:"replica"`
	// ReplicaCredentialsFile names a file of KEY=VALUE lines with the S3
	// credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY): a secret,
	// refused while group or others may read it, passed to litestream in
	// its environment only, never logged. Not for a file:// replica.
	ReplicaCredentialsFile string `yaml:"replica_credentials_file"`
	// LitestreamBin is the litestream program that 'ledger restore' and
	// 'doctor' run (default: litestream, found in PATH).
	LitestreamBin string `yaml:"litestream"`
}

// ServerConfig is how capvend presents itself to clients.
type ServerConfig struct {
	// Name is the server's name in MCP's initialize answer, the Nostr
	// announcements and the dashboard.
	Name string `yaml:"name"`
	// About is a one-line description, announced with Name.
	About string `yaml:"about"`
	// Website is a URL shown to clients and in the announcements.
	Website string `yaml:"website"`
	// Picture is the URL of an image (the server's profile picture on
	// Nostr).
	Picture string `yaml:"picture"`
}

// HTTPConfig is the MCP Streamable HTTP front.
type HTTPConfig struct {
	Listen string `yaml:"listen"` // host:port; empty disables the front
	// PublicURL is the listener's URL as buyers reach it (e.g.
	// "https://shop.example"): pay pages (GET /pay/{token}) are linked
	// under it. Empty: http://<listen> when listen names a host, else no
	// pay page links.
	PublicURL string `yaml:"public_url"`
	// MaxRequestBytes bounds a request body; a larger one gets 413.
	MaxRequestBytes int64 `yaml:"max_request_bytes"`
	// SessionIdle ends an MCP session without a request in flight for
	// this long; MaxSessions bounds the live sessions (a new one evicts
	// the longest idle of the client holding the most, or gets 503 when
	// all are busy); MaxSessionsPerSource bounds one client's (an
	// address, or a trusted proxy's client id): its next evicts its own
	// longest idle, or gets 429 when all of its are busy.
	SessionIdle          time.Duration `yaml:"session_idle"`
	MaxSessions          int           `yaml:"max_sessions"`
	MaxSessionsPerSource int           `yaml:"max_sessions_per_source"`
	// MaxConnections bounds the open TCP connections; one more is
	// answered 503 and closed.
	MaxConnections int `yaml:"max_connections"`
	// ReadTimeout bounds reading a request (headers and body);
	// WriteTimeout each write of a response (a stream waiting for a
	// payment may stay quiet longer); IdleTimeout a keep-alive
	// connection waiting for its next request.
	ReadTimeout  time.Duration `yaml:"read_timeout"`
	WriteTimeout time.Duration `yaml:"write_timeout"`
	IdleTimeout  time.Duration `yaml:"idle_timeout"`
	// ShutdownGrace is how long a stop lets HTTP calls in flight finish
	// (a call waiting for its payment among them) before it closes their
	// connections.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// AllowedOrigins are the browser origins served (scheme://host[:port],
	// :* for any port, or *); absent: loopback origins only.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AuthTokenFile, if set, names a file holding a bearer token every
	// request to /mcp must carry. A secret: mode 0600, never logged.
	AuthTokenFile string `yaml:"auth_token_file"`
	// TrustedProxies (CIDRs or addresses) are the reverse proxies whose
	// X-Forwarded-For (and ClientIDHeader) are believed.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// ClientIDHeader names a header a trusted proxy sets to the client's
	// identity: limits then count by it. Only with TrustedProxies.
	ClientIDHeader string `yaml:"client_id_header"`
}

// Prefixes returns the trusted proxies as prefixes (an address is a
// single-address prefix). It fails, naming the entry, on one Validate
// refuses.
func (h HTTPConfig) Prefixes() ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(h.TrustedProxies))
	for i, s := range h.TrustedProxies {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("http.trusted_proxies[%d]: %q is not an address or CIDR (e.g. 10.0.0.1 or 10.0.0.0/8)", i, s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// NostrConfig is the ContextVM / DVMCP front.
type NostrConfig struct {
	NsecFile string   `yaml:"nsec_file"` // file holding the server's nsec or hex key
	Relays   []string `yaml:"relays"`    // empty disables the front
	// Encryption is how requests may travel: optional (answer encrypted
	// when asked encrypted, plaintext when asked plaintext), required
	// (plaintext requests refused) or disabled. Whatever the setting,
	// a secret (a token, change, a credit key) never goes out in a
	// plaintext event: such a request is refused (docs/ARCHITECTURE.md,
	// Ways to pay).
	Encryption string `yaml:"encryption"`
	// Announce publishes the server's announcements (ContextVM, DVMCP,
	// NIP-89) on the relays; `capvend unannounce` withdraws them.
	Announce bool `yaml:"announce"`
	// Allow, when not empty, is the only clients served; Deny is clients
	// never served (it wins). Pubkeys as npub1… or 64 hex characters.
	Allow []string `yaml:"allow"`
	Deny  []string `yaml:"deny"`
	// Window is how far a request's created_at may be from now (either
	// way); requests outside it are dropped.
	Window time.Duration `yaml:"window"`
	// PowDifficulty is the NIP-13 proof of work (leading zero bits,
	// committed in a nonce tag) a request needs to get a free call or an
	// unpaid quote; 0: none. Requests paying with a Cashu token need none.
	PowDifficulty int `yaml:"pow_difficulty"`
	// MaxRequestBytes bounds a request that comes as CEP-22 frames
	// (oversized transfer: larger than one event); 0: 1 MiB, as
	// http.max_request_bytes.
	MaxRequestBytes int `yaml:"max_request_bytes"`
	// ShutdownGrace is how long a stop lets Nostr requests in flight
	// finish (a call waiting for its payment among them) before it
	// cancels them.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// Shard spreads the requests over the instances sharing the key and a
	// PostgreSQL ledger by their event ids, without a ledger write per
	// request (see docs/OPERATING.md, "Several instances on one ledger"); off:
	// every instance claims each request in the ledger, the first wins.
	Shard bool `yaml:"shard"`
	// ShardSample is how often a sharding instance reads the member set;
	// the times a membership change takes are multiples of it (see
	// docs/OPERATING.md). 0: 1s.
	ShardSample time.Duration `yaml:"shard_sample"`
}

// LNDConfig is the LND payment backend.
type LNDConfig struct {
	Host string `yaml:"host"` // gRPC host:port; empty disables the backend
	// TLSCertFile is LND's TLS certificate (tls.cert).
	TLSCertFile string `yaml:"tls_cert_file"`
	// MacaroonFile is a macaroon with invoice permissions (a 0600 copy of
	// LND's invoice.macaroon): a secret, never logged.
	MacaroonFile string `yaml:"macaroon_file"`
	// HoldInvoices settles a client's payment only once its tool
	// succeeded; when it fails the payment returns to the client by
	// itself. Off: plain invoices, a failed call's price owed back.
	HoldInvoices bool `yaml:"hold_invoices"`
	// MaxHoldInvoices bounds the open hold invoices (each watched by one
	// SubscribeSingleInvoice stream); beyond it quotes get plain invoices.
	MaxHoldInvoices int `yaml:"max_hold_invoices"`
}

// CashuConfig is the Cashu payment backend.
type CashuConfig struct {
	Mints []string `yaml:"mints"` // trusted mints; the first issues mint quotes. Empty disables.
	// WalletDir is capvend's Cashu wallet (its seed and proofs: money;
	// back up the seed with 'capvend cashu seed').
	WalletDir string `yaml:"wallet_dir"`
	// AcceptTokens takes Cashu tokens of the trusted mints as payment
	// (X-Cashu, _meta["capvend/cashu"], CEP-8), swapped at once.
	AcceptTokens bool `yaml:"accept_tokens"`
	// MintQuotes lets a call's Lightning invoice come from a mint quote of
	// the first mint (the seller then holds ecash, not channel balance).
	MintQuotes bool `yaml:"mint_quotes"`
}

// PaymentsConfig tunes payment requests.
type PaymentsConfig struct {
	TTL time.Duration `yaml:"ttl"` // how long a payment request stays payable
	// Prefer orders the backends that issue Lightning invoices (lnd,
	// nwc, nwc:<name>, cashu): a call's invoice comes from the first
	// available one, unless its client names another (_meta
	// "capvend/invoice_from"); an NWC wallet out of reach is passed
	// over. Unnamed backends follow in the default order: lnd, the NWC
	// connections, cashu.
	Prefer []string `yaml:"prefer"`
	// LegacyGatingCode (deprecated, for one release) restores explicit
	// gating as -32042/-32043 errors on MCP HTTP and stdio, only on
	// request, without payment tokens (mcpfront.Config.LegacyGatingCode).
	LegacyGatingCode bool `yaml:"legacy_gating_code"`
	// HTTP402 answers every unpaid priced tools/call over MCP HTTP with
	// HTTP 402 and its challenges (L402, and X-Cashu when Cashu tokens are
	// accepted), not only requests whose Accept names L402 or cashu
	// (mcpfront.Config.HTTP402): for HTTP payment clients that send no
	// such Accept.
	HTTP402 bool `yaml:"http_402"`
	// HTTP402Schemes are the challenges of an HTTP 402, in order
	// (mcpfront.Config.HTTP402Schemes): l402, mpp, x402, cashu. Empty:
	// l402, x402, cashu. Clients that read one WWW-Authenticate take the
	// first: list mpp first for @getalby/lightning-tools' fetchWithMpp.
	HTTP402Schemes []string `yaml:"http_402_schemes"`
}

// CreditConfig is prepaid credit (docs/PAYING.md, Prepaid credit): the
// capvend_topup tool and credit tokens.
type CreditConfig struct {
	// Enabled offers the capvend_topup tool: clients buy credit (paid
	// like any call) and pay priced calls from their balance at once.
	Enabled bool `yaml:"enabled"`
	// MaxTopUpSats bounds one top-up (default 1,000,000).
	MaxTopUpSats int64 `yaml:"max_topup_sats"`
	// ExpiresAfter expires a balance that long after its last top-up
	// (booked to income, with the reason in the journal); 0: never.
	ExpiresAfter time.Duration `yaml:"expires_after"`
}

// PricingConfig is what is sold beside the prices of the upstreams'
// sections.
type PricingConfig struct {
	// Unpriced is what a tool, prompt or resource without a price of its
	// own (not named under its upstream's tools:, prompts:, resources:)
	// is: "free" (the default) sells it free; "refuse" neither lists nor
	// sells it (a call is answered as an unknown tool, a get or read as
	// invalid params): only what the configuration names is offered, an
	// entry without a price ({}) free. An upstream's own unpriced wins.
	// Reloads with the prices (SIGHUP).
	Unpriced string `yaml:"unpriced"`
}

// ReconcileConfig is the continuous reconciliation of the ledger with LND
// and the Cashu wallet and mints (package reconcile).
type ReconcileConfig struct {
	// Interval is how often serve reconciles (and repairs what is
	// safe); 0 turns it off.
	Interval time.Duration `yaml:"interval"`
}

// LimitsConfig bounds what one client, and everyone, may hold open. A
// client is an HTTP request's source address (every session from it), a
// Nostr pubkey, or stdio: see docs/OPERATING.md, Limits.
type LimitsConfig struct {
	// MaxUnpaidPerClient bounds one client's open unpaid payment
	// requests: one counts until it is paid, canceled or expires.
	MaxUnpaidPerClient int `yaml:"max_unpaid_per_client"`
	// MaxUnpaidTotal bounds everyone's: at the bound the oldest quote of
	// the client holding the most is canceled, so a new customer still
	// gets one.
	MaxUnpaidTotal int `yaml:"max_unpaid_total"`
	// RequestsPerMinute bounds one client's calls (free or priced) per
	// clock minute.
	RequestsPerMinute int `yaml:"requests_per_minute"`
}

// UpstreamConfig is one MCP server capvend sells: a stdio subprocess
// (command) or a Streamable HTTP endpoint (url).
type UpstreamConfig struct {
	// Name names the upstream in logs, metrics and the ledger.
	Name string `yaml:"name"`
	// Command runs a stdio MCP server, with Args, Env added to capvend's
	// environment, in Cwd.
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"`
	Cwd     string            `yaml:"cwd"`
	// URL is a Streamable HTTP MCP endpoint, instead of Command.
	URL string `yaml:"url"`
	// Prefix is put before the upstream's tool names as clients see them
	// (needed when two upstreams have a tool of the same name).
	Prefix string `yaml:"prefix"`
	// Tools prices tools by their name on the upstream (without Prefix).
	Tools map[string]ToolConfig `yaml:"tools"`
	// Prompts prices prompts by their name on the upstream (prompts/get),
	// Resources resources by URI or URI template (resources/read of the
	// URI, or of any URI the template matches). Only a flat price
	// (price_sats or price_msat) and free_per_day apply: per-argument
	// prices, min and max are for tools. Not listed: free.
	Prompts   map[string]ToolConfig `yaml:"prompts"`
	Resources map[string]ToolConfig `yaml:"resources"`
	// Unpriced is pricing.unpriced for this upstream's items ("free" or
	// "refuse"); empty: pricing.unpriced.
	Unpriced string `yaml:"unpriced"`
	// ClientPubkey gives the upstream the pubkey of the Nostr client that
	// signed a request, in params._meta.clientPubkey (ContextVM's
	// CEP-16); it needs nostr.relays (MCP HTTP and stdio clients have no
	// pubkey, and their requests go without one).
	ClientPubkey bool `yaml:"client_pubkey"`
}

// ToolConfig prices one tool. A tool not listed is free. Every amount is
// given in sats or in msat (not both): a call costs price + count ×
// per-argument price, clamped to [min, max]. A per-argument price (at most
// one of per_unit, per_kb, per_item) requires a max, so every tool has a
// bounded listed price ("lo-hi" in cap tags).
type ToolConfig struct {
	// PriceSats or PriceMsat is the price per call (the base price when
	// a per-argument price is set).
	PriceSats int64 `yaml:"price_sats"`
	PriceMsat int64 `yaml:"price_msat"`
	// PerUnit prices each whole unit of a numeric argument (fractions
	// rounded up), PerKB each started KB (1024 bytes of UTF-8) of a string
	// argument, PerItem each element of an array argument. A missing
	// argument counts 0.
	PerUnit *PerConfig `yaml:"per_unit"`
	PerKB   *PerConfig `yaml:"per_kb"`
	PerItem *PerConfig `yaml:"per_item"`
	// MinSats or MinMsat is the least a call costs; MaxSats or MaxMsat
	// the most (required with a per-argument price).
	MinSats int64 `yaml:"min_sats"`
	MinMsat int64 `yaml:"min_msat"`
	MaxSats int64 `yaml:"max_sats"`
	MaxMsat int64 `yaml:"max_msat"`
	// FreePerDay calls per client and UTC day are free (anonymous HTTP
	// clients are counted by address); later calls are priced normally.
	FreePerDay int `yaml:"free_per_day"`
	// FreePerDayTotal bounds those free calls per UTC day across all
	// clients (0: no bound): fresh Nostr keys cost nothing.
	FreePerDayTotal int `yaml:"free_per_day_total"`
	// NotIdempotent tools are refunded, never re-run, when capvend was
	// interrupted while they ran.
	NotIdempotent bool `yaml:"not_idempotent"`
}

// PerConfig is a per-argument price: sats or msat for each unit of the
// argument named arg.
type PerConfig struct {
	// Arg names the argument (a top-level property of the tool's input
	// schema).
	Arg string `yaml:"arg"`
	// Sats or Msat is the price of one unit of it.
	Sats int64 `yaml:"sats"`
	Msat int64 `yaml:"msat"`
}

// defaultConfig is what a missing field means.
func defaultConfig() Config {
	return Config{
		Ledger: LedgerConfig{Driver: "sqlite", Path: "capvend.db", LeaseTTL: 30 * time.Second, ClaimTakeover: time.Minute,
			ResultsRetention: ledger.DefaultResultsRetention},
		Server: ServerConfig{Name: "capvend"},
		HTTP: HTTPConfig{MaxRequestBytes: 1 << 20, SessionIdle: 30 * time.Minute, MaxSessions: 10_000, MaxSessionsPerSource: 100, MaxConnections: 1000,
			ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
			ShutdownGrace: 30 * time.Second},
		Nostr:     NostrConfig{Encryption: "optional", Announce: true, Window: 5 * time.Minute, ShutdownGrace: 30 * time.Second},
		LND:       LNDConfig{HoldInvoices: true, MaxHoldInvoices: 1_000},
		Cashu:     CashuConfig{WalletDir: "cashu-wallet", AcceptTokens: true, MintQuotes: true},
		NWC:       NWCConfig{HoldInvoices: true, Grace: time.Minute, Timeout: 30 * time.Second},
		Payments:  PaymentsConfig{TTL: 10 * time.Minute},
		Limits:    LimitsConfig{MaxUnpaidPerClient: 10, MaxUnpaidTotal: 1_000, RequestsPerMinute: 120},
		Pricing:   PricingConfig{Unpriced: string(pricing.UnpricedFree)},
		Reconcile: ReconcileConfig{Interval: reconcile.DefaultInterval},
		Log:       LogConfig{Format: "text", Level: "info"},
	}
}

// hexPubkeys is list (validated: see Validate) as hex pubkeys; entries
// that do not parse are kept as they are, for ctxvm.New to refuse.
func hexPubkeys(list []string) []string {
	out := make([]string, 0, len(list))
	for _, k := range list {
		if h, err := ctxvm.ParsePublicKey(k); err == nil {
			k = h
		}
		out = append(out, k)
	}
	return out
}

// logLevels are log.level's values.
var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// logger is the logger log configures, writing to w.
func (l LogConfig) logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevels[l.Level]}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// payBaseURL is where buyers reach pay pages: http.public_url, else
// http://<listen> when listen names a host (not 0.0.0.0, ::, or none).
func (h HTTPConfig) payBaseURL() string {
	if h.PublicURL != "" {
		return strings.TrimRight(h.PublicURL, "/")
	}
	host, _, err := net.SplitHostPort(h.Listen)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		return ""
	}
	return "http://" + h.Listen
}
