package vend

import (
	"context"
	"time"
)

// PaymentRequest is what vend asks of a payment backend for one call.
type PaymentRequest struct {
	CallID CallID
	Amount Msat
	Memo   string        // shown in the client's wallet; never a secret
	Expiry time.Duration // how long the request stays payable
	// Hold asks for a hold invoice where the backend can issue one: the
	// payment is locked in, and settled only by SettleHeld after the tool
	// succeeded, or returned by CancelHeld.
	Hold bool
}

// PaymentEvent reports a change of a payment that a backend learned of and
// already recorded in the ledger. Payment.State says what happened:
// accepted (a hold invoice's HTLC is locked in), settled, canceled or
// expired.
type PaymentEvent struct {
	Payment Payment
}

// PaymentBackend issues payment requests and learns of their settlement.
// Implementations record every change through the ledger they were given,
// each exactly once, before reporting it.
type PaymentBackend interface {
	// Name names the backend (lnd, cashu, nwc, nwc:<name>).
	Name() Backend
	// Request creates a payment request at the backend and records it
	// for the call, which moves to awaiting_payment. The returned payment
	// holds what the client must pay (Bolt11) and its expiry. On error
	// nothing is recorded.
	Request(ctx context.Context, r PaymentRequest) (Payment, error)
	// Cancel withdraws an unpaid request (a hold invoice that is only
	// locked in is canceled too, returning the money) and records it
	// canceled. Canceling a settled payment is an error; canceling a
	// canceled one is not.
	Cancel(ctx context.Context, ref string) error
	// Run watches the backend until ctx ends: it records each settlement
	// (and acceptance, expiry) exactly once and then calls report. After
	// a restart it finds what happened while it was not watching. It
	// returns ctx's error, or an error that makes watching impossible.
	Run(ctx context.Context, report func(PaymentEvent)) error
}

// Availability is a backend that can say it cannot issue payment
// requests now (its wallet is out of reach): a call's invoice is then
// asked of the next backend (see chooseBackend).
type Availability interface {
	// Available reports whether Request can be served now.
	Available() bool
}

// HoldSettler is a backend that can settle later: Request with Hold issues
// a hold invoice that SettleHeld settles (after the tool succeeded) or
// Cancel returns to the client.
type HoldSettler interface {
	PaymentBackend
	// CanHold reports whether hold invoices are available (for LND: the
	// macaroon allows them).
	CanHold() bool
	// SettleHeld settles an accepted hold invoice and records the
	// settlement exactly once, reporting it through the function Run was
	// given (the settlement the watcher sees afterwards is not reported
	// again). Settling a settled payment is not an error.
	SettleHeld(ctx context.Context, ref string) (Payment, error)
}

// TokenReceipt is the result of accepting a bearer Cashu token.
type TokenReceipt struct {
	Payment Payment // settled, recorded for the call
	Change  string  // a token with what was paid beyond the price, "" if none
}

// TokenAcceptor is a backend that takes bearer ecash handed over with a
// call: it checks the token (trusted mint, unit sat, amount covering the
// price and the mint's fees), redeems it at the mint, and records the
// payment settled for the call, before anything runs.
type TokenAcceptor interface {
	AcceptToken(ctx context.Context, id CallID, price Msat, token string) (TokenReceipt, error)
}
