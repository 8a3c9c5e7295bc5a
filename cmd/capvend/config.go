package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/capvend/capvend/adapters/admin"
	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/internal/replica"
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

// unpriced is what u's items without a price are under cfg.
func (c *Config) unpriced(u UpstreamConfig) pricing.Unpriced {
	if u.Unpriced != "" {
		return pricing.Unpriced(u.Unpriced)
	}
	return pricing.Unpriced(c.Pricing.Unpriced)
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

// Msat returns the tool's price per call in millisatoshis (the base price
// of a per-argument price; 0: free unless a per-argument price or a
// minimum is set). It is only meaningful once Validate accepted the
// configuration.
func (t ToolConfig) Msat() int64 {
	if t.PriceMsat != 0 {
		return t.PriceMsat
	}
	return t.PriceSats * 1000
}

// maxSats is 21 million bitcoin: no configured amount may exceed it.
const maxSats = 21_000_000 * 100_000_000

// fieldError is a bad tool setting: key (relative to the tool, e.g.
// "per_kb.arg") and what is allowed there.
type fieldError struct{ key, msg string }

func (e *fieldError) Error() string { return e.key + ": " + e.msg }

// amount converts an amount given in sats (key+"sats") or msat
// (key+"msat").
func amount(key string, sats, msat int64) (pricing.Msat, error) {
	switch {
	case sats < 0 || msat < 0:
		return 0, &fieldError{key + "sats", fmt.Sprintf("cannot be negative (nor %smsat)", key)}
	case sats != 0 && msat != 0:
		return 0, &fieldError{key + "sats", fmt.Sprintf("set %ssats or %smsat, not both", key, key)}
	case sats > maxSats || msat > maxSats*1000:
		return 0, &fieldError{key + "sats", "price is more than 21 million bitcoin"}
	case msat != 0:
		return pricing.Msat(msat), nil
	}
	return pricing.Msat(sats * 1000), nil
}

// per returns the tool's per-argument price and its key; an error if more
// than one is set.
func (t ToolConfig) per() (p *PerConfig, key string, kind pricing.Kind, err error) {
	for _, c := range []struct {
		p    *PerConfig
		key  string
		kind pricing.Kind
	}{{t.PerUnit, "per_unit", pricing.PerUnit}, {t.PerKB, "per_kb", pricing.PerKB}, {t.PerItem, "per_item", pricing.PerItem}} {
		if c.p == nil {
			continue
		}
		if p != nil {
			return nil, "", "", &fieldError{c.key, fmt.Sprintf("set at most one of per_unit, per_kb, per_item (%s is set)", key)}
		}
		p, key, kind = c.p, c.key, c.kind
	}
	return p, key, kind, nil
}

// rule converts t to a price rule and validates it. A *fieldError names
// the key at fault; other errors concern the tool as a whole.
func (t ToolConfig) rule() (pricing.Rule, error) {
	var r pricing.Rule
	var err error
	if r.Price, err = amount("price_", t.PriceSats, t.PriceMsat); err != nil {
		return r, err
	}
	if r.Min, err = amount("min_", t.MinSats, t.MinMsat); err != nil {
		return r, err
	}
	if r.Max, err = amount("max_", t.MaxSats, t.MaxMsat); err != nil {
		return r, err
	}
	p, key, kind, err := t.per()
	if err != nil {
		return r, err
	}
	if p != nil {
		if p.Arg == "" {
			return r, &fieldError{key + ".arg", "required: the name of the argument to count"}
		}
		price, err := amount(key+".", p.Sats, p.Msat)
		switch {
		case err != nil:
			return r, err
		case price <= 0:
			return r, &fieldError{key + ".sats", "required: the positive price of one unit (or set msat)"}
		case r.Max == 0:
			return r, &fieldError{"max_sats", fmt.Sprintf("required with %s: the most one call may cost (or set max_msat)", key)}
		}
		r.Per = &pricing.Per{Kind: kind, Arg: p.Arg, Price: price}
	}
	switch {
	case t.FreePerDay < 0:
		return r, &fieldError{"free_per_day", fmt.Sprintf("must be 0 or more, got %d", t.FreePerDay)}
	case t.FreePerDay > 0 && r.Price == 0 && r.Per == nil && r.Min == 0:
		return r, &fieldError{"free_per_day", "needs a price: without one the tool is free anyway"}
	}
	switch {
	case t.FreePerDayTotal < 0:
		return r, &fieldError{"free_per_day_total", fmt.Sprintf("must be 0 or more, got %d", t.FreePerDayTotal)}
	case t.FreePerDayTotal > 0 && t.FreePerDay == 0:
		return r, &fieldError{"free_per_day_total", "needs free_per_day: it bounds those free calls across all clients"}
	}
	r.FreePerDay = t.FreePerDay
	r.FreePerDayTotal = t.FreePerDayTotal
	r.NotIdempotent = t.NotIdempotent
	return r, r.Validate()
}

// itemRule converts the price of a prompt or resource: a flat price and
// free_per_day only.
func (t ToolConfig) itemRule() (pricing.Rule, error) {
	if p, key, _, err := t.per(); err != nil || p != nil {
		if err == nil {
			err = &fieldError{key, "per-argument prices are for tools only: set price_sats or price_msat"}
		}
		return pricing.Rule{}, err
	}
	switch {
	case t.MinSats != 0 || t.MinMsat != 0:
		return pricing.Rule{}, &fieldError{"min_sats", "min is for tools with a per-argument price: set price_sats or price_msat"}
	case t.MaxSats != 0 || t.MaxMsat != 0:
		return pricing.Rule{}, &fieldError{"max_sats", "max is for tools with a per-argument price: set price_sats or price_msat"}
	case t.NotIdempotent:
		return pricing.Rule{}, &fieldError{"not_idempotent", "prompt gets and resource reads are always treated as idempotent"}
	}
	return t.rule()
}

// itemPrices are an upstream's priced prompts and resources: the config
// key ("prompts", "resources"), the book key of a name, and the prices.
func (u UpstreamConfig) itemPrices() []struct {
	field string
	key   func(string) string
	items map[string]ToolConfig
} {
	return []struct {
		field string
		key   func(string) string
		items map[string]ToolConfig
	}{{"prompts", pricing.PromptKey, u.Prompts}, {"resources", pricing.ResourceKey, u.Resources}}
}

// PriceBook builds the price book of the upstreams' tools, prompts and
// resources (the latter under pricing.PromptKey and ResourceKey), with
// what their unpriced items are. It fails, naming the item, only on a
// configuration Validate refuses.
func (c *Config) PriceBook() (*pricing.Book, error) {
	rules, err := c.priceRules()
	if err != nil {
		return nil, err
	}
	return pricing.NewBook(rules, pricing.WithUnpriced(c.unpricedBy()))
}

// unpricedBy is what each upstream's items without a price are.
func (c *Config) unpricedBy() map[string]pricing.Unpriced {
	m := make(map[string]pricing.Unpriced, len(c.Upstreams))
	for _, u := range c.Upstreams {
		m[u.Name] = c.unpriced(u)
	}
	return m
}

// priceRules are the price rules of every upstream, by upstream name and
// tool (or item key).
func (c *Config) priceRules() (map[string]map[string]pricing.Rule, error) {
	rules := map[string]map[string]pricing.Rule{}
	for i, u := range c.Upstreams {
		m := map[string]pricing.Rule{}
		for name, t := range u.Tools {
			r, err := t.rule()
			if err != nil {
				return nil, fmt.Errorf("upstreams[%d].tools.%s: %w", i, name, err)
			}
			m[name] = r
		}
		for _, ip := range u.itemPrices() {
			for name, t := range ip.items {
				r, err := t.itemRule()
				if err != nil {
					return nil, fmt.Errorf("upstreams[%d].%s.%s: %w", i, ip.field, name, err)
				}
				m[ip.key(name)] = r
			}
		}
		rules[u.Name] = m
	}
	return rules, nil
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

// configPath picks the configuration file: the flag, else $CAPVEND_CONFIG,
// else ./capvend.yaml. explicit reports whether the user named one (then it
// must exist).
func configPath(flagValue string, getenv func(string) string) (path string, explicit bool) {
	if flagValue != "" {
		return flagValue, true
	}
	if v := getenv("CAPVEND_CONFIG"); v != "" {
		return v, true
	}
	return "capvend.yaml", false
}

// loadConfig reads and validates the configuration. A missing default file
// means the defaults; a missing file the user named is an error.
func loadConfig(flagValue string, getenv func(string) string) (*Config, error) {
	path, explicit := configPath(flagValue, getenv)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		c := defaultConfig()
		return &c, c.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parseConfig(path, data, getenv)
}

// parseConfig expands $VAR and ${VAR} (from getenv; "$$" is a literal
// "$"), decodes strictly (unknown fields are errors), applies defaults,
// resolves relative paths against the file's directory, and validates.
func parseConfig(path string, data []byte, getenv func(string) string) (*Config, error) {
	expanded, err := expandEnv(data, getenv)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c := defaultConfig()
	var doc yaml.Node
	if err := yaml.Unmarshal(expanded, &doc); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if errs := unknownFields(&doc, reflect.TypeOf(c), ""); len(errs) > 0 {
		return nil, fmt.Errorf("config %s: %w", path, errors.Join(errs...))
	}
	dec := yaml.NewDecoder(bytes.NewReader(expanded))
	dec.KnownFields(true) // unknownFields said it better; a backstop
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config %s: %s", path, strings.ReplaceAll(err.Error(), "yaml: unmarshal errors:\n  ", ""))
	}
	c.path = path
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c.resolvePaths(dir)
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

var envRef = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expandEnv replaces $VAR and ${VAR}, line by line so an unset variable is
// reported with its line. Comments are expanded too but never fail: a
// commented-out line may name a variable that is not set.
func expandEnv(data []byte, getenv func(string) string) ([]byte, error) {
	lines := bytes.Split(data, []byte("\n"))
	for i, line := range lines {
		comment := bytes.HasPrefix(bytes.TrimSpace(line), []byte("#"))
		var missing string
		lines[i] = envRef.ReplaceAllFunc(line, func(m []byte) []byte {
			if string(m) == "$$" {
				return []byte("$")
			}
			name := strings.Trim(string(m), "${}")
			v := getenv(name)
			if v == "" && missing == "" && !comment {
				missing = name
			}
			return []byte(v)
		})
		if missing != "" {
			return nil, fmt.Errorf("line %d: environment variable $%s is not set (write $$ for a literal $)", i+1, missing)
		}
	}
	return bytes.Join(lines, []byte("\n")), nil
}

// yamlSections names the config's types as the file's reader knows
// them, in errors about unknown fields; a struct type not listed is
// named by its key (the top-level sections: "lnd", "http", ...).
var yamlSections = map[reflect.Type]string{
	reflect.TypeFor[Config]():         "the top level",
	reflect.TypeFor[UpstreamConfig](): "an upstream",
	reflect.TypeFor[ToolConfig]():     "a tool, prompt or resource",
	reflect.TypeFor[PerConfig]():      "a per-argument price",
}

// unknownFields walks the parsed file beside the type it decodes into
// and returns one error per key that type has no field for, with its
// line and the keys that do exist there. (The decoder's own KnownFields
// error names Go types; this names the file's sections.)
func unknownFields(n *yaml.Node, t reflect.Type, key string) []error {
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var errs []error
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := yamlFields(t)
		section := yamlSections[t]
		if section == "" {
			section = key
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				errs = append(errs, unknownFields(v, t, key)...)
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				errs = append(errs, fmt.Errorf("line %d: unknown field %q in %s (known fields: %s)", k.Line, k.Value, section, strings.Join(slices.Sorted(maps.Keys(fields)), ", ")))
				continue
			}
			errs = append(errs, unknownFields(v, ft, k.Value)...)
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && n.Kind == yaml.SequenceNode:
		for _, e := range n.Content {
			errs = append(errs, unknownFields(e, t.Elem(), key)...)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			errs = append(errs, unknownFields(n.Content[i], t.Elem(), n.Content[i-1].Value)...)
		}
	}
	return errs
}

// yamlFields maps the YAML keys of struct type t to their field types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}

func (c *Config) resolvePaths(dir string) {
	abs := func(p *string) {
		if *p == "" || filepath.IsAbs(*p) {
			return
		}
		if strings.HasPrefix(*p, "~/") {
			if home, err := os.UserHomeDir(); err == nil {
				*p = filepath.Join(home, (*p)[2:])
				return
			}
		}
		*p = filepath.Join(dir, *p)
	}
	abs(&c.Ledger.Path)
	abs(&c.Ledger.DSNFile)
	abs(&c.Ledger.ReplicaCredentialsFile)
	if strings.ContainsRune(c.Ledger.LitestreamBin, filepath.Separator) {
		abs(&c.Ledger.LitestreamBin)
	}
	abs(&c.HTTP.AuthTokenFile)
	abs(&c.Admin.TokenFile)
	abs(&c.Nostr.NsecFile)
	abs(&c.LND.TLSCertFile)
	abs(&c.LND.MacaroonFile)
	abs(&c.Cashu.WalletDir)
	abs(&c.NWC.URIFile)
	for i := range c.NWC.Wallets {
		abs(&c.NWC.Wallets[i].URIFile)
	}
	for i := range c.Upstreams {
		abs(&c.Upstreams[i].Cwd)
	}
}

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

// UnmarshalYAML decodes the ledger section, taking a bare 0 for
// results_retention (keep forever) as 0s: YAML reads 0 as an integer,
// which is no duration.
func (c *LedgerConfig) UnmarshalYAML(n *yaml.Node) error {
	type plain LedgerConfig
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Value == "results_retention" && v.Tag == "!!int" && v.Value == "0" {
			v.Tag, v.Value = "!!str", "0s"
		}
	}
	return n.Decode((*plain)(c))
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
	if !validUnpriced(c.Pricing.Unpriced) {
		p.bad("pricing.unpriced", "%q is not free (the default: an item without a price is sold free) or refuse (it is neither listed nor sold)", c.Pricing.Unpriced)
	}
}

// validUnpriced reports whether s is a value of pricing.unpriced.
func validUnpriced(s string) bool {
	return s == string(pricing.UnpricedFree) || s == string(pricing.UnpricedRefuse)
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
		if u.Unpriced != "" && !validUnpriced(u.Unpriced) {
			p.bad(field+".unpriced", "%q is not free or refuse (or leave it out for pricing.unpriced)", u.Unpriced)
		}
		if u.ClientPubkey && len(c.Nostr.Relays) == 0 {
			p.bad(field+".client_pubkey", "only Nostr clients have a pubkey to give: set nostr.relays, or leave it out")
		}
		names := make([]string, 0, len(u.Tools))
		for name := range u.Tools {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			t := u.Tools[name]
			tf := fmt.Sprintf("%s.tools.%s", field, name)
			r, err := t.rule()
			var fe *fieldError
			switch {
			case errors.As(err, &fe):
				p.bad(tf+"."+fe.key, "%s", fe.msg)
				continue
			case err != nil:
				p.bad(tf, "%v", err)
				continue
			}
			if strings.HasPrefix(name, "prompt:") || strings.HasPrefix(name, "resource:") {
				p.bad(tf, "a tool name cannot start with prompt: or resource: (price prompts and resources under %s.prompts, %s.resources)", field, field)
			}
			if r.Price > 0 || r.Per != nil || r.Min > 0 {
				priced = true
			}
		}
		for _, ip := range u.itemPrices() {
			names := make([]string, 0, len(ip.items))
			for name := range ip.items {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				tf := fmt.Sprintf("%s.%s.%s", field, ip.field, name)
				if name == "" {
					p.bad(tf, "the %s name must not be empty", strings.TrimSuffix(ip.field, "s"))
					continue
				}
				r, err := ip.items[name].itemRule()
				var fe *fieldError
				switch {
				case errors.As(err, &fe):
					p.bad(tf+"."+fe.key, "%s", fe.msg)
					continue
				case err != nil:
					p.bad(tf, "%v", err)
					continue
				}
				if r.Price > 0 {
					priced = true
				}
			}
		}
	}
	return priced
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

// logLevels are log.level's values.
var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

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
