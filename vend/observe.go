package vend

import (
	"sync/atomic"
	"time"
)

// Observer is told what capvend does, for an operator's metrics: the
// changes the ledger commits (calls and payments moving between states,
// refunds owed), free calls, upstream calls and ledger commits. vend owns
// the interface so that neither it nor the ledger depends on a metrics
// library; cmd wires an implementation (adapters/admin's Prometheus
// metrics) into vend.Config.Observer and the ledger's options.
//
// Every method is called synchronously on the path it observes (a
// ledger's writer goroutine, a request's goroutine), from many goroutines
// at once: an implementation must be safe for concurrent use, must not
// block, and must not call back into the Vendor or the ledger. Nothing an
// Observer does changes what it observes. Embed NopObserver to implement
// only some methods.
type Observer interface {
	// LedgerChanged reports the changes one ledger write committed, in
	// order, once the commit is durable (never for a write rolled back).
	// The slice is only valid during the call.
	LedgerChanged(changes []Change)
	// LedgerCommit reports one write transaction of the ledger (a group
	// commit counts once): from BEGIN to its durable COMMIT, and how
	// many writes it held.
	LedgerCommit(d time.Duration, writes int)
	// FreeCall reports a call nobody paid for that ran on its upstream
	// (a free item, or one within its daily free quota): err is nil if
	// the upstream answered (even with isError).
	FreeCall(t Item, err error)
	// UpstreamCall reports one execution on an upstream, free or paid
	// (call is the priced call's id, 0 for a free call): how long it took
	// and whether it failed (err), not whether the tool answered isError.
	UpstreamCall(t Item, call CallID, d time.Duration, err error)
}

// NopObserver implements Observer doing nothing.
type NopObserver struct{}

var _ Observer = NopObserver{}

// LedgerChanged implements Observer.
func (NopObserver) LedgerChanged([]Change) {}

// LedgerCommit implements Observer.
func (NopObserver) LedgerCommit(time.Duration, int) {}

// FreeCall implements Observer.
func (NopObserver) FreeCall(Item, error) {}

// UpstreamCall implements Observer.
func (NopObserver) UpstreamCall(Item, CallID, time.Duration, error) {}

// ChangeKind is what a Change is about.
type ChangeKind uint8

// The kinds of Change.
const (
	// ChangeCall: a priced call was recorded (From "") or moved from
	// CallFrom to CallTo.
	ChangeCall ChangeKind = iota + 1
	// ChangePayment: a payment request was recorded (PayFrom "") or moved
	// from PayFrom to PayTo; a settlement's Amount is what was received.
	ChangePayment
	// ChangeRefund: Amount became owed back to the client of Call, for a
	// payment of Backend (liabilities:refunds).
	ChangeRefund
)

// Change is one change a ledger write committed.
type Change struct {
	What ChangeKind
	Call CallID
	// The call's item: its kind, upstream server and upstream name (as
	// recorded; set for ChangeCall only).
	Kind   ItemKind
	Server string
	Tool   string
	// ChangeCall: the call's price, its states before ("" when it was
	// recorded) and after, and the reason the ledger recorded with the
	// move ("" if none).
	Price            Msat
	CallFrom, CallTo CallState
	Reason           string
	// ChangePayment, ChangeRefund: the payment's backend and kind.
	Backend Backend
	Payment PaymentKind
	// ChangePayment: its states before ("" when recorded) and after.
	PayFrom, PayTo PaymentState
	// Amount: a payment's amount (on settlement, what was received); a
	// refund's amount owed.
	Amount Msat
	// Since is how long the call or payment had been in its From state
	// (the time since its last change): for a call moving from quoted to
	// awaiting_payment, the time from quote to invoice; for a payment
	// moving from open, the time from invoice to payment.
	Since time.Duration
}

// inflight counts the requests a Vendor is serving (CallItem, CallFree).
type inflight struct{ n atomic.Int64 }

// InFlight returns how many tools/call (prompt, resource) requests the
// Vendor is serving now, waiting for payment included. Cheap.
func (v *Vendor) InFlight() int64 { return v.flight.n.Load() }
