// Package mcpfront is capvend's client-facing MCP server: it serves the
// Vendor's priced tools, and the Catalog's prompts and resources, over
// Streamable HTTP (Handler, mounted by the wiring at /mcp) and over stdio
// (ServeStdio, for `capvend serve --stdio`), on top of mcp-go's server.
//
// # What it owns
//
//   - Lists: tools with their price in _meta["capvend/price"] and the
//     capvend_payment argument, prompts, resources and templates; Refresh
//     re-reads them and mcp-go sends list_changed.
//   - Calls: a tools/call, or a priced prompts/get or resources/read,
//     becomes a vend.CallRequest (handleCall); its notifications go on
//     the call's own stream, its result back byte for byte, its error
//     through adapters/rpcerr.
//   - How a client pays: payment notifications for clients that declare
//     CapabilityPayments, else explicit gating with a payment token
//     (gating.go); HTTP 402 with L402, MPP, x402 and X-Cashu challenges
//     (http402.go, paid402.go, xcashu.go); pay pages and URL-mode
//     elicitation (paypage.go); the discovery document (discovery.go).
//   - An upstream's elicitations, relayed to the client (elicit.go).
//   - The HTTP guard: origins, bearer token, body size, the sessions it
//     issued, who a request counts as for limits (source), write deadlines.
//   - A fast path for free calls to HTTP upstreams (fastfree.go).
//
// # How it fits
//
// It imports vend, adapters/rpcerr and mcp-go's server, and knows nothing
// of billing or the ledger (sessions shared between instances go through
// a SessionStore, which the ledger implements). internal/cli builds its
// Config from the http and payments sections and mounts Handler. mcp-go
// v1.2.1 cannot set a tool error's code or data and re-encodes results,
// so both pass through it as markers the writers under it put back (see
// markedError).
//
// # Where the detail is
//
// docs/PAYING.md has what a client sends and gets back, by protocol, and
// the errors; docs/OPERATING.md, "Serving MCP over HTTP" and "Limits", the
// HTTP checks, sessions, elicitation and who counts as one client.
package mcpfront

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// Vendor sells tool calls. vend's engine implements it.
type Vendor interface {
	// Tools returns the exposed tools with their prices.
	Tools() []vend.Item
	// CallItem runs one priced call; errors are vend's sentinel and typed
	// errors (anything else is reported as an internal error).
	CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error)
}

// PriceRanger is an optional ability of a Vendor: the listed price range of
// a tool whose price depends on its arguments.
type PriceRanger interface {
	// ListedPrice returns the least and most a call of t can cost.
	ListedPrice(t vend.Item) (lo, hi vend.Msat)
}

// ItemPricer is an optional ability of a Vendor: it sells prompts and
// resources (vend's Vendor implements it). A prompt or resource it prices
// above 0 is listed with its price and served through Vendor.CallItem
// (CallRequest.Kind), paid like a tool; the others stay free.
type ItemPricer interface {
	// ItemPrice returns the least and most a prompts/get (ItemPrompt,
	// the exposed name) or resources/read (ItemResource, a URI or URI
	// template) costs; 0 when free or unknown.
	ItemPrice(kind vend.ItemKind, name string) (lo, hi vend.Msat)
}

// _meta keys and values capvend reads on calls and writes on tools.
const (
	MetaPrice              = "capvend/price"               // tool _meta: the price
	MetaPaymentInteraction = "capvend/payment_interaction" // call _meta: "explicit_gating" asks for explicit gating
	MetaPMI                = "capvend/pmi"                 // call _meta: payment methods the client can use
	ExplicitGating         = "explicit_gating"
)

// Transport names in vend.CallRequest.Transport.
const (
	TransportHTTP  = "mcp-http"
	TransportStdio = "mcp-stdio"
	stdioClient    = "stdio"
	anonClient     = "anonymous"
)

// DefaultMaxBodyBytes bounds an HTTP request body when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 1 << 20

// Config configures a Server.
type Config struct {
	Vendor  Vendor
	Name    string       // server name in initialize/discover; "" : "capvend"
	Version string       // server version; "": "dev"
	Logger  *slog.Logger // nil: slog.Default()

	// ExplicitGating makes every call use explicit gating, whatever the
	// client asked.
	ExplicitGating bool
	// LegacyGatingCode restores, for one release, explicit gating as it
	// was before payment tokens (deprecated; payments.legacy_gating_code):
	// only on request (_meta or ExplicitGating), answered with JSON-RPC
	// -32042/-32043 (also MCP's URL-elicitation code), no payment tokens
	// and no capvend_payment in tool schemas; a client that did not
	// declare CapabilityPayments gets the notifications flow.
	LegacyGatingCode bool
	// HTTP402 answers every unpaid priced tools/call over HTTP with HTTP
	// 402 and its challenges (L402, X-Cashu), not only a request whose
	// Accept names L402 or cashu (payments.http_402; see http402.go and
	// xcashu.go).
	HTTP402 bool
	// HTTP402Schemes are the challenges a 402 carries, in order, by name
	// (SchemeL402, SchemeMPP, SchemeX402, SchemeCashu;
	// payments.http_402_schemes). Empty: DefaultHTTP402Schemes. A client
	// that reads one WWW-Authenticate takes the first: list "mpp" before
	// "l402" to serve fetchWithMpp (fetchWithL402 reads either).
	HTTP402Schemes []string
	// PayBaseURL is the public base URL of the HTTP listener (e.g.
	// "https://shop.example"), where pay pages are served
	// (PayPagePath): the explicit-gating result links to the call's page,
	// and a client that declared URL-mode elicitation is sent there.
	// Empty: no pay page links, no URL elicitation.
	PayBaseURL string
	// CashuMints are the mints whose tokens the Vendor takes (its Cashu
	// backend's, when that accepts tokens): a 402 then carries them in
	// X-Cashu's NUT-18 payment request. Empty: no X-Cashu on a 402 (a
	// token sent in X-Cashu is still handed to the Vendor, which refuses
	// it if it takes none).
	CashuMints []string
	// MaxBodyBytes bounds HTTP request bodies; larger ones get 413.
	// 0: DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Catalog, if set, is served for free: prompts/list, prompts/get,
	// resources/list, resources/templates/list and resources/read, with
	// the prompts and resources capabilities (listChanged) advertised.
	// nil: neither capability is advertised.
	Catalog Catalog

	// ClientID names the client of an HTTP request that has no MCP session
	// (protocol 2026-07-28 has none), e.g. from an auth header. nil or ""
	// result: "anonymous", shared by all such clients. It is called for
	// every HTTP request; it must be cheap.
	ClientID func(r *http.Request) string

	// ElicitTimeout bounds how long a client on protocol 2026-07-28 may
	// take to answer an elicitation (to call again with the answer);
	// then the upstream gets "cancel". 0: DefaultElicitTimeout.
	ElicitTimeout time.Duration
	// MaxElicitsPerClient and MaxElicits bound the elicitations waiting
	// for clients on protocol 2026-07-28 to call again, per source (see
	// source) and in total; beyond, the upstream gets
	// "cancel" at once. 0: DefaultMaxElicitsPerClient,
	// DefaultMaxElicits.
	MaxElicitsPerClient, MaxElicits int

	// SessionIdle ends an MCP session (protocols before 2026-07-28) that
	// had no request in flight for this long. 0: DefaultSessionIdle.
	SessionIdle time.Duration
	// MaxSessions bounds the live MCP sessions: at the bound, a new
	// initialize evicts the session idle the longest of the source holding
	// the most, or gets 503 when every session has a request in flight.
	// 0: DefaultMaxSessions.
	MaxSessions int
	// MaxSessionsPerSource bounds the live MCP sessions of one source
	// (see source): beyond it, the source's
	// initialize evicts its own session idle the longest, or gets 429
	// when each of its sessions has a request in flight. 0:
	// DefaultMaxSessionsPerSource.
	MaxSessionsPerSource int
	// Sessions, if set, shares the MCP sessions with other instances (a
	// ledger they share): a session issued by any of them is accepted
	// here, so that a client whose instance died can send its request
	// again to another (and get a paid call's stored answer). Each
	// session costs one write at its first request after initialize and
	// one more each half SessionIdle it stays active; an unknown
	// well-formed id costs one read. nil: sessions are this instance's.
	Sessions SessionStore

	// TrustedProxies are the peers whose X-Forwarded-For (and
	// ClientIDHeader) are believed: see source.
	TrustedProxies []netip.Prefix
	// ClientIDHeader, if set, names a header a trusted proxy sets to who
	// the client is (e.g. after its own authentication): a request from
	// a trusted proxy carrying it counts as "id:<value>". It requires
	// TrustedProxies.
	ClientIDHeader string

	// AllowedOrigins are the web origins whose requests are served; a
	// request with another Origin header gets 403 (one without Origin,
	// from anything but a browser, is served). An entry is an origin
	// ("https://app.example.com", "http://localhost:3000"), an origin
	// with any port ("http://localhost:*"), or "*" (any). nil:
	// DefaultAllowedOrigins (loopback only).
	AllowedOrigins []string
	// WriteTimeout bounds each write to an HTTP client: before every
	// write the front moves the connection's write deadline to now +
	// WriteTimeout. A response stream may so stay open and quiet for as
	// long as its call needs (a payment wait, up to the payment TTL),
	// while a client that stops reading is cut off. Give the http.Server
	// the same WriteTimeout: it covers what the front does not write. 0:
	// the front sets no deadline.
	WriteTimeout time.Duration
	// BearerToken, if not empty, must be presented by every HTTP request
	// as "Authorization: Bearer <token>" (401 otherwise). A secret: only
	// its hash is kept, compared in constant time, never logged. At
	// least 16 bytes.
	BearerToken []byte
}

// Server is the client-facing MCP server. Create it with New.
type Server struct {
	cfg    Config
	log    *slog.Logger
	mcp    *server.MCPServer
	http   *server.StreamableHTTPServer
	nonce  string // marks placeholders only this Server produced
	stdio  sync.Mutex
	inStdi bool

	catalog catalogState // what Refresh registered of the Catalog
	// toolsMu makes each Refresh read the Vendor's tools and register
	// them in one step: two upstreams changing at once each call
	// Refresh, and the one that read first must not register last.
	toolsMu sync.Mutex

	sessions  *sessions    // the MCP sessions issued (protocols before 2026-07-28)
	origins   []originRule // Config.AllowedOrigins
	tokenHash []byte       // SHA-256 of Config.BearerToken; nil: no token

	// elicits are the elicitations handed to clients on protocol
	// 2026-07-28, by requestState token, until answered or expired.
	elicitMu sync.Mutex
	elicits  map[string]*pendingAsk
	elicitBy map[string]int // parked elicitations by source

	// streams ends long-lived listening streams (see CloseStreams).
	streams      context.Context
	closeStreams context.CancelFunc

	infoOnce sync.Once
	info     json.RawMessage // serverInfoMeta's answer (fastfree.go)
	// clientMetas keeps clientMeta's answers (fastfree.go), counted in
	// clientMetaN.
	clientMetas sync.Map // clientMetaHash -> clientMetaAnswer
	clientMetaN atomic.Int64
}

type ctxKey int

const (
	keyTransport ctxKey = iota
	keyClient
	keySource
	keyStdioOut
	keyHTTPWriter
)

// rpcIDHeader carries the JSON-RPC id from the BeforeCallTool hook to the
// handler inside the request's Header (which mcp-go never serialises).
const rpcIDHeader = "X-Capvend-Internal-Jsonrpc-Id"

// New returns a Server for cfg. It does no I/O and starts no goroutine; the
// tool list is read from the Vendor at once (call Refresh when it changes).
func New(cfg Config) (*Server, error) {
	if cfg.Vendor == nil {
		return nil, errors.New("mcpfront: Vendor is nil")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, errors.New("mcpfront: MaxBodyBytes is negative")
	}
	if cfg.ElicitTimeout < 0 {
		return nil, errors.New("mcpfront: ElicitTimeout is negative")
	}
	if cfg.ElicitTimeout == 0 {
		cfg.ElicitTimeout = DefaultElicitTimeout
	}
	if cfg.MaxElicitsPerClient < 0 || cfg.MaxElicits < 0 {
		return nil, errors.New("mcpfront: MaxElicitsPerClient or MaxElicits is negative")
	}
	if cfg.MaxElicitsPerClient == 0 {
		cfg.MaxElicitsPerClient = DefaultMaxElicitsPerClient
	}
	if cfg.MaxElicits == 0 {
		cfg.MaxElicits = DefaultMaxElicits
	}
	if cfg.SessionIdle < 0 || cfg.MaxSessions < 0 || cfg.MaxSessionsPerSource < 0 {
		return nil, errors.New("mcpfront: SessionIdle, MaxSessions or MaxSessionsPerSource is negative")
	}
	if cfg.SessionIdle == 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.ClientIDHeader != "" && len(cfg.TrustedProxies) == 0 {
		return nil, errors.New("mcpfront: ClientIDHeader needs TrustedProxies: only a trusted proxy may say who the client is")
	}
	cfg.ClientIDHeader = http.CanonicalHeaderKey(cfg.ClientIDHeader)
	if cfg.AllowedOrigins == nil {
		cfg.AllowedOrigins = DefaultAllowedOrigins()
	}
	var origins []originRule
	for _, o := range cfg.AllowedOrigins {
		rule, err := parseOriginRule(o)
		if err != nil {
			return nil, fmt.Errorf("mcpfront: %w", err)
		}
		origins = append(origins, rule)
	}
	var tokenHash []byte
	if len(cfg.BearerToken) > 0 {
		if len(cfg.BearerToken) < minBearerToken {
			return nil, fmt.Errorf("mcpfront: BearerToken is shorter than %d bytes", minBearerToken)
		}
		sum := sha256.Sum256(cfg.BearerToken)
		tokenHash = sum[:]
		cfg.BearerToken = nil // keep only the hash
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxSessionsPerSource == 0 {
		cfg.MaxSessionsPerSource = DefaultMaxSessionsPerSource
	}
	if cfg.Name == "" {
		cfg.Name = "capvend"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, nonce: hex.EncodeToString(b[:]), elicits: map[string]*pendingAsk{}, elicitBy: map[string]int{},
		sessions: newSessions(cfg.SessionIdle, cfg.MaxSessions, cfg.MaxSessionsPerSource), origins: origins, tokenHash: tokenHash}
	s.streams, s.closeStreams = context.WithCancel(context.Background())

	hooks := &server.Hooks{}
	hooks.AddBeforeCallTool(func(ctx context.Context, id any, req *mcp.CallToolRequest) {
		req.Header = withRPCID(req.Header, id)
	})
	hooks.AddBeforeGetPrompt(func(ctx context.Context, id any, req *mcp.GetPromptRequest) {
		req.Header = withRPCID(req.Header, id)
	})
	hooks.AddBeforeReadResource(func(ctx context.Context, id any, req *mcp.ReadResourceRequest) {
		req.Header = withRPCID(req.Header, id)
	})
	opts := []server.ServerOption{server.WithToolCapabilities(true), server.WithHooks(hooks)}
	if cfg.Catalog != nil {
		opts = append(opts, server.WithPromptCapabilities(true), server.WithResourceCapabilities(false, true))
	}
	s.mcp = server.NewMCPServer(cfg.Name, cfg.Version, opts...)
	s.http = server.NewStreamableHTTPServer(s.mcp,
		server.WithEndpointPath("/mcp"),
		server.WithSessionIdManagerResolver(sessionResolver{s}),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			ctx = context.WithValue(ctx, keyTransport, TransportHTTP)
			id := ""
			if sess := server.ClientSessionFromContext(ctx); sess != nil {
				id = sess.SessionID()
			}
			if id == "" && cfg.ClientID != nil {
				id = cfg.ClientID(r)
			}
			if id == "" {
				id = anonClient
			}
			ctx = context.WithValue(ctx, keySource, s.source(r))
			return context.WithValue(ctx, keyClient, id)
		}),
		server.WithStreamableHTTPLogger(cfg.Logger),
	)
	s.Refresh()
	return s, nil
}

// withRPCID returns a copy of h carrying the JSON-RPC id (see
// rpcIDHeader).
func withRPCID(h http.Header, id any) http.Header {
	raw, err := json.Marshal(id)
	if err != nil {
		raw = []byte("null")
	}
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(rpcIDHeader, string(raw))
	return h
}

// Refresh re-reads the Vendor's tools and registers them; mcp-go then
// sends notifications/tools/list_changed to every connected client that
// can receive it. It also re-reads the Catalog, if
// any, and registers the prompts, resources and templates that changed;
// mcp-go then sends notifications/prompts/list_changed or
// notifications/resources/list_changed (only when something changed).
// Safe to call concurrently (the last call registers the newest tools);
// cheap enough to call on every upstream change.
func (s *Server) Refresh() {
	defer s.refreshCatalog()
	s.toolsMu.Lock()
	defer s.toolsMu.Unlock()
	vt := s.cfg.Vendor.Tools()
	ranger, _ := s.cfg.Vendor.(PriceRanger)
	tools := make([]server.ServerTool, 0, len(vt))
	// A Vendor selling credit lists its top-up tool: priced tools then
	// take a credit token argument too.
	credit := slices.ContainsFunc(vt, func(t vend.Item) bool { return t.Name == vend.TopUpTool })
	for _, t := range vt {
		tools = append(tools, server.ServerTool{Tool: s.toMCPTool(t, ranger, credit), Handler: s.handleCall})
	}
	s.mcp.SetTools(tools...)
}

func (s *Server) toMCPTool(t vend.Item, ranger PriceRanger, credit bool) mcp.Tool {
	mt := mcp.Tool{Name: t.Name, Title: t.Title, Description: t.Description}
	schema := t.InputSchema
	if len(schema) == 0 {
		schema = json.RawMessage(`{"type":"object"}`)
	}
	mt.RawInputSchema = schema
	if len(t.Annotations) > 0 {
		if err := json.Unmarshal(t.Annotations, &mt.Annotations); err != nil {
			s.log.Warn("tool annotations ignored", logKeyTool, t.Name, logKeyErr, err)
		}
	}
	lo, hi := t.Price, t.Price
	if ranger != nil {
		lo, hi = ranger.ListedPrice(t)
	}
	if hi > 0 && !s.cfg.LegacyGatingCode {
		mt.RawInputSchema = withPaymentArg(schema, credit)
	}
	mt.Meta = withPrice(nil, lo, hi)
	return mt
}

// withPrice returns m with _meta["capvend/price"] set when hi > 0 (m
// unchanged otherwise): {"amount": lo, "unit": "sats"}, plus "max_amount"
// when the price varies. m is not modified; nil is fine.
func withPrice(m *mcp.Meta, lo, hi vend.Msat) *mcp.Meta {
	if hi <= 0 {
		return m
	}
	price := map[string]any{"amount": lo.SatsCeil(), "unit": "sats"}
	if hi.SatsCeil() > lo.SatsCeil() {
		price["max_amount"] = hi.SatsCeil()
	}
	out := &mcp.Meta{AdditionalFields: map[string]any{}}
	if m != nil {
		out.ProgressToken = m.ProgressToken
		for k, v := range m.AdditionalFields {
			out.AdditionalFields[k] = v
		}
	}
	out.AdditionalFields[MetaPrice] = price
	return out
}

// Handler returns the Streamable HTTP handler. It serves every path it is
// mounted on (the wiring mounts it at /mcp), checks Origin, token, body
// size and session first (docs/OPERATING.md, Serving MCP over HTTP), and
// listens nowhere by itself. mcp-go rejects requests arriving on a loopback connection with a
// non-localhost Host header (DNS rebinding protection). Connection limits
// and timeouts are the http.Server's.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(s.serveHTTP)
}

// CloseStreams ends every long-lived HTTP listening stream (GET streams,
// and subscriptions/listen with protocol 2026-07-28), now and from now on,
// so that http.Server.Shutdown, which waits for active requests, can
// finish. Calls in flight are not affected. Call it right after starting
// Shutdown. Idempotent.
func (s *Server) CloseStreams() { s.closeStreams() }

// ServeStdio serves one MCP client on in/out until in ends (nil) or ctx
// ends (ctx's error). mcp-go keeps one stdio session per process, so only
// one ServeStdio may run at a time in a process.
func (s *Server) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	s.stdio.Lock()
	if s.inStdi {
		s.stdio.Unlock()
		return errors.New("mcpfront: ServeStdio already running")
	}
	s.inStdi = true
	s.stdio.Unlock()
	defer func() {
		s.stdio.Lock()
		s.inStdi = false
		s.stdio.Unlock()
	}()

	w := &lineWriter{s: s, w: out}
	ss := server.NewStdioServer(s.mcp)
	ss.SetErrorLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelWarn))
	ss.SetContextFunc(func(ctx context.Context) context.Context {
		ctx = context.WithValue(ctx, keyTransport, TransportStdio)
		ctx = context.WithValue(ctx, keyClient, stdioClient)
		return context.WithValue(ctx, keyStdioOut, w)
	})
	err := ss.Listen(ctx, in, w)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}

// Sessions returns how many MCP sessions this Server issued are live
// (Streamable HTTP sessions of protocols before 2026-07-28).
func (s *Server) Sessions() int { return s.sessions.count() }
