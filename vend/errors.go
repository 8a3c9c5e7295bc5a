package vend

import (
	"errors"
	"fmt"
)

// Sentinel errors. Implementations wrap them with %w; callers test with
// errors.Is.
var (
	// ErrNotFound: no call, payment or result with that key.
	ErrNotFound = errors.New("not found")
	// ErrIllegalTransition: the requested state change is not an edge of
	// the state machine, or the record is no longer in the expected state.
	// Nothing was changed.
	ErrIllegalTransition = errors.New("illegal state transition")
	// ErrAlreadySettled: the payment was settled before; this settlement
	// was not recorded again.
	ErrAlreadySettled = errors.New("payment already settled")
	// ErrAlreadyClaimed: the settled payment was already consumed by a
	// call (a paid grant is single-use).
	ErrAlreadyClaimed = errors.New("payment already claimed")
	// ErrProofSpent: the Cashu proof was received before.
	ErrProofSpent = errors.New("cashu proof already received")
	// ErrDuplicatePayment: a payment with that hash or quote id exists.
	ErrDuplicatePayment = errors.New("payment reference already recorded")
	// ErrUnpaid: the call has no settled payment covering its price.
	ErrUnpaid = errors.New("call is not paid")
	// ErrUnderpaid: a settlement smaller than the payment's amount; it
	// was not recorded.
	ErrUnderpaid = errors.New("payment is less than the amount asked")
	// ErrForeignMint: a Cashu token from a mint the server does not trust.
	ErrForeignMint = errors.New("cashu token from an untrusted mint")
	// ErrBadToken: a Cashu token that is malformed, not in sats, or
	// locked to spending conditions.
	ErrBadToken = errors.New("cashu token is not a usable sat bearer token")
	// ErrWrongUnit: a Cashu token denominated in another unit than sat.
	// It matches ErrBadToken too.
	ErrWrongUnit = fmt.Errorf("cashu token is not in sat: %w", ErrBadToken)
	// ErrRequestReused: a request key (transport, client, request id)
	// already names a call or free use of another kind, item or
	// arguments. The request is refused: it never attaches to, waits on
	// or replays that call. Fronts answer JSON-RPC -32600.
	ErrRequestReused = errors.New("request id reused with different parameters")
	// ErrExecutionMismatch: an execution would send upstream something
	// other than what its call sold (another kind, server, tool or
	// arguments); it was not started and nothing was recorded.
	ErrExecutionMismatch = errors.New("execution does not match what the call sold")
	// ErrMintUnavailable: the Cashu mint could not be reached (or failed)
	// while a token was taken; the token was not spent by this server,
	// and the same token may pay again once the mint is back.
	ErrMintUnavailable = errors.New("cashu mint unavailable")
)

// TransitionError describes a refused state change. It matches
// ErrIllegalTransition with errors.Is.
type TransitionError struct {
	What string // "call 12" or "payment 7"
	From string // the state the record is in
	To   string // the state that was asked for
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("%s: illegal state transition %s -> %s", e.What, e.From, e.To)
}

// Is makes errors.Is(err, ErrIllegalTransition) true.
func (e *TransitionError) Is(target error) bool { return target == ErrIllegalTransition }
