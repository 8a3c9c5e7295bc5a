// Package mcpfront is capvend's client-facing MCP server: it serves the
// Vendor's priced tools over Streamable HTTP (Handler, mounted by the wiring
// at /mcp) and over stdio (ServeStdio, for `capvend serve --stdio`), on top
// of mcp-go's server. It translates tools/list and tools/call to Vendor calls
// and the Vendor's answers back to the wire; it knows nothing of billing or
// the ledger.
//
// # tools/list
//
// Every tool of Vendor.Tools is listed with its name, title, description,
// input schema and annotations. A priced tool carries its price in _meta:
//
//	"_meta": {"capvend/price": {"amount": 21, "unit": "sats"}}
//
// and, when the Vendor implements PriceRanger and the price depends on the
// arguments, {"amount": <min>, "max_amount": <max>, "unit": "sats"}. Amounts
// are whole sats, rounded up. A priced tool's inputSchema also gains the
// optional string property capvend_payment (vend.PaymentArg), described
// for the model (see Buying from any MCP host; not with
// Config.LegacyGatingCode); the rest of the schema is the upstream's (its
// keys re-encoded in sorted order). Refresh re-reads the Vendor's tools;
// mcp-go then sends notifications/tools/list_changed to connected clients.
//
// # tools/call
//
// A call becomes a vend.CallRequest: Transport "mcp-http" or "mcp-stdio";
// Client the MCP session id (HTTP before protocol 2026-07-28), the
// Config.ClientID of the HTTP request, or "stdio" (an HTTP request with
// neither is Anonymous, Client "anonymous"); Source, over HTTP, who the
// request counts as for limits (see below); RequestID the JSON-RPC id
// as JSON text (1 and "1" differ); Arguments the raw arguments object ({}
// when absent); ProgressToken params._meta.progressToken as JSON; CashuToken
// params._meta["capvend/cashu"]; PMIs params._meta["capvend/pmi"] (array of
// strings); PaymentToken params._meta["capvend/payment"] (vend takes the
// capvend_payment argument out of Arguments itself); Credit
// params._meta["capvend/credit"], else the Capvend-Credit request header
// (vend takes a capvend_credit argument itself; over HTTP an answer that
// reports a balance sets the Capvend-Credit response header to it, in
// msat, when the response has not started streaming); Explicit when
// params._meta["capvend/payment_interaction"] is "explicit_gating",
// Config.ExplicitGating is set, or the client did not declare
// CapabilityPayments (see below); PaymentTokens unless
// Config.LegacyGatingCode. Notify sends a notification on the call's own
// stream (see below).
//
// A result is returned as the Vendor gave it (its JSON values byte for byte;
// with protocol 2026-07-28 mcp-go's resultType and _meta.serverInfo are added
// when the body lacks them). Errors become JSON-RPC errors:
//
//	vend.ErrUnknownTool           -32602 "Unknown tool: <name>"
//	*vend.InvalidParamsError      -32602 "Invalid params: <reason>"
//	vend.ErrTokenMismatch         -32600 "Invalid Request: payment token is for another call"
//	vend.ErrTokenUsed             -32600 "Invalid Request: payment token already used"
//	vend.ErrTokenUnknown          -32602 "Invalid params: unknown payment token"
//	vend.ErrTokenExpired          -32050 "Payment expired: the payment token's invoice expired unpaid; ..."
//	vend.ErrPaymentExpired        -32050 "Payment expired"
//	vend.ErrPaymentFailed         -32051 "Payment failed"
//	vend.ErrNoPaymentMethod       -32052 "No payment method in common"
//	vend.ErrLimit                 -32053 "Limit reached"
//	vend.ErrUpstream              -32054 "Upstream server failed"
//	*vend.WorkRequiredError       -32055 "Proof of work required" (only fronts that require work)
//	vend.ErrResultExpired         -32057 "Result expired: ..." (a replay whose stored answer was pruned)
//	anything else                 -32603 "Internal error"
//
// (*vend.PaymentRequiredError and *vend.PaymentPendingError are tool
// results, see below; with Config.LegacyGatingCode they are -32042
// "Payment Required" data {instructions, payment_options} and -32043
// "Payment Pending" data {instructions, retry_after}), and the front's
// own: a requestState retry naming another call -32600
// "Invalid Request: request id reused with different parameters", an
// unknown or expired requestState -32602 (see Elicitation).
//
// Messages are fixed strings (plus the tool name or the schema reason the
// client's own arguments caused): no internals leak; the full error is
// logged. -32042 is also MCP's URLElicitationRequired code (protocol
// 2025-11-25): mcp-go clients decode it as such and drop our data, which
// is why explicit gating is a tool result here (ContextVM clients, whose
// CEP-8 defines -32042/-32043 for payments, keep them on the Nostr
// front). -32000, -32001, -32002 and -32020..-32022 are avoided (used by
// MCP SDKs).
//
// # Buying from any MCP host
//
// A client declares that it handles capvend's payment notifications
// (notifications/payment_required, payment_accepted, payment_rejected,
// progress heartbeats) with the experimental capability
// CapabilityPayments in its initialize:
//
//	"capabilities": {"experimental": {"capvend/payments": {}}}
//
// (per request, in _meta's client capabilities, with protocol
// 2026-07-28; per session over HTTP before it, and over stdio). Such a
// client keeps the notifications flow, or explicit gating if it asks for
// it in _meta. Any other client (a stock host: MCP Inspector, desktop chat
// apps, IDE agents, which ignore those notifications and cannot set
// _meta) gets explicit gating with a payment token, so its priced call is
// answered at once with a tool result:
//
//	{"content": [{"type": "text", "text": "Payment required: 21 sats to call ex_sha256.\n\n
//	   Pay this Lightning invoice (it expires at 2026-11-24T03:00:00Z):\n\nlnbc...\n\nlightning:lnbc...\n\n
//	   After paying, call ex_sha256 again with the same arguments plus capvend_payment: cvp_..."}],
//	 "structuredContent": {"error": "payment_required", "message": "...",
//	   "resource": {"url": "mcp://tool/ex_sha256", "description": "..."},
//	   "amount": 21, "amount_msat": 21000, "unit": "sat", "pmi": "bitcoin-lightning-bolt11",
//	   "invoice": "lnbc...", "payment_uri": "lightning:lnbc...", "expires_at": "2026-11-24T03:00:00Z",
//	   "accepts": [<payment options>], "capvend_payment": "cvp_...",
//	   "retry": {"method": "tools/call", "name": "ex_sha256", "arguments": {"capvend_payment": "cvp_..."},
//	             "instructions": "..."}},
//	 "isError": true}
//
// structuredContent follows the shape of x402's MCP transport binding
// (resource, accepts), with the first option's fields at the top. A
// retry with the token before the payment arrived gets the same kind of
// result with "error": "payment_pending", "retry_after" and the expiry;
// after it, the call's result, once (see vend.CallRequest.PaymentToken
// for the refusals). A priced prompts/get or resources/read has no tool
// result: it is answered with the JSON-RPC error 402 "Payment Required"
// (or "Payment Pending"), outside the range MCP reserves (x402's MCP
// binding uses 402), whose data is that structuredContent plus "text";
// the token goes back in _meta["capvend/payment"].
//
// Config.LegacyGatingCode (payments.legacy_gating_code, deprecated, for
// one release) restores the previous behaviour: no capability check (a
// client gets notifications unless it asks for explicit gating), explicit
// gating answered with -32042/-32043, no tokens, no capvend_payment in
// tool schemas.
//
// # Elicitation
//
// A call's vend.CallRequest.Elicit relays an upstream's request for input
// to the client. The Vendor call runs on its own goroutine; the handler
// waits for its result or an elicitation. A client on protocol 2026-07-28
// that declared the elicitation capability gets an input_required result
// (one input request, "capvend/elicit") whose requestState is a fresh
// random token (256 bits); its retry with inputResponses and that
// requestState continues the same Vendor call (no new quote or charge),
// and waits again. A token is good once, for the client (Config.ClientID
// or session; an anonymous client: from the same Source) it was issued
// to, until Config.ElicitTimeout; anything else
// is -32602 "Unknown or expired request state". It continues only the call
// it was issued for: a retry with another tool or other canonical
// arguments (vend.CanonicalHash) is -32600 "Invalid Request: request id
// reused with different parameters" and leaves the call waiting for the
// right retry. An unanswered elicitation gets "cancel" at the timeout.
// A call's own pay page is asked for the same way (askPayPage), its ask
// expiring with the call's invoice instead. At
// most Config.MaxElicitsPerClient elicitations wait per Source and
// Config.MaxElicits in all; beyond, the upstream gets "cancel" at once and
// the client the call's outcome (never an error in its place: the call may
// be paid, and a client without a session cannot ask for it again). A client on an
// earlier protocol is asked with a server-initiated elicitation/create
// within the same request; a failure there is answered "cancel". A client
// without the capability is not asked: the answer is "decline". If the
// client leaves while the handler waits, the call is cancelled as before
// (a paid call still runs to its end in the Vendor).
//
// # HTTP: sessions, origins, token, write deadlines
//
// Every HTTP request is checked in this order, each refusal answered with
// a JSON-RPC error body (id null unless the request's id is known):
//
//   - Origin: a request whose Origin header is not in
//     Config.AllowedOrigins (default: http(s)://localhost, 127.0.0.1 and
//     [::1] on any port) gets 403, -32000. A request without Origin (any
//     client that is not a browser) passes.
//   - Token: with Config.BearerToken, a request without "Authorization:
//     Bearer <token>" gets 401 with WWW-Authenticate: Bearer, -32000. Only
//     the token's SHA-256 is kept and compared in constant time.
//   - Body: larger than MaxBodyBytes, 413.
//   - Session (protocols before 2026-07-28): only session ids this Server
//     issued at initialize are served. A request without Mcp-Session-Id
//     (other than initialize) gets 400, -32000; an id never issued, ended
//     by DELETE, idle (no request in flight) for Config.SessionIdle, or
//     evicted, gets 404, -32001 "Session not found" (the client must
//     initialize again). Each session belongs to the Source of its
//     initialize, which holds at most Config.MaxSessionsPerSource: beyond
//     that, its initialize evicts its own session idle the longest, and
//     gets 429, -32000, with Retry-After, when each of its sessions has a
//     request in flight. At most Config.MaxSessions live at once: a new
//     initialize evicts the session idle the longest of the source
//     holding the most sessions (one source flooding initialize evicts
//     its own, not others'), and gets 503, -32000, with Retry-After, only
//     when every session has a request in flight. Ids are 256 random bits. Requests of protocol 2026-07-28
//     have no session (an Mcp-Session-Id is ignored): each is its own
//     client. With Config.Sessions (instances sharing a ledger) a session
//     another instance issued is served too: an id not live here, of the
//     issued form, is looked up in the store (by its SHA-256), and made
//     live here when the store has it unexpired. Each session's idle
//     expiry is written there at its first request after initialize and
//     again each half SessionIdle it is active, so elsewhere it ends
//     between SessionIdle/2 and SessionIdle after its last request; a
//     DELETE ends it in the store (an instance where it is live still
//     serves it until it is idle there). mcp-go serves a request of such a
//     session in an ephemeral session of the same id, so its calls are the
//     same client's: a request sent again (same id) gets the stored answer
//     of a paid call.
//
// With Config.WriteTimeout, every write of a response first moves the
// connection's write deadline to now + WriteTimeout: a stream may stay
// quiet while its call waits for a payment, but a client that stops
// reading is cut off.
//
// # Who a request counts as
//
// Client makes request ids unique: the session for a legacy client, so a
// repeated request of the same session is a replay; session-less clients
// are Anonymous, their request ids are never matched across requests and
// an explicit-gating grant is released only by its preimage or its payment
// token. Source is who
// the request counts as for the Vendor's limits, unpaid quotes and free
// quotas, and a client cannot pick it: "ip:<address>" of the TCP peer (an
// IPv6 client by its /64);
// when the peer is one of Config.TrustedProxies, the right-most
// X-Forwarded-For address that is not a trusted proxy (the peer's own if
// there is none); when Config.ClientIDHeader is set (only together with
// TrustedProxies) and a trusted proxy sent it, "id:<value>". Parked
// elicitations are bounded by Source too.
//
// # Prompts and resources
//
// With a Config.Catalog, prompts/list, prompts/get, resources/list,
// resources/templates/list and resources/read are served. When the Vendor
// is an ItemPricer, a priced prompt, resource or resource template is
// listed with the same _meta["capvend/price"] as a priced tool, and a
// prompts/get of it (resources/read of the URI, or of a URI matching the
// template) is sold through Vendor.CallTool exactly like a tools/call
// (CallRequest.Kind KindPrompt or KindResource, Tool the prompt name or
// URI, the same _meta keys, payment notifications on the request's stream,
// the same JSON-RPC errors; explicit gating as 402, see above).
// The others are served for free, nothing recorded: definitions as the Catalog gives them (names, URIs and URI
// templates as listed), results converted from the Catalog's JSON to
// mcp-go's typed results (its handlers take no raw JSON) and back, which
// keeps every member mcp-go models (tested against the JSON for text,
// image and embedded-resource messages, annotations, _meta, text and blob
// contents); a resources/read result's own _meta and cache hints are not
// passed on (mcp-go's resource handlers return only the contents). A read
// of a URI neither listed nor matching a listed template, or a get of an
// unlisted prompt, is refused by mcp-go. Catalog errors wrapping
// vend.ErrUpstream become -32054 "Upstream server failed"; others -32603.
// Refresh registers only what changed, so clients get
// notifications/prompts/list_changed or notifications/resources/list_changed
// only then.
//
// # How it is done on mcp-go v1.2.1
//
// mcp-go turns every tool-handler error into -32603 with the error's text as
// message, and has no way to set a code or data. So the handler returns an
// error whose text is a marker (a per-Server random nonce plus the encoded
// error), and the writers under mcp-go (the http.ResponseWriter given to its
// handler, the io.Writer given to its stdio server) replace such a message
// with the real error. Results are passed the same way: the handler returns a
// placeholder carrying the body, and the writer puts the body back, so that
// mcp-go never re-encodes it. Nothing else is touched.
//
// Notifications: Notify writes the notification on the call's own stream,
// before its result: over stdio directly on the output; over Streamable
// HTTP on the POST's response, which it upgrades to SSE (and tells mcp-go's
// session to finish as SSE). mcp-go's SendNotificationToClient is not used:
// in v1.2.1 it drops a "_meta" member of params, its POST forwarder can drop
// a notification queued just before the handler returns (seen in tests),
// and before protocol 2026-07-28 a session's GET and POST streams read the
// same queue, so a notification may go out on either.
//
// Sessions: mcp-go v1.2.1's default session id manager only checks an id's
// format. The Server gives mcp-go a SessionIdManagerResolver whose manager
// knows the issued ids (Validate fails for any other: mcp-go answers 404),
// and checks every request itself before mcp-go sees it, to answer with
// JSON-RPC bodies and to count requests in flight. mcp-go drops its own
// state of a session only on DELETE, so an expired or evicted session is
// sent a DELETE in process.
//
// With protocol 2026-07-28 a -32600 or -32602 error is answered with HTTP
// 400, as mcp-go does for its own errors; other errors with 200.
//
// Free calls (fastfree.go): when the Vendor is a FreeCaller, a tools/call
// of protocol 2026-07-28 from a client that cannot elicit, which mcp-go
// would serve as is, is first offered to Vendor.CallFree, before mcp-go
// sees it; if the Vendor serves it (free outright, on an upstream it can
// call raw) the front writes the answer mcp-go and the writers above
// would have written, byte for byte. Everything else goes through mcp-go.
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
	Tools() []vend.Tool
	// CallTool runs one priced call; errors are vend's sentinel and typed
	// errors (anything else is reported as an internal error).
	CallTool(ctx context.Context, r vend.CallRequest) (vend.CallResult, error)
}

// PriceRanger is an optional ability of a Vendor: the listed price range of
// a tool whose price depends on its arguments.
type PriceRanger interface {
	// ListedPrice returns the least and most a call of t can cost.
	ListedPrice(t vend.Tool) (lo, hi vend.Msat)
}

// ItemPricer is an optional ability of a Vendor: it sells prompts and
// resources (vend's Vendor implements it). A prompt or resource it prices
// above 0 is listed with its price and served through Vendor.CallTool
// (CallRequest.Kind), paid like a tool; the others stay free.
type ItemPricer interface {
	// ItemPrice returns the least and most a prompts/get (KindPrompt,
	// the exposed name) or resources/read (KindResource, a URI or URI
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
	// Source in the package doc) and in total; beyond, the upstream gets
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
	// (see Source in the package doc): beyond it, the source's
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
	// ClientIDHeader) are believed: see Source in the package doc.
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
// can receive it (see the package doc). It also re-reads the Catalog, if
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
	credit := slices.ContainsFunc(vt, func(t vend.Tool) bool { return t.Name == vend.TopUpTool })
	for _, t := range vt {
		tools = append(tools, server.ServerTool{Tool: s.toMCPTool(t, ranger, credit), Handler: s.handleCall})
	}
	s.mcp.SetTools(tools...)
}

func (s *Server) toMCPTool(t vend.Tool, ranger PriceRanger, credit bool) mcp.Tool {
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
// size and session first (see the package doc), and listens nowhere by
// itself. mcp-go rejects requests arriving on a loopback connection with a
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
