package vend

// CallState is where a priced call stands. The legal moves are:
//
//	quoted ──► awaiting_payment ──► paid ──► executing ──► delivered
//	  │               │               │           │
//	  │               │               │           └──► failed ──► refunded
//	  │               │               └──────────────────────────► refunded
//	  └──► expired / canceled ◄───────┘ (before payment only)
//
// delivered, refunded, expired and canceled are final.
type CallState string

// The states of a call.
const (
	CallQuoted          CallState = "quoted"           // price computed, nothing asked of the client yet
	CallAwaitingPayment CallState = "awaiting_payment" // a payment request was handed to the client
	CallPaid            CallState = "paid"             // money is in (or locked in, for a hold invoice)
	CallExecuting       CallState = "executing"        // the upstream tool is running
	CallDelivered       CallState = "delivered"        // the result was stored and answered
	CallFailed          CallState = "failed"           // the tool failed after payment: a refund is owed
	CallRefunded        CallState = "refunded"         // the client's money was returned (or a hold invoice cancelled)
	CallExpired         CallState = "expired"          // the payment request expired unpaid
	CallCanceled        CallState = "canceled"         // given up before payment (client gone, backend error)
)

var callTransitions = map[CallState][]CallState{
	CallQuoted:          {CallAwaitingPayment, CallExpired, CallCanceled},
	CallAwaitingPayment: {CallPaid, CallExpired, CallCanceled},
	CallPaid:            {CallExecuting, CallRefunded},
	CallExecuting:       {CallDelivered, CallFailed},
	CallFailed:          {CallRefunded},
}

// CallStates lists every call state, in lifecycle order.
func CallStates() []CallState {
	return []CallState{CallQuoted, CallAwaitingPayment, CallPaid, CallExecuting,
		CallDelivered, CallFailed, CallRefunded, CallExpired, CallCanceled}
}

// CanTransition reports whether a call may move from s to next.
func (s CallState) CanTransition(next CallState) bool {
	for _, t := range callTransitions[s] {
		if t == next {
			return true
		}
	}
	return false
}

// Final reports whether no transition leaves s.
func (s CallState) Final() bool { return len(callTransitions[s]) == 0 }

// Valid reports whether s is a known state.
func (s CallState) Valid() bool {
	for _, k := range CallStates() {
		if k == s {
			return true
		}
	}
	return false
}

// PaymentState is where a payment request stands.
type PaymentState string

// The states of a payment.
const (
	PaymentOpen     PaymentState = "open"     // handed to the client, not paid
	PaymentAccepted PaymentState = "accepted" // hold invoice: the HTLC is locked in, not yet settled
	PaymentSettled  PaymentState = "settled"  // the money is ours
	PaymentCanceled PaymentState = "canceled" // withdrawn (a cancelled hold invoice returns the money)
	PaymentExpired  PaymentState = "expired"  // expired unpaid
)

var paymentTransitions = map[PaymentState][]PaymentState{
	PaymentOpen:     {PaymentAccepted, PaymentSettled, PaymentCanceled, PaymentExpired},
	PaymentAccepted: {PaymentSettled, PaymentCanceled},
	// A late payment: only a Cashu mint quote, whose invoice stays
	// payable at the mint after capvend gave up on it, or a token whose
	// swap's outcome was learned late (see LatePayable).
	PaymentExpired:  {PaymentSettled},
	PaymentCanceled: {PaymentSettled},
}

// LatePayable reports whether a payment of kind k can still be paid after
// capvend expired or canceled it: a mint quote's invoice belongs to the
// mint and cannot be withdrawn, nor can a wallet's plain invoice (NWC); a
// token's swap whose answer capvend never got (a crash, a timeout) may
// turn out to have happened. Such money is recorded and owed back.
func LatePayable(k PaymentKind) bool {
	return k == KindMintQuote || k == KindToken || k == KindWalletInvoice
}

// PaymentStates lists every payment state.
func PaymentStates() []PaymentState {
	return []PaymentState{PaymentOpen, PaymentAccepted, PaymentSettled, PaymentCanceled, PaymentExpired}
}

// CanTransition reports whether a payment may move from s to next.
func (s PaymentState) CanTransition(next PaymentState) bool {
	for _, t := range paymentTransitions[s] {
		if t == next {
			return true
		}
	}
	return false
}
