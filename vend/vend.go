// Package vend is capvend's core: the domain types of a priced MCP call
// (Call, Payment, Settlement, Result), the state machine a call and its
// payment move through, the sentinel errors, and the small interfaces vend
// uses: a ledger that records every state change durably, and payment
// backends. It imports no adapter, no Lightning or Cashu library and no SQL:
// those implement vend's interfaces from the outside.
//
// A priced tools/call (Vendor.CallTool) goes: parse the arguments once,
// strictly (a duplicate key, or keys that differ only in case, at any
// depth, is -32602), and re-encode them once: that one encoding is what is
// validated, priced, hashed, recorded and sent upstream; validate it
// against the tool's input schema (-32602 before anything is quoted);
// quote it with the price book (Vendor.SetPrices swaps the book; a call
// keeps the price it was quoted); if the tool has a daily free quota and
// the client has some left (counted in the ledger, atomically, once per
// request), run it free; otherwise record the call, keyed by transport,
// client and request id, so a replay finds it; ask a payment backend for
// a payment (a hold invoice where the backend can) and send
// notifications/payment_required, whose description says how the price
// was computed; on the backend's report send
// notifications/payment_accepted, claim the payment and run the tool once;
// then settle a hold invoice and store the result (delivered), or on
// failure store the error, cancel the hold invoice or book the refund
// (failed -> refunded): a refund owed to the client (RefundLedger), paid
// back at once as a Cashu token for a Cashu payment (RefundPayer) and
// handed over in the answer (RefundError, or _meta[MetaRefund] of an
// isError result; see refund.go). With explicit gating the call instead fails with
// PaymentRequiredError (a plain invoice, never a hold invoice); the client
// pays and repeats the call, which finds its single-use grant by client
// (or invoice preimage, from that same client: every routing hop learns a
// plain invoice's preimage) and Binding. A Cashu token in _meta pays at
// once. Every way to pay is a Scheme of one table (scheme.go): who may
// present its credential, what it releases, and whether it may travel on
// a public channel (a plaintext Nostr event: CallRequest.Public).
//
// Payment tokens: a front whose clients may have neither a session nor
// _meta (a stock MCP host, where only the model can act) sets
// CallRequest.PaymentTokens; the PaymentRequiredError then carries a
// fresh token (160 random bits, stored in the ledger only as its SHA-256,
// GrantTokens) that names the call. The client passes it back as the tool
// argument PaymentArg ("capvend_payment"), which vend strips from the
// arguments before anything else sees them (it is not validated, priced,
// hashed, recorded or sent upstream), or in _meta[MetaPaymentToken]. The
// token releases its call only: the retry must sell exactly the call's
// Binding (ErrTokenMismatch), and gets *PaymentPendingError until the
// payment is in, the result once, ErrTokenUsed after (also for concurrent
// retries: one runs the call, the others are refused), ErrTokenExpired
// once the invoice expired unpaid, ErrTokenUnknown for anything else.
// Because vend strips PaymentArg, a tool whose input schema declares it is
// not offered (logged once).
//
// A call that is free outright (price 0 for its arguments, no quota)
// records nothing. Vendor.CallFree serves such a call with the same
// checks and answers when the ToolSource can run it raw (RawToolSource:
// an HTTP upstream on protocol 2026-07-28), so a front can skip the work
// of a priced call's path; any other call it leaves to CallTool (free.go).
//
// A request is bound to what it asked for. A request key (transport,
// client, request id) names one call or free use and its Binding (kind,
// server, tool, canonical argument hash): the same key with anything else
// is refused with ErrRequestReused (JSON-RPC -32600) by the ledger, in the
// transaction that would record it; it never attaches to, waits on or
// replays the other call. Whatever path runs a recorded call (the first
// request, a replay, an explicit-gating grant, a payment reported after
// the client left, Recover), it runs the tool and arguments recorded with
// the call, never the live request's, and the ledger records each
// execution's Binding (StartExecution, ResumeExecution), refusing one
// that differs from the call's (ErrExecutionMismatch: the call is then
// refunded). Once a payment is in, the claim, the run and its records go
// ahead even if the client leaves at that instant (its answer waits for
// the replay); a paid call that cannot run as recorded is refunded.
// Recover, at start, finishes what a previous run left with a bounded
// pool of workers. A previous run's calls are told from this run's by the
// random run id each Vendor records with its calls (NewCall.Run), never
// by the clock.
//
// Prompts and resources are sold the same way (CallRequest.Kind): a
// prompts/get of a priced prompt or a resources/read of a priced resource
// (a listed URI, or one matching a priced URI template: a URI's own price
// wins, else the most specific priced template it matches, see
// pricing.CompareSpecificity) goes through CallTool with the same
// guarantees, run by the ToolSource's optional ItemSource. A resource URI
// not in RFC 3986 normal form (and not listed as it is) is refused as
// invalid params, on every path (see uri.go): what is priced is what is
// read. The fronts serve free prompts and resources from their Catalog
// through Vendor.Offered, which applies these rules and the price book's
// UnpricedPolicy (an item without a rule is free, or neither listed nor
// sold) to what they list and read. Their prices are the book's rules under
// pricing.PromptKey and pricing.ResourceKey, so they never collide with
// tool names; the ledger records the kind, so income is booked per kind.
// Prompt gets and resource reads are idempotent: one a crash interrupted
// is run again at start. A prompt's arguments are checked against the
// schema its ItemSource gives (strings, the required ones present) before
// it is quoted (-32602 otherwise); a read has no arguments.
//
// # Credit
//
// Prepaid credit (Config.Credit) lets a client pay once and call many
// times, with no Lightning round trip per call.
//
// Buying: the built-in tool TopUpTool ("capvend_topup", arguments
// {"sats": N}, listed with the upstreams' tools) is sold like any priced
// tool: an invoice (hold where the backend can), a mint quote, a Cashu
// token in _meta, explicit gating and payment tokens all work, with the
// same exactly-once guarantees. Its "execution" runs nothing upstream:
// the ledger's Deliver credits the account in the transaction that
// delivers the call (the payment is booked to income:tools:capvend:topup
// when it settles, as any call's, and moved to
// liabilities:credit:<account> at delivery). A top-up that fails is
// refunded like any call.
//
// Naming and proving an account: an account is "t" + 24 random hex digits,
// or "nostr-<pubkey>". Its credit token is "cvc_<account>_<mac>", the mac
// being 128 bits of HMAC-SHA256 under a 32-byte key the ledger made once
// (CreditLedger.CreditKey): whoever presents the token owns the account
// (a bearer secret, like a Cashu token); nobody can make one for an
// account without the key; no token is stored anywhere, and the ledger can
// make it again, so the answer of a top-up (which carries it, in
// _meta[MetaCredit] and in its text) can be replayed. A request names its
// account by the token in _meta[MetaCredit], the HeaderCredit header on
// MCP HTTP, or the argument CreditArg (stripped like PaymentArg); a Nostr
// front sets CreditSelf for _meta[MetaCredit] = true, naming the account of
// the pubkey that signed the request (no token needed: the signature
// proves it). A Nostr key's own account has no token: only requests signed
// by the key spend it, and a top-up's answer on it carries none. A
// top-up without an account opens a new token account (refused on a
// public channel: its answer is the token). A bad token is -32602 and
// nothing is recorded.
//
// Paying: a priced call naming an account is recorded like any call (the
// request key and Binding rules above hold per call: a replay gets its
// stored answer and draws nothing), and in the same transaction
// (CreditLedger.RecordCreditCall) its price moves from the account to
// liabilities:credit_drawn and the call is claimed for execution; the
// balance can never go negative (a schema CHECK), so of concurrent calls
// on the last sats only those the balance covers run, the others get
// *CreditExhaustedError (-32056 on every front, with the top-up to make)
// and nothing is recorded or charged. Delivered,
// the draw moves to the item's income; failed (or interrupted and not
// idempotent), it is given back. Every answer of a request naming an
// account carries its balance in _meta[MetaCredit] (CreditInfo).
//
// Expiry: with Credit.ExpiresAfter, Run books the balance of an account
// not topped up for that long to income:credit_expired, with the reason in
// the journal. The operator lists balances and pays back what is left
// (`capvend credit`). Other payment fronts (L402) credit an account by
// selling TopUpTool for it: CallTool with Tool TopUpTool, Credit the
// account's token (or none for a new account), Explicit, then the paid
// repeat with PaymentProof (see TopUp).
//
// # Limits
//
// Every limit counts a request by CallRequest.Source when the front set
// it, else by CallRequest.Client: the MCP HTTP front sets Source to
// "ip:<address>" (or "id:<client id>" a trusted proxy vouched for), so
// every session from one address is one client; Nostr requests have no
// Source and count by pubkey; stdio by "stdio".
//
//   - RequestsPerMinute: calls (free or priced) per client in each clock
//     minute. Only the keys of the current minute are held, at most
//     DefaultMaxRateKeys; a key first seen beyond that is not counted.
//   - MaxUnpaidPerClient: open unpaid payment requests per client. A
//     request counts from its quote until it is paid, canceled or expired
//     (the backend's report), whether or not its client still waits: a
//     dropped connection or an explicit-gating quote holds its slot while
//     its invoice is payable. Beyond it: ErrLimit (-32053).
//   - MaxUnpaidTotal: open unpaid payment requests in all. When it is
//     reached, the oldest request of the client(s) holding the most is
//     withdrawn (shed) so the newest customer still gets a quote: its
//     invoice is canceled at its backend (its call becomes canceled) and
//     a client waiting for it gets notifications/payment_rejected and
//     ErrLimit. Requests of a previous run are not counted (they expire
//     within the TTL).
//   - With SharedConfig.Unpaid (instances sharing a ledger), both unpaid
//     limits also count the requests every instance has open, read from
//     the ledger (NewCall.LimitKey) once this process's own count let a
//     new quote through: a client at MaxUnpaidPerClient there is refused
//     before anything is written; at MaxUnpaidTotal this instance sheds
//     its own oldest request of its busiest client (none: ErrLimit).
//     The count is read, not reserved: quotes made at once on several
//     instances can pass a limit by those not yet recorded when the
//     others read (each instance's own limits still hold).
//   - Daily free quotas (PriceBook's FreePerDay) count per transport and
//     client, a Source as "source:<source>"; FreePerDayTotal bounds a
//     tool's free calls per UTC day across all clients and transports (a
//     fresh Nostr key is free to make), in the same ledger transaction.
//   - Proof of work: a front may require it (CallRequest.WorkRequired; the
//     Nostr front's NIP-13 difficulty). A request with less Work gets no
//     free use (it is priced instead); if it would get a free call or an
//     unpaid quote it is refused with *WorkRequiredError; one paying with a
//     Cashu token is not refused.
package vend

import "github.com/capvend/capvend/pricing"

// Msat is an amount of money in millisatoshis (see pricing.Msat). Money is
// never a float.
type Msat = pricing.Msat

// Quote is the price of one call and how it was computed (see
// pricing.Quote).
type Quote = pricing.Quote

// MsatPerSat is the number of millisatoshis in a satoshi.
const MsatPerSat = pricing.MsatPerSat

// FromSats converts whole satoshis to Msat; it fails on negative amounts and
// on amounts that would overflow.
func FromSats(sats int64) (Msat, error) { return pricing.FromSats(sats) }
