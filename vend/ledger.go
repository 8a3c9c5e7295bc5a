package vend

import (
	"context"
	"strings"
	"time"
)

// CallID identifies a call in the ledger.
type CallID int64

// PaymentID identifies a payment in the ledger.
type PaymentID int64

// Backend names the payment backend that issued a payment.
type Backend string

// The payment backends.
const (
	BackendLND   Backend = "lnd"
	BackendCashu Backend = "cashu"
	// BackendNWC is a wallet reached by Nostr Wallet Connect (NIP-47);
	// with several connections each is "nwc:<name>" (see NWCBackend).
	BackendNWC Backend = "nwc"
)

// NWCBackend names the NWC connection called name: BackendNWC for "" or
// "nwc", else "nwc:<name>". A name is lower-case letters, digits, '_'
// and '-', at most 64 of them (ValidNWCName).
func NWCBackend(name string) Backend {
	if name == "" || name == string(BackendNWC) {
		return BackendNWC
	}
	return BackendNWC + Backend(":"+name)
}

// ValidNWCName reports whether name may name an NWC connection.
func ValidNWCName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// IsNWC reports whether b is an NWC connection (BackendNWC or
// "nwc:<name>").
func (b Backend) IsNWC() bool {
	if b == BackendNWC {
		return true
	}
	name, ok := strings.CutPrefix(string(b), string(BackendNWC)+":")
	return ok && ValidNWCName(name)
}

// PaymentKind says what the client was asked to pay with.
type PaymentKind string

// The kinds of payment.
const (
	KindInvoice     PaymentKind = "invoice"      // plain Lightning invoice (LND)
	KindHoldInvoice PaymentKind = "hold_invoice" // hold invoice: settled only after the tool succeeded
	KindMintQuote   PaymentKind = "mint_quote"   // NUT-04 mint quote: its bolt11 is paid to the mint
	KindToken       PaymentKind = "token"        // a Cashu token handed over by the client
	// KindWalletInvoice is a plain invoice a wallet made (NWC
	// make_invoice). NIP-47 cannot withdraw it: it stays payable at the
	// wallet after capvend canceled or expired it, and money arriving
	// late is booked and owed back (LatePayable).
	KindWalletInvoice PaymentKind = "wallet_invoice"
)

// NewCall is what is known of a priced request when it is first recorded.
type NewCall struct {
	Transport string // "mcp-http", "stdio", "nostr-ctxvm", ...
	Client    string // client identity: a Nostr pubkey, an MCP session id
	RequestID string // the request's id on its transport (JSON-RPC id, Nostr event id)
	Server    string // upstream server name
	// Kind is what was sold ("" is ItemTool).
	Kind ItemKind
	// Name is the tool's (prompt's) name on that server, or the URI (or
	// URI template) a resource is priced under.
	Name     string
	ArgsHash string // hex SHA-256 of the canonical method + params without _meta (see CanonicalHash)
	Price    Msat   // > 0: free calls are not recorded
	// Idempotent tools may be re-run after a crash during execution;
	// others are refunded instead.
	Idempotent bool
	// ExposedName and Arguments are what the client called (the exposed
	// name and the JSON arguments object), kept so a paid call can run
	// after a restart.
	ExposedName string
	Arguments   []byte
	// Explicit marks a call made with explicit gating: once paid it is a
	// grant that waits for the client to repeat the call, rather than
	// being run at once.
	Explicit bool
	// RefundInvoice is the bolt11 the client gave for a refund
	// (CallRequest.RefundInvoice), "" if none; a refund owed for the
	// call is paid to it.
	RefundInvoice string
	// Run is the run id of the Vendor that recorded the call: Recover
	// finishes the calls of other runs and leaves its own run's to the
	// requests serving them. "" for a call recorded by no Vendor (or
	// before ledger schema 10): always another run's. Written once.
	Run string
	// LimitKey is who the call's unpaid limits count (see the package
	// doc, limits), kept where several instances count them in the
	// ledger (SharedConfig.Unpaid); "" otherwise. Written once.
	LimitKey string
}

// Binding is exactly what a priced call sells: its kind, the upstream
// server and tool (prompt name, resource price key) and the canonical hash
// of its method and arguments. A request key that comes back with another
// Binding is not that call (ErrRequestReused), and an execution must send
// exactly the call's Binding upstream.
type Binding struct {
	Kind     ItemKind // never "": ItemTool for tools
	Server   string
	Name     string
	ArgsHash string
}

// Binding returns what c sells.
func (c NewCall) Binding() Binding {
	return Binding{Kind: c.Kind.Or(), Server: c.Server, Name: c.Name, ArgsHash: c.ArgsHash}
}

// Released is the release of c by scheme s to c's own client (its
// transport and client).
func (c NewCall) Released(s SchemeName) Release {
	return Release{Scheme: s, Transport: c.Transport, Client: c.Client}
}

// Call is a recorded priced request.
type Call struct {
	NewCall
	ID         CallID
	State      CallState
	Executions int    // how many times execution started
	Reason     string // why it failed, expired or was refunded
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// NewPayment is a payment request issued by a backend for a call.
type NewPayment struct {
	Backend Backend
	Kind    PaymentKind
	// Ref is the payment hash (hex) for LND, the quote id for a mint
	// quote, the token hash for a token. Unique across the ledger.
	Ref       string
	Bolt11    string // what the client pays, if anything
	MintURL   string // Cashu only
	Amount    Msat
	ExpiresAt time.Time
	// HoldPreimage is the secret of a hold invoice (KindHoldInvoice
	// only), stored with the payment so it can be settled after a
	// restart. A bearer secret: never log it.
	HoldPreimage []byte
}

// Payment is a recorded payment request.
type Payment struct {
	NewPayment
	ID          PaymentID
	CallID      CallID
	State       PaymentState
	CreatedAt   time.Time
	UpdatedAt   time.Time
	SettledAt   time.Time // zero unless settled
	Settled     Msat      // amount received, zero unless settled
	Fee         Msat      // fee paid by us to receive it (Cashu input fees)
	AddIndex    uint64    // LND add index, 0 if unknown
	SettleIndex uint64    // LND settle index, 0 if unknown
}

// Settlement is a backend's report that a payment arrived.
type Settlement struct {
	Ref         string
	Amount      Msat // amount received; must cover the payment's amount
	Fee         Msat // what receiving cost us (booked as an expense)
	AddIndex    uint64
	SettleIndex uint64
}

// Proof is a Cashu proof received from a client. Only the hash of its secret
// is ever stored.
type Proof struct {
	SecretHash string // hex SHA-256 of the proof's secret
	// Y is hash_to_curve(secret), hex (compressed point): the proof's
	// public id, by which the mint reports its state (NUT-07).
	Y         string
	AmountSat int64
	KeysetID  string
	MintURL   string
}

// SwappingToken is a token payment whose proofs are recorded swapping
// (claimed and sent to the mint to swap): the swap's outcome is not
// recorded yet.
type SwappingToken struct {
	Payment Payment
	Proofs  []Proof // the proofs swapping, with their Y where recorded
}

// The ends of a token swap whose outcome was not recorded, as the mint
// tells them (the ledger's EndSwap records one).
const (
	SwapReleased = "released" // the mint says unspent: the swap did not happen
	SwapSpent    = "spent"    // the mint says spent by someone else
	SwapRejected = "rejected" // the mint refused the proofs for another reason
)

// Result is the stored answer of a call.
type Result struct {
	IsError  bool
	Body     []byte // the JSON-RPC result (or error) as sent to the client
	StoredAt time.Time
}

// FreeUse is a call that may be free under its tool's daily quota.
type FreeUse struct {
	Transport string
	// Client is who the quota counts: the client's identity, or an
	// anonymous client's source address.
	Client string
	// RequestID is unique per Client on Transport: a replay of a request
	// that holds a free use is free again without counting another.
	RequestID string
	Server    string // upstream server name
	Tool      string // tool name on that server; pricing.PromptKey or ResourceKey for prompts, resources
	ArgsHash  string // the request's CanonicalHash: a replay must repeat it exactly
	PerDay    int    // the quota: free uses per Client, tool and UTC day; > 0
	// PerDayTotal, when > 0, also bounds the free uses of the tool per
	// UTC day across every client and transport.
	PerDayTotal int
}

// Ledger records every state change of calls and payments durably. Every
// method is one atomic transaction: it either fully happens or changes
// nothing. A refused transition returns an error matching
// ErrIllegalTransition and changes nothing.
//
// It is the roles vend's parts use: the calls (CallBook), their payments
// (PaymentBook, which is also what a payment backend records into),
// executions (ExecutionBook), free quotas (FreeUseBook), and those of the
// ways to pay, each declared beside its scheme: explicit-gating grants
// (GrantBook), payment tokens (GrantTokens), L402 keys (L402Keys), credit
// (CreditLedger) and refunds (RefundLedger). *ledger.Ledger has them all.
type Ledger interface {
	CallBook
	PaymentBook
	ExecutionBook
	FreeUseBook
	GrantBook
	GrantTokens
	L402Keys
	CreditLedger
	RefundLedger
}

// CallBook is the ledger's record of priced calls: what admission records
// and reads, and what Recover finds. *ledger.Ledger implements it.
type CallBook interface {
	// RecordCall stores a new priced call in state quoted. It is
	// idempotent on (Transport, Client, RequestID): a replayed request
	// (the same key with the same Binding) returns the existing call and
	// created=false. The same key with another Binding, or a key that
	// holds a free use of other parameters, is refused with an error
	// matching ErrRequestReused and changes nothing.
	RecordCall(ctx context.Context, c NewCall) (call Call, created bool, err error)
	// Call returns a call by id, or ErrNotFound.
	Call(ctx context.Context, id CallID) (Call, error)
	// CallByRequest returns the call recorded for a request key
	// (transport, client, request id), or ErrNotFound. Read only.
	CallByRequest(ctx context.Context, transport, client, requestID string) (Call, error)
	// CallArguments returns the tool name and arguments recorded with a
	// call and whether it used explicit gating, or ErrNotFound.
	CallArguments(ctx context.Context, id CallID) (tool string, args []byte, explicit bool, err error)
	// CallsIn returns the calls in any of the states, oldest first (what
	// capvend reconciles at start).
	CallsIn(ctx context.Context, states ...CallState) ([]Call, error)
	// CancelQuote ends a quoted call that never got a payment request
	// (no backend, a limit, a backend error): quoted -> canceled.
	CancelQuote(ctx context.Context, id CallID, reason string) error
	// CallPayments returns the payments recorded for a call, oldest
	// first.
	CallPayments(ctx context.Context, id CallID) ([]Payment, error)
}

// PaymentBook is the ledger's record of payments: the role a payment
// backend records into (each change exactly once, before reporting it),
// and that vend reads payments from. *ledger.Ledger implements it.
type PaymentBook interface {
	// RecordPayment stores a payment request for a quoted call and moves
	// the call to awaiting_payment. ErrDuplicatePayment if the ref exists.
	RecordPayment(ctx context.Context, id CallID, p NewPayment) (Payment, error)
	// Payment returns a payment by ref, or ErrNotFound. It never carries
	// the hold preimage: see HoldPreimage.
	Payment(ctx context.Context, ref string) (Payment, error)
	// PaymentsByRef returns the payments of refs it holds, by ref, except
	// those in state skip ("" skips none); refs it does not hold are
	// left out.
	PaymentsByRef(ctx context.Context, refs []string, skip PaymentState) (map[string]Payment, error)
	// UnsettledPayments returns the backend's payments still open or
	// accepted, oldest first: what a backend reconciles after a restart.
	UnsettledPayments(ctx context.Context, backend Backend) ([]Payment, error)
	// HoldPreimage returns the preimage recorded with a hold invoice, or
	// ErrNotFound.
	HoldPreimage(ctx context.Context, ref string) ([]byte, error)
	// AcceptPayment records that a hold invoice's HTLC is locked in: the
	// payment becomes accepted and its call paid. Idempotent.
	AcceptPayment(ctx context.Context, ref string) (Payment, error)
	// SettlePayment records a settlement exactly once: the payment becomes
	// settled, the journal gets its one income entry, and a call still
	// awaiting payment becomes paid. A second settlement of the same ref
	// returns ErrAlreadySettled and books nothing.
	SettlePayment(ctx context.Context, s Settlement) (Payment, error)
	// EndPayment moves an unsettled payment to canceled or expired, and a
	// call still waiting for it to the matching final state.
	EndPayment(ctx context.Context, ref string, to PaymentState, reason string) (Payment, error)
	// ClaimProofs records the Cashu proofs received for a payment, all or
	// none, as being swapped at the mint: if any proof was received
	// before (and not released after a swap that did not happen),
	// ErrProofSpent is returned and nothing is recorded. The payment's
	// settlement marks them swapped.
	ClaimProofs(ctx context.Context, payment PaymentID, proofs []Proof) error
}

// ExecutionBook is the ledger's record of a paid call's execution: its
// claim, what it sent and who released it, and its end. *ledger.Ledger
// implements it.
type ExecutionBook interface {
	// StartExecution claims the call's payment and moves the call from
	// paid to executing, counting the execution and recording that it
	// sends b upstream (the kind, server, tool and canonical args hash
	// of exactly what the caller is about to send). The claim is
	// exactly-once: of any number of concurrent callers for one call (or
	// one payment) exactly one succeeds; the others get ErrAlreadyClaimed
	// or an ErrIllegalTransition. ErrUnpaid if no settled or accepted
	// payment covers the call's price; ErrExecutionMismatch if b is not
	// the call's Binding. by is who released the call (Release): it is
	// recorded with the execution, and one the table of ways to pay
	// refuses for the call (Release.Check) is an error. A refused start
	// changes nothing.
	StartExecution(ctx context.Context, id CallID, b Binding, by Release) (Call, error)
	// ResumeExecution counts and records another execution of an
	// idempotent call left executing by a crash, which sends b upstream
	// and was released by by (see StartExecution);
	// ErrIllegalTransition for any other call, ErrExecutionMismatch (and
	// nothing recorded) if b is not the call's Binding.
	ResumeExecution(ctx context.Context, id CallID, b Binding, by Release) (Call, error)
	// Deliver stores the call's result and moves it to delivered. The
	// call's payment must be settled (hold invoices are settled first).
	Deliver(ctx context.Context, id CallID, r Result) error
	// Fail stores the failure and moves an executing call to failed.
	Fail(ctx context.Context, id CallID, r Result, reason string) error
	// Refund moves a failed (or paid, never executed) call to refunded. If
	// its payment was settled, a refund entry moves the income to
	// liabilities:refunds; a hold invoice is expected to be canceled
	// instead (EndPayment).
	Refund(ctx context.Context, id CallID, reason string) error
	// Result returns the stored result of a call, or ErrNotFound; an error
	// matching ErrResultExpired when its body was pruned after the
	// retention period (the Result then has IsError and StoredAt, no Body).
	Result(ctx context.Context, id CallID) (Result, error)
}

// FreeUseBook counts the daily free quotas. *ledger.Ledger implements it.
type FreeUseBook interface {
	// ClaimFreeUse decides whether a call is free under its tool's daily
	// quota, atomically: it counts a use for u.Client, the tool and the
	// current UTC day (by the ledger's clock) only if fewer than u.PerDay
	// are counted, so of any number of concurrent claims at most PerDay
	// succeed. A request that holds a use already (same transport, client
	// and request id, same server, tool and ArgsHash) is free again and
	// counts nothing new; the same key with other parameters (or a use
	// recorded without a hash) is refused with an error matching
	// ErrRequestReused. One recorded as a priced call (RecordCall) is
	// never free. With u.PerDayTotal > 0 a new use is counted only while
	// fewer than that are counted for the tool and day across all
	// clients, in the same transaction. free=false means the call is
	// priced normally. A free use books no money.
	ClaimFreeUse(ctx context.Context, u FreeUse) (free bool, err error)
}

// RequestClaimer lets one of several capvend instances that share a
// ledger (and a Nostr key: all of them receive every request) serve a
// request: each claims the request's key before answering it, and only
// the instance whose claim holds answers. A ledger implements it; fronts
// use it only when the ledger is shared (on SQLite one instance serves,
// and a claim would cost a write per request).
type RequestClaimer interface {
	// ClaimRequest claims key for holder (an instance id) and reports
	// whether holder has it: it claimed it now or before. False: another
	// instance claimed it first and serves it. Atomic across instances.
	ClaimRequest(ctx context.Context, key, holder string) (bool, error)
}

// Leaser keeps leases: a named lease has one holder until it expires or
// its holder releases it. Several capvend instances sharing a ledger use
// it so that work meant to run once (recovery, reconciliation) runs on one
// of them, and so that each tells the others it is alive (the lease on its
// run). A ledger implements it.
type Leaser interface {
	// TakeLease takes (or, holder's already, renews) the lease name for
	// ttl, and reports whether holder holds it now: false while another
	// holder's lease runs. Atomic across instances.
	TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// ReleaseLease ends holder's lease on name now (a clean stop).
	ReleaseLease(ctx context.Context, name, holder string) error
	// LeaseHolder returns the holder of a running lease, "" if none.
	LeaseHolder(ctx context.Context, name string) (string, error)
}

// RateCounter counts calls per client and minute where several capvend
// instances share it (a ledger), so that Config.RequestsPerMinute holds
// across them.
type RateCounter interface {
	// CountCall counts one call of client in the minute starting at
	// minute if client made fewer than limit there, and reports whether
	// it did (false: over the limit). Atomic across instances.
	CountCall(ctx context.Context, client string, minute time.Time, limit int) (bool, error)
}

// UnpaidCounter counts open unpaid payment requests where several capvend
// instances share it (a ledger), so that Config.MaxUnpaidPerClient and
// MaxUnpaidTotal hold across them. It only reads.
type UnpaidCounter interface {
	// OpenUnpaid returns the payment requests open and not expired at now
	// of the awaiting calls recorded with NewCall.LimitKey key, and of
	// every call.
	OpenUnpaid(ctx context.Context, key string, now time.Time) (ofKey, total int, err error)
}

// LostPayment is money capvend received for a quote its ledger lost (a
// ledger restored from its replica ends before the quote): a settled LND
// invoice whose preimage carries the ledger's mark, or a mint quote of the
// Cashu wallet's own store, paid and minted, that no payment names. It is
// booked to liabilities:unattributed; no call runs for it.
type LostPayment struct {
	Backend Backend // BackendLND or BackendCashu
	MintURL string  // BackendCashu: the quote's mint
	Ref     string  // payment hash, or mint quote id
	Amount  Msat
	// Note says who found it and what it did ("reconcile: ...").
	Note string
}
