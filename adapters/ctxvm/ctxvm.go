// Package ctxvm is capvend's Nostr front: it serves the Vendor's priced
// tools to MCP clients that talk through Nostr relays, in the ContextVM
// dialect (the @contextvm/sdk client transport and compatible ones) and in
// the three DVMCP dialects (2025-03-26 rev1 and rev1.1, and the NIP-90 form
// of 2024-11-05). Each request is answered in its own dialect and kinds.
// It translates requests to Vendor calls and the Vendor's answers back to
// events; it knows nothing of billing or the ledger.
//
// # Wire
//
// The server subscribes, on every configured relay, to kinds 25910 and
// 5910 (and 1059 and 21059 gift wraps unless encryption is disabled)
// tagged ["p", <server pubkey>], created since Config.Window before it
// started. Relays store 1059 wraps and 5910 job requests: those made
// before the server started are dropped (a restart would answer them
// again and re-run free calls). go-nostr's pool drops an event id it has
// seen in the last minute or so; a copy arriving while the first is being
// served is dropped too. Later, a replayed tools/call, prompts/get or
// resources/read is answered with the stored first answer (Config.Replies,
// kept in the ledger across restarts; errors are not kept), and a priced
// call is anyway the same vend call (same RequestID), never charged
// twice. So a client repeating a call (explicit gating) must send a new
// event: the same content, tags and created_at second make the same
// event. Every answer is signed with the server key and tagged
// ["p", <client pubkey>] and ["e", <request event id>]. It is published to
// every relay; publishing succeeds when one relay accepts it (the others
// still get it). A relay that is down does not stop the service:
// go-nostr's SimplePool reconnects and resubscribes (since the time the
// connection broke). The first event to a client not answered before is
// held for Config.FirstAnswerDelay (200 ms): a relay may register a
// client's subscription after handling its first request (khatru handles
// each message on its own goroutine), and an ephemeral answer published
// before that is lost.
//
// # Dialects
//
// The dialect is read from each request (kind, content, tags):
//
//	kind 5910                                   NIP-90 (DVMCP 2024-11-05)
//	kind 25910, content without "jsonrpc"       DVMCP rev1.1
//	kind 25910, "jsonrpc":"2.0" and a method tag DVMCP rev1
//	kind 25910, "jsonrpc":"2.0", no method tag  ContextVM
//
// An s tag alone decides nothing (ContextVM drafts use it too). A method
// tag must equal the content's method.
//
// ContextVM: requests and answers are kind 25910, content the full
// JSON-RPC message ("jsonrpc":"2.0" and the request's id; a request
// without an id is a notification and gets no answer). Notifications from
// the Vendor (payment_required {amount, pay_req, pmi, description, ttl},
// payment_accepted, payment_rejected, progress ...) are kind 25910 JSON-RPC
// notifications tagged p and e.
//
// DVMCP rev1: requests kind 25910 tagged ["method", m] (and usually
// ["s", <server id>], not checked); answers kind 26910 tagged p and e,
// content the full JSON-RPC response; MCP notifications kind 21316 tagged
// p, e and ["method", m], content the JSON-RPC notification. Payment
// notifications are DVMCP's tag-only kind 21316 events:
//
//	payment_required  content "", ["status","payment-required"], ["amount","<sats>","<bolt11>"], ["invoice","<bolt11>"]
//	payment_accepted  content "", ["status","payment-accepted"], ["amount","<sats>"]
//	payment_rejected  content the reason, ["status","error"]
//
// The amount tag is the rev1 spec's (a spec client finds the bolt11 at
// amount[2]); the DVMCP bridge's discovery client reads the bolt11 from
// the invoice tag only (it never reads amount), so both find it. The
// bridge itself writes ["amount", price, unit]: its unit is always sats
// here, which the spec defines as the amount's unit. An option without a
// bolt11 (Cashu only) has ["amount","<sats>"] and ["pmi", <pmi>].
//
// DVMCP rev1.1: as rev1, but contents are simplified: a request is
// {"method", "params"} (an id, if any, is ignored), an answer is the
// result itself at the root ({} for ping) or {"error": {code, message}},
// a notification {"method", "params"}. A method starting with
// "notifications/" gets no answer.
//
// NIP-90: a kind 5910 with ["c","list-tools"] (content empty or JSON) is
// tools/list; ["c","execute-tool"] with content {"name", "parameters",
// "_meta"?} is tools/call with arguments = parameters (_meta as in
// tools/call below); another c is answered "Method not found". The answer
// is a kind 6910 tagged ["c","<command>-response"], p and e, content the
// result at the root. An execute-tool ends with kind 7000 feedback first,
// ["status","success"], or ["status","error","<message>"] when the call
// failed (the 6910 then is {"content":[{"type":"text","text":
// "<message>"}],"isError":true} tagged ["status","error"]) or the tool
// reported isError. Payment notifications become kind 7000 feedback:
// payment_required ["status","payment-required"] ["amount","<millisats>",
// "<bolt11>"], payment_accepted ["status","processing"], progress
// ["status","processing","<message>"], payment_rejected
// ["status","error","<reason>"]; other notifications are not sent.
// Untargeted job requests (no p tag) are not served.
//
// List answers carry one cap tag per priced tool: ["cap","tool:<name>",
// "<amount>","sats"] for ContextVM, ["cap","<name>","<amount>","sats"]
// (the DVMCP form) for the others. When the Vendor is an ItemPricer,
// prompts/list, resources/list and resources/templates/list answers carry
// one ["cap","prompt:<name>","<amount>","sats"] or
// ["cap","resource:<uri or URI template>","<amount>","sats"] per priced
// entry, whose definition also gets _meta["capvend/price"]; a prompts/get
// or resources/read of a priced prompt or resource is a vend.CallRequest
// like a tools/call (Kind KindPrompt or KindResource, Tool the prompt name
// or URI, the same Client, RequestID, tags and _meta), with the same
// notifications and errors.
//
// # Inbound checks
//
// Every dialect and wrapping gets the same checks. An event is dropped,
// with no answer, when its id or signature is wrong (the inner event's
// too, for a gift wrap; for a NIP-59 rumor, the seal's signature, the
// rumor's author being the seal's signer and its id its hash), its
// created_at (the request's, inside any wrap) is further than
// Config.Window from now, a content (at any layer) is larger than
// Config.MaxContentBytes, its content is not valid JSON in its dialect's
// form (one JSON object; "jsonrpc", when present, "2.0"; a string or
// number id), a method tag disagrees with the content, it is not tagged p
// with the server's pubkey, or when Config.MaxInFlight requests are being
// served already (a call waiting for its payment counts only until its
// payment_required: see Proof of work and load). Notifications and
// responses from clients get no answer;
// a ContextVM response may answer an elicitation (see Elicitation).
//
// # Methods
//
//	initialize                 InitializeResult: protocolVersion (the client's when known, else 2025-11-25),
//	                           capabilities {tools:{listChanged:true}} (and prompts, resources
//	                           alike with a Catalog),
//	                           serverInfo {name, version}
//	notifications/initialized  no answer
//	ping                       {}
//	tools/list                 {tools:[...]} and the cap tags
//	tools/call                 a vend.CallRequest (below)
//	prompts/list               {prompts:[...]}            from Config.Catalog; not paginated;
//	resources/list             {resources:[...]}          cap tags of the priced entries
//	resources/templates/list   {resourceTemplates:[...]}
//	prompts/get                the Catalog's GetPromptResult, verbatim (priced: sold as above)
//	resources/read             the Catalog's ReadResourceResult, verbatim (priced: sold as above)
//	completion/complete        forwarded to a Catalog that is a Completer; else no suggestions,
//	                           {"completion":{"values":[]}} (no upstream completes yet).
//	                           Params without ref or argument.name: -32602 "Invalid params"
//	anything else              error -32601 "Method not found"
//
// The first answer to a client (by pubkey, since the server started) and
// every initialize answer carry the discovery tags name, about, website,
// picture (those configured), support_encryption and
// support_encryption_ephemeral (unless encryption is disabled) and one pmi
// tag per payment method of Config.PMIs.
//
// A tools/call becomes a vend.CallRequest with Transport "nostr-ctxvm"
// (ContextVM), "nostr-dvmcp" (rev1, rev1.1) or "nostr-nip90", Client the
// client's pubkey (hex; a NIP-59 rumor's, which is its seal's signer),
// RequestID the request event's id (a NIP-59 rumor's id), so a replayed
// event, even after a restart, is the same call in the ledger and is
// answered from the stored result, never charged twice. Tool and
// Arguments from params ({} when absent), ProgressToken
// params._meta.progressToken, CashuToken params._meta["capvend/cashu"],
// PaymentProof params._meta["capvend/preimage"], RefundInvoice
// params._meta["capvend/refund_invoice"], PMIs the request's
// ["pmi", ...] tags (and params._meta["capvend/pmi"]), Explicit when the
// request has ["payment_interaction","explicit_gating"] (or
// params._meta["capvend/payment_interaction"] is "explicit_gating"). The
// Vendor's notifications are published in the request's dialect, in
// order, before the answer. A ContextVM call also gets Elicit (see
// Elicitation); DVMCP and NIP-90 calls do not (an upstream asking for
// input is declined).
//
// Errors map to the same JSON-RPC errors as the MCP front
// (adapters/mcpfront):
//
//	vend.ErrUnknownTool           -32602 "Unknown tool: <name>"
//	*vend.InvalidParamsError      -32602 "Invalid params: <reason>"
//	*vend.PaymentRequiredError    -32042 "Payment Required"  data {instructions, payment_options}
//	*vend.PaymentPendingError     -32043 "Payment Pending"   data {instructions, retry_after}
//	vend.ErrPaymentExpired        -32050 "Payment expired"
//	vend.ErrPaymentFailed         -32051 "Payment failed"
//	vend.ErrNoPaymentMethod       -32052 "No payment method in common"
//	vend.ErrLimit                 -32053 "Limit reached"
//	vend.ErrUpstream              -32054 "Upstream server failed"
//	*vend.WorkRequiredError       -32055 "Proof of work required" data {difficulty, work, instructions}
//	anything else                 -32603 "Internal error"
//
// Bad tools/call params (not an object, no name) are -32602 "Invalid
// params". No internal detail reaches the client; the full error is logged.
// NIP-90 clients get the message (not the code or data) in the 7000 error
// feedback and the 6910's text.
//
// Catalog entries are listed as the Catalog gives them, with their name,
// uri or uriTemplate member set to the listed one and a missing name set
// to the URI (MCP requires it); an entry whose definition is not a JSON
// object, or a second one of the same key, is left out. prompts/get of a
// prompt not listed is -32602 "Unknown prompt: <name>"; resources/read of
// a URI neither listed nor matching a listed template (RFC 6570) is -32602
// "Unknown resource: <uri>"; so is everything without a Catalog, whose
// lists are empty. Catalog errors wrapping vend.ErrUpstream are -32054
// "Upstream server failed", other errors and results that are not JSON
// objects -32603 "Internal error".
//
// # Proof of work and load
//
// Every vend.CallRequest carries Work, the request event's NIP-13 proof
// of work: the leading zero bits of its id (the signed request inside a
// ContextVM gift wrap, the rumor of a NIP-59 one), counted only when a
// ["nonce", <n>, <target>] tag commits to a target, and then only up to
// the target (a target above what the id shows counts 0). WorkRequired is
// Config.PowDifficulty (nostr.pow_difficulty); the Vendor refuses a
// request with less that would get a free call or an unpaid quote
// (-32055 "Proof of work required", data {difficulty, work,
// instructions}); a request paying with a Cashu token needs none.
//
// Config.MaxInFlight bounds the requests being served, not the calls
// waiting for a payment: a request gives its slot back when the Vendor
// sends its payment_required, so a flood of unpaid quotes cannot drop
// new clients' events. Waiting calls are bounded by the Vendor (vend's
// MaxUnpaidTotal, which withdraws the oldest quote of the busiest client
// to make room; vend's MaxUnpaidPerClient counts per pubkey).
//
// Requests of clients that paid before (PayerLister), and with
// PowDifficulty those that did the work, also come by subscriptions of
// their own, so they do not queue behind a flood's events inside
// go-nostr (see Lanes in lanes.go); each event is served once.
//
// # Encryption
//
// A kind 1059 or 21059 (ephemeral: relays do not store it) event is a gift
// wrap: its content is NIP-44 v2 ciphertext (conversation key of the
// server key and the wrap's pubkey). What it holds decides the scheme:
//
// ContextVM: the client's signed request itself (no seal). The inner event
// gets every check above, its own id and signature included.
//
// DVMCP (NIP-59): a kind 13 seal signed by the client (id and signature
// checked), whose content is NIP-44 ciphertext from the client to the
// server of an unsigned rumor: the request itself (kind 25910 or 5910, as
// the DVMCP packages send it) or a kind 14 whose content is the request
// as an event template {"kind","tags","content"}. The rumor's pubkey must
// be the seal's, and its id must be present and its hash. Note that the
// DVMCP packages seal with a random key (so the sender is not
// authenticated) and leave the rumor's id out: such requests are refused.
//
// An encrypted request is answered encrypted, the same way: ContextVM,
// each answer signed by the server, wrapped; NIP-59, each answer as an
// unsigned rumor with its id (a kind 14 carrying the answer as a template
// when the request came so), sealed (kind 13, signed by the server, NIP-44
// from the server to the client), wrapped. Wraps are signed by a fresh
// random key, tagged ["p", <client>], created_at now (clients subscribe
// since their request: NIP-59's randomised timestamps would hide
// answers); seals too. Answers are wrapped in kind 21059 when the request
// carries a support_encryption_ephemeral tag (any value but "false"),
// else in 1059. With EncryptionDisabled wraps are ignored (not
// subscribed); with EncryptionRequired a plaintext request is answered
// with error -32600 "Encryption required" in its dialect (notifications
// are dropped).
//
// # Access lists
//
// With Config.Deny, requests from those pubkeys are refused; with
// Config.Allow (when not empty), requests from any other pubkey are;
// Deny wins. The sender is the signed request's author: for a gift wrap,
// the inner event's (the wrap's key is random). A refused request is
// answered with error -32600 "Forbidden" (so a client learns why, instead
// of waiting); a refused notification is dropped, as every notification
// is. A refused request never reaches the Vendor.
//
// # Announcements
//
// With Config.Announce, Run publishes the server's announcements once it
// started, and again AnnounceDelay after a Refresh (Refreshes meanwhile
// coalesce into one round; Refresh itself never blocks). Each round
// rebuilds them from the Vendor's tools and listed prices and the Catalog
// as they are then, and publishes only those whose content or tags differ
// from what it last published at that address (kind, and d tag for
// addressable kinds); a republished one's created_at is always later than
// the one it replaces. A publication succeeds on the first relay's OK; a
// failed one is logged and tried again at the next round, which comes
// after a backoff (5 s, doubling to 5 min) if no Refresh comes sooner.
// Publishing runs on a goroutine Run starts, and stops (Run waits for it)
// when Run's context ends.
// The events (resources, templates and prompts only with a Catalog):
//
//	ContextVM (CEP-6, replaceable):
//	11316  server: content the initialize result; tags name, about, website,
//	       picture, support_encryption, pmi (as on a first answer) and
//	       ["cap","tool:<name>","<sats or lo-hi>","sats"] per priced tool
//	11317  tools: content the tools/list result; the same cap tags
//	11318  resources {"resources":[...]}; 11319 resource templates
//	       {"resourceTemplates":[...]}; 11320 prompts {"prompts":[...]};
//	       priced entries with _meta["capvend/price"] and a cap tag each
//	       (["cap","resource:<uri>",...], ["cap","prompt:<name>",...])
//	10002  NIP-65 relay list: ["r", <url>] per relay of Config.Relays
//	DVMCP (2025-03-26 rev1.1, addressable; content the bare result, as rev1.1
//	and the DVMCP bridge, not rev1's JSON-RPC envelope):
//	31316  server: content the initialize result; ["d", <id>], ["k","25910"],
//	       the discovery tags with ["support_encryption","true"]
//	31317  tools: ["d","<id>/tools/list"], ["s",<id>], per tool
//	       ["cap",<name>] or, priced, ["cap",<name>,"<sats or lo-hi>","sats"]
//	31318  resources: ["d","<id>/resources/list"], ["s",<id>],
//	       ["cap",<name>] per resource; and resource templates (as rev1.1):
//	       ["d","<id>/resources/templates/list"], ["s",<id>], ["cap",<name>]
//	31319  prompts (31319 is prompts here, templates in ContextVM):
//	       ["d","<id>/prompts/list"], ["s",<id>], ["cap",<name>] per prompt
//	       (priced prompts and resources: ["cap",<name>,"<sats>","sats"])
//	DVMCP 2024-11-05 (NIP-89):
//	31990  content {"name","about","tools":[...]}; ["d",<id>], ["k","5910"],
//	       ["capabilities","mcp-1.0"], ["t","mcp"], ["t",<tool>] per tool
//
// <id> is ServerID: the server's pubkey (hex), stable across renames.
// AnnouncementAddresses lists every address; Unannounce publishes a NIP-09
// deletion request of them all (`capvend unannounce`). The relay list
// replaces any other NIP-65 list of the key: use a key of its own.
//
// # Elicitation
//
// An upstream asking for input during a ContextVM tools/call (an MCP
// elicitation) is relayed to the call's client as a JSON-RPC request of
// the server, published through the call's outbox (after the
// notifications before it, before the answer; gift wrapped iff the call
// came wrapped, in the kind of the call's answers):
//
//	kind 25910, tags ["p", <client>], ["e", <tools/call event id>]
//	{"jsonrpc":"2.0","id":"<64 hex: 256 random bits>","method":"elicitation/create","params":<the upstream's params>}
//
// The id is the server's own (the upstream's is never shown), unguessable
// and used once. The answer is the client's JSON-RPC response with that
// id, as a kind 25910 (plaintext or in a gift wrap) signed by the SAME
// pubkey the request went to and tagged ["p", <server>]; an e tag is not
// needed and not read:
//
//	{"jsonrpc":"2.0","id":"<the id>","result":{"action":"accept","content":{...}}}   (or "decline", "cancel")
//	{"jsonrpc":"2.0","id":"<the id>","error":{...}}
//
// It gets every inbound check (signature, window, size; with
// EncryptionRequired it must come wrapped). A response whose id no
// elicitation of that pubkey waits for (unknown, answered already, another
// client's) is dropped; so are responses in the DVMCP dialects. The
// upstream gets the result as {action, content} (content only on accept,
// and only a JSON object); an error response, a result that is not an
// ElicitResult, no answer within Config.ElicitTimeout (default 10 min),
// the call's end, or too many elicitations waiting (4 per client, 1000 in
// all) fail the upstream's elicitation (capvend's upstream client then
// answers it "cancel"); nothing of that reaches the client.
//
// Only clients whose last initialize declared capabilities.elicitation are
// asked (the server remembers it per pubkey, in memory: a client that
// skips initialize, or initialized before a restart, is not asked); for
// others, and for params that are not a JSON object, the upstream is
// answered "decline" at once.
//
// The stock @contextvm/sdk client (0.11.14) cannot answer: its transport
// drops a server's JSON-RPC request ("Received unsupported JSON-RPC message
// type"), so a call that elicits waits until the client's own request
// timeout; the stock server never sends one either.
//
// # list_changed
//
// The initialize result advertises listChanged for tools (and prompts and
// resources with a Catalog). AnnounceDelay after a Refresh (Refreshes
// meanwhile coalesced), Run compares the lists with those of the last
// comparison (the first: when Run started): the tools/list result and its
// cap tags (names, schemas, prices), the Catalog's prompts, and its
// resources with their templates. For each list that changed, each
// ContextVM client whose request was served within Config.Window (at most
// the 1000 most recent) gets a notification, as the stock server sends
// them:
//
//	kind 25910, tags ["p", <client>] (no e tag)
//	{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}   (prompts/list_changed, resources/list_changed)
//
// gift wrapped (in the kind of the answers to it) iff the client's last
// request came wrapped. It runs on a goroutine of Run (Refresh never
// blocks); failures are logged, not retried, and a round stops after 3
// failures in a row. DVMCP and NIP-90 clients are not notified.
//
// DVMCP initialize answers carry ["d", ServerID] (clients name the server
// with it in later requests' s tags).
//
// Not done yet: oversized transfer (CEP-22).
package ctxvm

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// Event kinds.
const (
	KindMessage  = 25910 // a ContextVM JSON-RPC message
	KindGiftWrap = 1059  // a NIP-44 encrypted, signed KindMessage
)

// Transport is vend.CallRequest.Transport of calls arriving here.
const Transport = "nostr-ctxvm"

// Defaults of Config fields left zero.
const (
	DefaultWindow           = 5 * time.Minute
	DefaultMaxContentBytes  = 64 << 10
	DefaultPublishTimeout   = 10 * time.Second
	DefaultShutdownGrace    = 30 * time.Second
	DefaultMaxInFlight      = 1_000
	DefaultFirstAnswerDelay = 200 * time.Millisecond
	DefaultAnnounceDelay    = time.Second
	latestProtocol          = "2025-11-25"
)

// Encryption is the server's encryption policy.
type Encryption string

const (
	EncryptionOptional Encryption = "optional" // answer encrypted iff asked encrypted
	EncryptionRequired Encryption = "required" // refuse plaintext requests
	EncryptionDisabled Encryption = "disabled" // ignore gift wraps
)

// Vendor sells tool calls. vend's engine implements it.
type Vendor interface {
	// Tools returns the exposed tools with their prices.
	Tools() []vend.Tool
	// CallTool runs one priced call; errors are vend's sentinel and typed
	// errors (anything else is reported as an internal error).
	CallTool(ctx context.Context, r vend.CallRequest) (vend.CallResult, error)
	// ListedPrice returns the least and most a call of t can cost.
	ListedPrice(t vend.Tool) (lo, hi vend.Msat)
}

// PayerKnower is what a Vendor may also do: tell whether a client (a
// pubkey) paid for a call before. Such a client's requests still enter
// when MaxInFlight requests are in flight, up to a reserve of a tenth
// more: identities are free on Nostr, a payment history is not.
type PayerKnower interface {
	KnownPayer(client string) bool
}

// Catalog is the free, pass-through part of what the server offers:
// prompts, resources and resource templates (the same contract as
// mcpfront.Catalog).
type Catalog interface {
	// Prompts returns the prompts to list now (not modified by the caller).
	Prompts() []vend.Prompt
	// GetPrompt renders the prompt listed as name with args and returns an
	// MCP GetPromptResult as JSON. Errors wrapping vend.ErrUpstream are
	// answered as such; any other as an internal error.
	GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error)
	// Resources returns the resources to list now (not modified by the caller).
	Resources() []vend.Resource
	// ResourceTemplates returns the resource templates to list now (not
	// modified by the caller).
	ResourceTemplates() []vend.ResourceTemplate
	// ReadResource reads uri and returns an MCP ReadResourceResult as
	// JSON. Errors as for GetPrompt.
	ReadResource(ctx context.Context, uri string) (json.RawMessage, error)
}

// Config configures a Server.
type Config struct {
	Vendor  Vendor
	Catalog Catalog // prompts and resources; nil: none
	// Replies keeps answers for replays (see ReplyStore); nil: a replay of
	// a free call, prompt or resource read after the go-nostr pool
	// forgot its id is served again.
	Replies   ReplyStore
	SecretKey string   // the server's secret key, 64 hex characters (see LoadSecretKey)
	Relays    []string // ws:// or wss:// URLs; at least one

	Name    string // serverInfo.name and the name tag; "": "capvend"
	Version string // serverInfo.version; "": "dev"
	About   string // discovery tags, omitted when empty
	Website string
	Picture string
	PMIs    []string // payment methods the server takes, advertised in pmi tags

	Encryption Encryption // "": EncryptionOptional
	// Window is how far created_at may be from now. 0: DefaultWindow.
	Window time.Duration
	// MaxContentBytes bounds an event's content (a gift wrap's too).
	// 0: DefaultMaxContentBytes.
	MaxContentBytes int
	// PublishTimeout bounds one publication. 0: DefaultPublishTimeout.
	PublishTimeout time.Duration
	// ShutdownGrace is how long Run lets requests in flight finish after
	// its context ends. 0: DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// FirstAnswerDelay holds the first event to a client not answered
	// before for this long. Relays handle a client's subscription and
	// its first request concurrently (khatru runs each message on its own
	// goroutine), and kind 25910 is ephemeral: an answer published
	// before the client's subscription is in place is lost, and the
	// client waits for nothing. 0: DefaultFirstAnswerDelay; negative:
	// none.
	FirstAnswerDelay time.Duration
	// MaxInFlight bounds the requests being served at once: parsed,
	// quoted, run, answered. A call waiting for its payment holds no
	// slot from its payment_required on (the Vendor bounds those: vend's
	// MaxUnpaidTotal, shedding the oldest), so unpaid quotes cannot
	// starve new requests. Events arriving beyond it are dropped, but
	// those of a client the Vendor knows paid before (see PayerKnower),
	// which have a reserve of a tenth more. 0: DefaultMaxInFlight.
	MaxInFlight int
	// PowDifficulty is the NIP-13 proof of work (leading zero bits of the
	// request event's id, committed in its nonce tag) required of a
	// request that gets a free call or an unpaid quote; 0: none. See
	// Proof of work in the package doc.
	PowDifficulty int

	// slowMain, when set, drops the events of the main subscription it
	// returns true for, as if they were still queued there (tests of the
	// lanes, lanes.go).
	slowMain func(*nostr.Event) bool

	// Announce publishes the announcements (see the package doc) at start
	// and after each Refresh that changed them.
	Announce bool
	// AnnounceDelay is how long after a Refresh the announcements are
	// rebuilt (Refreshes meanwhile are coalesced). 0: DefaultAnnounceDelay.
	AnnounceDelay time.Duration
	// ElicitTimeout is how long a ContextVM client has to answer an
	// elicitation (see the package doc, Elicitation).
	// 0: DefaultElicitTimeout.
	ElicitTimeout time.Duration
	// Allow, when not empty, is the only clients (hex pubkeys) served;
	// Deny is clients never served (it wins over Allow). See the package
	// doc, Access lists.
	Allow, Deny []string

	Logger *slog.Logger     // nil: slog.Default()
	Now    func() time.Time // nil: time.Now
}

// Server is the ContextVM front. Create it with New, run it with Run.
type Server struct {
	cfg  Config
	log  *slog.Logger
	pk   string            // our pubkey, hex
	priv *btcec.PrivateKey // our key, parsed once
	keys keyCache          // clients' parsed pubkeys

	// publish sends one event to the relays (tests replace it).
	publish func(ctx context.Context, ev nostr.Event) error
	// sleep waits d or until ctx ends (tests replace it).
	sleep func(ctx context.Context, d time.Duration)

	mu       sync.Mutex
	seen     map[string]bool // clients that got their discovery tags
	inflight map[string]bool // replay keys of requests being served (see startReplay)

	ready chan struct{} // closed once every relay confirmed the subscription
	slots chan struct{} // one token per request in flight
	// paying holds the tokens of requests of known payers let in beyond
	// MaxInFlight (see PayerKnower).
	paying chan struct{}

	// started is when Run started: gift wraps older than that are
	// relays' stored copies of requests a previous run had.
	started nostr.Timestamp

	ann     announcer    // announcements (announce.go)
	access  accessList   // Config.Allow and Deny (access.go)
	sess    sessionStore // ContextVM clients (sessions.go)
	lists   listWatch    // list_changed (sessions.go)
	elicits elicitations // elicitations waiting for an answer (elicit.go)
}

// slotKey is the context key of the function that gives a request's
// MaxInFlight slot back before the request ends (see outbox.notify).
type slotKey struct{}

// Log attribute keys.
const (
	logKeyClient = "client"
	logKeyEvent  = "event"
	logKeyMethod = "method"
	logKeyTool   = "tool"
	logKeyCode   = "code"
	logKeyErr    = "err"
	logKeyRelay  = "relay"
	logKeyReason = "reason"
)

// maxSessions bounds the memory of which clients got discovery tags; when
// full it is cleared (a client then gets the tags once more).
const maxSessions = 100_000

// New checks cfg and returns a Server. It does no I/O and starts no
// goroutine.
func New(cfg Config) (*Server, error) {
	if cfg.Vendor == nil {
		return nil, errors.New("ctxvm: Vendor is nil")
	}
	if len(cfg.Relays) == 0 {
		return nil, errors.New("ctxvm: no relays")
	}
	if !validSecretKey(cfg.SecretKey) {
		return nil, errors.New("ctxvm: SecretKey is not a valid secret key")
	}
	switch cfg.Encryption {
	case "":
		cfg.Encryption = EncryptionOptional
	case EncryptionOptional, EncryptionRequired, EncryptionDisabled:
	default:
		return nil, fmt.Errorf("ctxvm: unknown encryption %q", cfg.Encryption)
	}
	access, err := newAccessList(cfg.Allow, cfg.Deny)
	if err != nil {
		return nil, err
	}
	if cfg.Window < 0 || cfg.MaxContentBytes < 0 || cfg.PublishTimeout < 0 || cfg.ShutdownGrace < 0 || cfg.MaxInFlight < 0 || cfg.AnnounceDelay < 0 || cfg.ElicitTimeout < 0 {
		return nil, errors.New("ctxvm: negative limit")
	}
	if cfg.Name == "" {
		cfg.Name = "capvend"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxContentBytes == 0 {
		cfg.MaxContentBytes = DefaultMaxContentBytes
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.FirstAnswerDelay == 0 {
		cfg.FirstAnswerDelay = DefaultFirstAnswerDelay
	}
	if cfg.AnnounceDelay == 0 {
		cfg.AnnounceDelay = DefaultAnnounceDelay
	}
	if cfg.ElicitTimeout == 0 {
		cfg.ElicitTimeout = DefaultElicitTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Relays = append([]string(nil), cfg.Relays...)
	pk, err := nostr.GetPublicKey(cfg.SecretKey)
	if err != nil {
		return nil, errors.New("ctxvm: SecretKey is not a valid secret key")
	}
	skBytes, _ := hex.DecodeString(cfg.SecretKey)
	priv, _ := btcec.PrivKeyFromBytes(skBytes)
	s := &Server{cfg: cfg, log: cfg.Logger, pk: pk, priv: priv, seen: map[string]bool{}, inflight: map[string]bool{}, ready: make(chan struct{}),
		slots: make(chan struct{}, cfg.MaxInFlight), paying: make(chan struct{}, max(1, cfg.MaxInFlight/10)), ann: newAnnouncer(), lists: newListWatch(), access: access}
	s.sleep = func(ctx context.Context, d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return s, nil
}

// Refresh tells the server that the tools, their prices or the catalog
// may have changed (an upstream's list_changed, a config reload): Run
// then announces them again and notifies recent ContextVM clients of the
// lists that did change (see the package doc). It never blocks.
func (s *Server) Refresh() {
	s.ann.refresh()
	s.lists.refresh()
}

// PublicKey returns the server's pubkey (hex).
func (s *Server) PublicKey() string { return s.pk }

// Ready is closed once every relay has confirmed the subscription
// (EOSE): requests published after that are seen. It stays open while a
// relay is unreachable. For tests and readiness probes.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// validSecretKey says whether sk is 64 lowercase-or-uppercase hex
// characters of a non-zero key.
func validSecretKey(sk string) bool {
	b, err := hex.DecodeString(sk)
	if err != nil || len(b) != 32 {
		return false
	}
	for _, c := range b {
		if c != 0 {
			return true
		}
	}
	return false
}

// LoadSecretKey reads a secret key from path: an nsec1… (NIP-19) or 64 hex
// characters, surrounded by white space at most. It returns the key as
// lowercase hex. Errors name the path, never the content.
func LoadSecretKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("nostr key: %w", err)
	}
	sk, err := ParseSecretKey(string(b))
	if err != nil {
		return "", fmt.Errorf("nostr key %s: %w", path, err)
	}
	return sk, nil
}

// ParseSecretKey parses an nsec1… or 64-hex secret key (white space around
// it is ignored) and returns it as lowercase hex. The error never contains
// the input.
func ParseSecretKey(s string) (string, error) {
	s = strings.TrimSpace(s)
	bad := errors.New("not an nsec1… or 64-hex secret key")
	if strings.HasPrefix(s, "nsec1") {
		prefix, v, err := nip19.Decode(s)
		if err != nil || prefix != "nsec" {
			return "", bad
		}
		hexKey, ok := v.(string)
		if !ok {
			return "", bad
		}
		s = hexKey
	}
	s = strings.ToLower(s)
	if !validSecretKey(s) {
		return "", bad
	}
	if _, err := nostr.GetPublicKey(s); err != nil {
		return "", bad
	}
	return s, nil
}

// Run subscribes to the relays and serves requests until ctx ends; call it
// once per Server. Then it stops reading, lets requests in flight finish
// for up to ShutdownGrace (their publications included), cancels the rest,
// closes its relay connections and returns nil.
func (s *Server) Run(ctx context.Context) error {
	// The lanes end with the subscription, but one may be connecting to a
	// relay: closing the pool ends that, so they are waited for after.
	var lanesWG sync.WaitGroup
	defer lanesWG.Wait()
	// The pool outlives ctx by the grace period: answers still go out.
	poolCtx, closePool := context.WithCancel(context.WithoutCancel(ctx))
	defer closePool()
	pool := nostr.NewSimplePool(poolCtx, nostr.WithRelayOptions(trustRelays{}))
	defer closeRelays(pool)
	if s.publish == nil {
		s.publish = func(ctx context.Context, ev nostr.Event) error { return s.publishPool(ctx, pool, ev) }
	}

	kinds := []int{KindMessage, KindJobRequest}
	if s.cfg.Encryption != EncryptionDisabled {
		kinds = append(kinds, KindGiftWrap, KindEphemeralGiftWrap)
	}
	// Since the window, not now: relays match live events against since
	// too, and a request replayed after a restart must reach us (vend
	// answers it from the ledger). Relays store gift wraps (kind 1059)
	// and NIP-90 job requests (5910): those made before this run are
	// dropped (see parse), or a restart would answer every request of
	// the last Window again and re-run free calls.
	since := nostr.Timestamp(s.cfg.Now().Add(-s.cfg.Window).Unix())
	s.started = nostr.Timestamp(s.cfg.Now().Unix())
	filter := nostr.Filter{Kinds: kinds, Tags: nostr.TagMap{"p": []string{s.pk}}, Since: &since}

	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	events := pool.SubscribeManyNotifyEOSE(subCtx, append([]string(nil), s.cfg.Relays...), filter, s.ready)
	fast := s.startLanes(subCtx, pool, filter, &lanesWG) // see Lanes in lanes.go
	var seen laneSeen

	// Requests run on work, which ends ShutdownGrace after ctx.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	s.log.Info("contextvm front listening", "pubkey", s.pk, "relays", len(s.cfg.Relays))
	announced := s.startAnnouncing(ctx)
	watched := s.startListWatch(ctx)
loop:
	for {
		var ev *nostr.Event
		select {
		case ev = <-fast: // the lanes first
		default:
			select {
			case <-ctx.Done():
				break loop
			case ev = <-fast:
			case rev, ok := <-events:
				if !ok {
					break loop
				}
				if ev = rev.Event; ev != nil && s.cfg.slowMain != nil && s.cfg.slowMain(ev) {
					continue
				}
			}
		}
		if ev == nil || !seen.admit(ev.ID, time.Now()) {
			continue
		}
		slots := s.slot(ev)
		if slots == nil {
			s.log.Warn("nostr event dropped: too many requests in flight", logKeyEvent, ev.ID)
			continue
		}
		wg.Add(1)
		go func() {
			var once sync.Once
			free := func() { once.Do(func() { <-slots }) }
			defer func() { free(); wg.Done() }()
			ctx := context.WithValue(work, slotKey{}, free)
			if s.knownPayer(ev.PubKey) {
				ctx = vend.Urgent(ctx) // its ledger reads go first
			}
			s.handle(ctx, ev)
		}()
	}
	stopSub()
	<-announced
	<-watched
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	grace := time.NewTimer(s.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		stopWork()
		<-done
	}
	return nil
}

// slot takes a MaxInFlight slot for ev and returns the channel to give
// it back to: s.slots, or when they are all taken and ev's author paid
// before, s.paying; nil when ev is to be dropped. (A gift wrap's author
// is a throwaway key: it gets a slot or nothing.)
func (s *Server) slot(ev *nostr.Event) chan struct{} {
	select {
	case s.slots <- struct{}{}:
		return s.slots
	default:
	}
	if !s.knownPayer(ev.PubKey) {
		return nil
	}
	select {
	case s.paying <- struct{}{}:
		return s.paying
	default:
		return nil
	}
}

// knownPayer reports whether the Vendor knows pubkey paid before (see
// PayerKnower).
func (s *Server) knownPayer(pubkey string) bool {
	pk, ok := s.cfg.Vendor.(PayerKnower)
	return ok && pk.KnownPayer(pubkey)
}

// publishPool publishes ev to every relay and returns nil on the first
// relay's OK (the others still get it, in the background, within
// PublishTimeout), or the last error when none accepted it.
func (s *Server) publishPool(ctx context.Context, pool *nostr.SimplePool, ev nostr.Event) error {
	// Until the first OK the caller's ctx bounds the publication; after
	// it only the timeout does: callers cancel their ctx once we return.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PublishTimeout)
	stop := context.AfterFunc(ctx, cancel)
	results := pool.PublishMany(pctx, s.cfg.Relays, ev)
	var last error = errors.New("no relay")
	for r := range results {
		if r.Error == nil {
			// The caller goes on; the other relays still get the event
			// (a relay still connecting too), within the timeout.
			stop()
			go func() {
				defer cancel()
				for r := range results {
					if r.Error != nil {
						s.log.Debug("relay refused an event", logKeyRelay, r.RelayURL, logKeyErr, r.Error)
					}
				}
			}()
			return nil
		}
		s.log.Debug("relay refused an event", logKeyRelay, r.RelayURL, logKeyErr, r.Error)
		last = r.Error
	}
	stop()
	cancel()
	return last
}

// listTools is the tools/list result and its cap tags.
func (s *Server) listTools() (json.RawMessage, nostr.Tags) {
	type tool struct {
		Name        string          `json:"name"`
		Title       string          `json:"title,omitempty"`
		Description string          `json:"description,omitempty"`
		InputSchema json.RawMessage `json:"inputSchema"`
		Annotations json.RawMessage `json:"annotations,omitempty"`
		Meta        map[string]any  `json:"_meta,omitempty"`
	}
	vt := s.cfg.Vendor.Tools()
	tools := make([]tool, 0, len(vt))
	var tags nostr.Tags
	for _, t := range vt {
		mt := tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema}
		if len(mt.InputSchema) == 0 || !json.Valid(mt.InputSchema) {
			mt.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		if len(t.Annotations) > 0 && json.Valid(t.Annotations) {
			mt.Annotations = t.Annotations
		}
		lo, hi := s.cfg.Vendor.ListedPrice(t)
		if hi > 0 {
			price := map[string]any{"amount": lo.SatsCeil(), "unit": "sats"}
			if hi.SatsCeil() > lo.SatsCeil() {
				price["max_amount"] = hi.SatsCeil()
			}
			mt.Meta = map[string]any{"capvend/price": price}
			tags = append(tags, nostr.Tag{"cap", "tool:" + t.Name, pricing.CapAmount(lo, hi), "sats"})
		}
		tools = append(tools, mt)
	}
	b, _ := json.Marshal(map[string]any{"tools": tools})
	return b, tags
}

// discoveryTags are the tags of a client's first answer.
func (s *Server) discoveryTags() nostr.Tags {
	var tags nostr.Tags
	add := func(k, v string) {
		if v != "" {
			tags = append(tags, nostr.Tag{k, v})
		}
	}
	add("name", s.cfg.Name)
	add("about", s.cfg.About)
	add("website", s.cfg.Website)
	add("picture", s.cfg.Picture)
	if s.cfg.Encryption != EncryptionDisabled {
		tags = append(tags, nostr.Tag{"support_encryption"}, nostr.Tag{tagEphemeral})
	}
	for _, p := range s.cfg.PMIs {
		add("pmi", p)
	}
	return tags
}

// newClient says whether client has not had an answer yet (not marking
// it: firstAnswer does).
func (s *Server) newClient(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.seen[client]
}

// firstAnswer says whether client has not had an answer yet, and
// remembers that it now has.
func (s *Server) firstAnswer(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[client] {
		return false
	}
	if len(s.seen) >= maxSessions {
		clear(s.seen)
	}
	s.seen[client] = true
	return true
}
