package vend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ItemKind is what a priced request sells: a tool call, a prompt get or a
// resource read.
type ItemKind string

// The kinds of items sold. The zero ItemKind is ItemTool.
const (
	ItemTool     ItemKind = "tool"     // tools/call
	ItemPrompt   ItemKind = "prompt"   // prompts/get
	ItemResource ItemKind = "resource" // resources/read
)

// Or returns k, or ItemTool when k is empty.
func (k ItemKind) Or() ItemKind {
	if k == "" {
		return ItemTool
	}
	return k
}

// Item is a tool capvend offers: an upstream server's tool under the name
// clients see, with its price. Inside vend a Item also stands for a priced
// prompt or resource (Kind): then Name is the exposed prompt name or the
// URI read, UpstreamName the prompt's name on the upstream or the URI (or
// URI template) the resource is priced under, and there is no schema.
type Item struct {
	Kind         ItemKind        // "" or ItemTool for tools
	Name         string          // the name clients call (upstream prefix + UpstreamName)
	Server       string          // the upstream server's configured name
	UpstreamName string          // the tool's name on the upstream
	Title        string          // optional display title
	Description  string          // from the upstream
	InputSchema  json.RawMessage // JSON Schema of the arguments, from the upstream
	Annotations  json.RawMessage // the upstream's tool annotations, if any
	Price        Msat            // 0: free
	Idempotent   bool            // may be re-run after a crash during execution
	// Templates (resources only) are further keys the resource may be
	// priced under: the URI templates of Server that Name matches (the
	// ItemSource's; vend adds Name itself, the price book's templates and
	// those of Name's folded spelling, see TemplatePricer and foldedURI).
	// The most specific key the price book prices is used, so a listed
	// URI without a price of its own is priced by its template.
	Templates []string
}

// ToolSource is the set of upstream MCP servers: their current tools, and a
// way to run one.
type ToolSource interface {
	// Tools returns the upstreams' tools now, without prices, under their
	// exposed names. The result is not modified by the caller.
	Tools() []Item
	// CallTool runs t on its upstream with args (a JSON object) and returns
	// the upstream's CallToolResult as JSON. Progress notifications the
	// upstream sends for the call are passed to progress (their params
	// object, with the progressToken the caller gave), if progress is not
	// nil. A tool that ran and failed is a result with isError, not an
	// error; an error means the upstream could not be reached or broke
	// the protocol.
	CallTool(ctx context.Context, t Item, args json.RawMessage, progressToken json.RawMessage, progress func(params json.RawMessage)) (json.RawMessage, error)
}

// ItemSource is an optional ability of a ToolSource: it serves prompts and
// resources, which can then be sold like tools (CallRequest.Kind). Prompt
// gets and resource reads are treated as idempotent: a paid one a crash
// interrupted is run again at start.
type ItemSource interface {
	// PromptItem returns the prompt exposed as name as a Tool of
	// ItemPrompt: Name, Server, UpstreamName (its name on the upstream),
	// Title, Description, and an InputSchema of its arguments (strings,
	// the required ones required), checked before a get is quoted.
	// ok=false if no upstream lists it.
	PromptItem(name string) (t Item, ok bool)
	// ResourceItem returns the resource read as uri as a Tool of
	// ItemResource: Name uri, Server the upstream that serves the read,
	// UpstreamName a key its price may be looked up by (uri itself when
	// an upstream lists it or it is a listed URI template, else the
	// first listed URI template uri matches), and Templates the further
	// URI templates of Server that uri matches (vend prices the read by
	// the most specific of these keys, and its own, the book prices).
	// ok=false if neither.
	ResourceItem(uri string) (t Item, ok bool)
	// GetPrompt renders the prompt exposed as name with args and returns
	// the MCP GetPromptResult as JSON. An error means it could not be
	// rendered (the upstream is down, refused the arguments, ...).
	GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error)
	// ReadResource reads uri and returns the MCP ReadResourceResult as
	// JSON; errors as for GetPrompt.
	ReadResource(ctx context.Context, uri string) (json.RawMessage, error)
}

// PriceBook prices tools. pricing.Book implements it. It must be safe for
// concurrent use.
type PriceBook interface {
	// Quote prices a call of tool on server with args (a JSON object)
	// (prompts and resources are looked up as pricing.PromptKey(name) and
	// pricing.ResourceKey(uri or template)):
	// its price (0: free), whether the tool may be re-run after a crash,
	// its daily free quota per client, and a short description of how
	// the price was computed. An error means the arguments cannot be
	// priced (the wrong type, a negative count): the call is answered
	// with invalid params and nothing is recorded.
	Quote(server, tool string, args json.RawMessage) (Quote, error)
	// Listed returns the price shown in tool lists and announcements:
	// the minimum and maximum a call can cost (equal for a flat price).
	Listed(server, tool string) (lo, hi Msat)
}

// TemplatePricer is an optional ability of a PriceBook (pricing.Book has
// it): the URI templates it prices resources of server by that uri
// matches. Such a template competes with the resource's own URI and the
// templates its upstream lists (the most specific priced key wins), so
// that a template of the configuration prices every URI it matches,
// whether or not the upstream declares that template.
type TemplatePricer interface {
	ResourceTemplates(server, uri string) []string
}

// CallRequest is one tools/call (or priced prompts/get or resources/read)
// as a front received it.
type CallRequest struct {
	// Kind is what is asked for: "" or ItemTool a tools/call;
	// ItemPrompt a prompts/get, with Name the exposed prompt name and
	// Arguments its arguments object (string values); ItemResource a
	// resources/read, with Name the URI and Arguments {} or nil.
	Kind      ItemKind
	Transport string // "mcp-http", "mcp-stdio", "nostr"
	Client    string // client identity on that transport (session id, pubkey)
	RequestID string // the request's id on its transport, unique per client
	Name      string // the exposed tool name (prompt name, resource URI)
	Arguments json.RawMessage
	// ProgressToken is the client's _meta.progressToken (raw JSON), nil
	// if none: payment waits then send progress heartbeats.
	ProgressToken json.RawMessage
	// CashuToken is a cashuA/cashuB token from _meta (MetaCashuToken):
	// it pays the call at once.
	CashuToken string
	// PMIs are the payment methods the client said it can pay with (empty:
	// any).
	PMIs []string
	// InvoiceFrom asks for the Lightning invoice to be issued by that
	// backend (_meta[MetaInvoiceFrom]: "lnd", or "cashu" for a mint
	// quote's invoice, paid into the server's ecash wallet). "" or a
	// backend the server does not have: the server's first backend.
	InvoiceFrom Backend
	// Explicit asks for explicit gating: instead of notifications, an
	// unpaid call fails with a PaymentRequiredError; the client pays and
	// repeats the call.
	Explicit bool
	// Anonymous says the transport could not identify the client (an MCP
	// HTTP client without a session): its request ids are not unique, so
	// they are not used to find replays, and an explicit-gating grant is
	// only released against PaymentProof.
	Anonymous bool
	// Public says the request came, and its answers go, where anyone can
	// read them: a plaintext Nostr event, which every relay keeps and
	// serves. A request carrying a bearer secret there is refused
	// (*PublicSecretError), and its answers carry none (see Schemes).
	// False for MCP HTTP, stdio and encrypted Nostr.
	Public bool
	// Source is who the limits count when not empty (see the package
	// doc, Limits): "ip:<address>" for a request from that address, or
	// "id:<client id>" for a client a trusted proxy identified. Empty:
	// Client counts (a Nostr pubkey, "stdio").
	Source string
	// Work is the request's proof of work (NIP-13 for Nostr events: the
	// leading zero bits of the request event's id, at most its committed
	// target), and WorkRequired the least the front demands of a request
	// that gets a free call or an unpaid quote (0: none). A request with
	// less is refused with a *WorkRequiredError, unless it pays with a
	// Cashu token (it is then not offered a free use either).
	Work, WorkRequired int
	// PaymentProof is the hex preimage of a paid Lightning invoice
	// (_meta[MetaPaymentProof]): it picks the explicit-gating grant that
	// invoice paid for, and releases it only to the client it was quoted
	// to (a preimage is learned by every routing hop: SchemePreimage).
	PaymentProof string
	// PaymentToken is a payment token a payment-required answer handed
	// out (PaymentRequiredError.Token): the tool call's PaymentArg
	// argument (vend takes it out of Arguments) or _meta[MetaPaymentToken].
	// It names one explicit-gating call and releases it once: the call
	// must sell exactly what this request asks (else ErrTokenMismatch),
	// be paid and not yet run (ErrTokenUsed), or awaiting payment
	// (*PaymentPendingError) before its invoice expired
	// (ErrTokenExpired); an unknown token is ErrTokenUnknown. No session,
	// client identity or _meta is needed.
	PaymentToken string
	// L402 asks for an L402 challenge: an unpaid call is answered by
	// explicit gating (it implies Explicit) with a macaroon in
	// PaymentRequiredError.Macaroon, when the ledger keeps L402 keys
	// and the invoice is a Lightning one (see l402.go).
	L402 bool
	// Macaroon is an L402 macaroon (binary) the request presents, with
	// its invoice's preimage in PaymentProof (or in a preimage caveat).
	// A credit macaroon (l402.go) pays the call from its account, as a
	// credit token would. A call macaroon releases the one call it was
	// minted for, once: a credential that does not verify for this
	// request is ErrL402Invalid, a call that ran is ErrTokenUsed, one
	// whose invoice expired unpaid ErrTokenExpired. A proven payment the
	// backend has not reported yet is waited for, not answered as
	// pending.
	Macaroon []byte
	// MPP is an MPP Payment credential (the token of Authorization:
	// Payment <token>: base64url JSON echoing the challenge, with the
	// invoice's preimage; scheme_mpp.go). Like a call macaroon it
	// releases the one call its challenge was issued for, once; one that
	// does not verify is ErrMPPInvalid.
	MPP string
	// X402 is an x402 payment payload (JSON: HTTP's PAYMENT-SIGNATURE
	// decoded, or _meta[MetaX402Payment]; scheme_x402.go) naming a paid
	// invoice: it releases that invoice's call to the client it was
	// quoted to, once; one that does not verify is ErrX402Invalid.
	X402 json.RawMessage
	// PaymentTokens says the front hands payment tokens to its clients:
	// an explicit-gating answer then issues one (PaymentRequiredError.Token).
	PaymentTokens bool
	// Credit is a credit token (_meta[MetaCredit], the HeaderCredit
	// header, or the tool argument CreditArg, which vend takes out of
	// Arguments): a priced call is paid from its account at once, a
	// top-up credits it. CreditSelf asks the same of the account of the
	// client's own identity: a front sets it only where Client is proven
	// (a Nostr pubkey that signed the request). See
	// docs/ARCHITECTURE.md, Credit accounts.
	Credit     string
	CreditSelf bool
	// account is the credit account Credit or CreditSelf names, once
	// admit checked it.
	account string
	// RefundInvoice is a bolt11 invoice (_meta[MetaRefundInvoice]) to
	// pay a refund to if the call fails after an LND payment (a Cashu
	// payment is refunded at once as ecash; a hold invoice is canceled).
	// It is recorded with the call; its amount is checked when paid.
	RefundInvoice string
	// Notify sends a notification to the client on this call's stream.
	// It must not block for long; errors are ignored (the client may be
	// gone, the call goes on).
	Notify func(method string, params any)
	// PayPage, if not nil, is handed the view-only pay page token of the
	// call's invoice (paypage.go) when the request starts waiting for its
	// payment, right after payment_required: a front that can open a page for
	// a person (URL-mode elicitation) shows it. It must not block.
	PayPage func(token string)
	// Elicit, if not nil, asks the client for input while the call runs
	// (an upstream's elicitation): params is the elicitation request's
	// params object, the result the client's ElicitResult ({"action":
	// "accept"|"decline"|"cancel", "content": ...}). It blocks until the
	// client answers, ctx ends or the front gives up (an error). It is
	// passed to the ToolSource in the context (WithElicit); it never
	// touches payment: the call is already paid when it runs.
	Elicit ElicitFunc
}

// ElicitFunc asks a call's client for input: see CallRequest.Elicit.
type ElicitFunc func(ctx context.Context, params json.RawMessage) (json.RawMessage, error)

type elicitKey struct{}

// WithElicit returns ctx carrying fn, for ToolSource.CallTool: an upstream
// that asks for input during the call is answered through fn. A nil fn
// returns ctx unchanged.
func WithElicit(ctx context.Context, fn ElicitFunc) context.Context {
	if fn == nil {
		return ctx
	}
	return context.WithValue(ctx, elicitKey{}, fn)
}

// ElicitFrom returns the ElicitFunc WithElicit put in ctx, or nil: then
// nobody can answer, and an elicitation should be declined.
func ElicitFrom(ctx context.Context) ElicitFunc {
	fn, _ := ctx.Value(elicitKey{}).(ElicitFunc)
	return fn
}

type clientPubkeyKey struct{}

// WithClientPubkey returns ctx carrying pubkey (64 lowercase hex): the
// Nostr key whose signature the request carries, which a front sets only
// where it checked that signature. The Vendor passes the request's ctx
// to the ToolSource and ItemSource, so an upstream may be told who
// calls (ContextVM's CEP-16); it is no part of the call's canonical
// arguments. A call capvend finishes without its request (recovered
// after a crash, or whose client left) has none. "" returns ctx
// unchanged.
func WithClientPubkey(ctx context.Context, pubkey string) context.Context {
	if pubkey == "" {
		return ctx
	}
	return context.WithValue(ctx, clientPubkeyKey{}, pubkey)
}

// ClientPubkeyFrom returns the pubkey WithClientPubkey put in ctx, or "".
func ClientPubkeyFrom(ctx context.Context) string {
	pk, _ := ctx.Value(clientPubkeyKey{}).(string)
	return pk
}

// Payment method identifiers (pmi) and the _meta keys capvend reads.
const (
	PMILightning = "bitcoin-lightning-bolt11" // a bolt11 invoice (LND, or a Cashu mint quote's invoice)
	PMICashu     = "bitcoin-cashu-token"      // a Cashu token in _meta[MetaCashuToken]

	MetaCashuToken   = "capvend/cashu"        // _meta key of a cashuA/cashuB token paying the call
	MetaPaymentProof = "capvend/preimage"     // _meta key of the hex preimage of the invoice paid for an explicit-gating grant
	MetaInvoiceFrom  = "capvend/invoice_from" // _meta key naming the backend that issues the invoice ("lnd", "cashu")
)

// Notification methods capvend sends about payment.
const (
	NotifyPaymentRequired = "notifications/payment_required"
	NotifyPaymentAccepted = "notifications/payment_accepted"
	NotifyPaymentRejected = "notifications/payment_rejected"
	NotifyProgress        = "notifications/progress"
)

// PaymentOption is one way to pay for a call, as sent in
// notifications/payment_required and in a PaymentRequiredError.
type PaymentOption struct {
	Amount      int64  `json:"amount"` // sats (rounded up from msat)
	PayReq      string `json:"pay_req,omitempty"`
	PMI         string `json:"pmi"`
	Description string `json:"description"`
	TTL         int64  `json:"ttl"` // seconds
}

// Result is the answer to a call: an MCP CallToolResult as JSON.
type CallResult struct {
	Body    json.RawMessage
	IsError bool
}

// Errors a front translates to JSON-RPC errors.
var (
	// ErrUnknownTool: no tool (prompt, resource) of that name (JSON-RPC
	// -32602).
	ErrUnknownTool = errors.New("unknown tool")
	// ErrPaymentExpired: the payment request expired unpaid; nothing ran.
	ErrPaymentExpired = errors.New("payment request expired unpaid")
	// ErrPaymentFailed: the payment could not be taken (bad token,
	// double spend, backend refusal); nothing ran.
	ErrPaymentFailed = errors.New("payment failed")
	// ErrNoPaymentMethod: no configured backend can take a payment the
	// client can make.
	ErrNoPaymentMethod = errors.New("no payment method the client and server share")
	// ErrLimit: a limit (unpaid quotes, rate) refused the call.
	ErrLimit = errors.New("limit reached")
	// ErrUpstream: the upstream server could not run the call; a paid
	// call was refunded.
	ErrUpstream = errors.New("upstream server failed")
	// ErrResultExpired: the request ran before and its stored answer was
	// pruned after the ledger's retention period (ledger.results_retention):
	// only its hash, size and error flag are kept. Nothing runs again and
	// nothing is charged (JSON-RPC -32057).
	ErrResultExpired = errors.New("stored answer expired after the retention period")
)

// InvalidParamsError says why arguments do not match the tool's input
// schema (JSON-RPC -32602). Nothing was quoted or charged.
type InvalidParamsError struct {
	Tool   string
	Reason string
}

func (e *InvalidParamsError) Error() string {
	return fmt.Sprintf("invalid arguments for %s: %s", e.Tool, e.Reason)
}

// WorkRequiredError refuses a request that would get a free call or an
// unpaid quote without the proof of work its front requires (Nostr:
// nostr.pow_difficulty). Nothing was recorded or charged.
type WorkRequiredError struct {
	Required int // the difficulty required, in leading zero bits
	Work     int // the request's
}

func (e *WorkRequiredError) Error() string {
	return fmt.Sprintf("proof of work required: difficulty %d, the request has %d", e.Required, e.Work)
}

// PaymentRequiredError is explicit gating's answer to an unpaid call
// (an MCP tool result with isError, or JSON-RPC -32042 where CEP-8
// applies): the ways to pay. The client pays one and repeats the same
// call, with Token if there is one.
type PaymentRequiredError struct {
	Options   []PaymentOption
	Amount    Msat      // the price
	Invoice   string    // the bolt11 to pay
	ExpiresAt time.Time // when the invoice stops being payable
	// Token is the payment token naming this call (see
	// CallRequest.PaymentToken): "" unless the front asked for tokens
	// (CallRequest.PaymentTokens) and the ledger keeps them. A bearer
	// secret until used: never log it.
	Token string
	// Macaroon is the L402 macaroon (binary) of this call's invoice:
	// nil unless the request asked for L402 (CallRequest.L402) and the
	// ledger keeps L402 keys. Presented with the invoice's preimage it
	// releases this call once.
	Macaroon []byte
	// MPP is the MPP Lightning charge challenge of this call's invoice:
	// nil unless the request asked for HTTP 402 answers (CallRequest.L402)
	// on a private channel and the invoice is an LND one; its id is a
	// secret like the macaroon. X402 is the invoice's x402 payment
	// requirements, on a private channel when the invoice is an LND one.
	MPP  *MPPChallenge
	X402 *X402Requirements
	// PayPage is the call's view-only pay page token (cvv_..., see
	// paypage.go): it releases nothing, so it may go in a URL. "" when
	// the payment has no invoice.
	PayPage string
}

func (e *PaymentRequiredError) Error() string { return "payment required" }

// PaymentPendingError is explicit gating's answer to a repeated call whose
// payment has not arrived yet (a tool result with isError, or JSON-RPC
// -32043).
type PaymentPendingError struct {
	RetryAfter int64     // seconds
	Token      string    // the payment token the request presented, "" if none
	ExpiresAt  time.Time // when the invoice stops being payable; zero if unknown
}

func (e *PaymentPendingError) Error() string { return "payment pending" }

// Prompt is an upstream prompt a front lists, free: its exposed name and
// its MCP Prompt object as JSON (whose "name" is overridden by Name).
type Prompt struct {
	Name       string
	Definition json.RawMessage
}

// Resource is an upstream resource a front lists, free: its URI and its
// MCP Resource object as JSON (whose "uri" is overridden by URI).
type Resource struct {
	URI        string
	Definition json.RawMessage
}

// ResourceTemplate is an upstream resource template a front lists, free:
// its URI template and its MCP ResourceTemplate object as JSON (whose
// "uriTemplate" is overridden by URITemplate).
type ResourceTemplate struct {
	URITemplate string
	Definition  json.RawMessage
}
