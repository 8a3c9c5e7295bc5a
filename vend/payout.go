package vend

import (
	"errors"
	"time"
)

// A payout is money leaving capvend's Cashu wallet, or the wallet of an
// NWC connection, for someone: what is left of a credit account paid back
// to its client, a refund owed for a call, the operator's withdrawal (Cashu
// only). It is reserved in the ledger before anything leaves (one
// transaction), then the money leaves (a melt or the wallet's pay_invoice
// pays a bolt11, or a token is made and handed over), then the reservation
// is booked, or released if nothing left (one transaction each). Never
// sent first and booked after: a reservation takes credit out of the
// balance at once, claims a refund for one payer, and records what
// identifies the money on its way (the melt quote, the token, the
// invoice's payment hash) so that a process that dies in between leaves
// something the next one can resolve from the mint's or the wallet's
// word.

// PayoutID identifies a payout in the ledger.
type PayoutID int64

// PayoutKind is what a payout pays.
type PayoutKind string

// The kinds of payout.
const (
	PayoutCredit     PayoutKind = "credit"     // a credit account's balance, paid back to its client
	PayoutRefund     PayoutKind = "refund"     // a refund owed for a call
	PayoutWithdrawal PayoutKind = "withdrawal" // the operator's ecash melted to an invoice
)

// PayoutState is where a payout stands.
type PayoutState string

// The states of a payout: reserved, then booked or released (final).
const (
	PayoutReserved PayoutState = "reserved" // set aside; the money may be on its way
	PayoutBooked   PayoutState = "booked"   // it left, and is booked once
	PayoutReleased PayoutState = "released" // it did not leave; the reservation is undone
)

// Errors of payouts.
var (
	// ErrPayoutInFlight: what the payout would pay is reserved by another
	// payout not ended yet (another instance, or a process that died
	// paying it); nothing was reserved.
	ErrPayoutInFlight = errors.New("a payout of it is in flight")
	// ErrPayoutEnded: the payout was booked or released before; nothing
	// changed.
	ErrPayoutEnded = errors.New("the payout has ended")
)

// NewPayout is a payout to reserve.
type NewPayout struct {
	Kind    PayoutKind
	Account string   // PayoutCredit: the credit account
	Refund  RefundID // PayoutRefund: the refund
	Method  RefundMethod
	MintURL string // the mint whose ecash pays it ("" for an NWC payout)
	// NWC is the NWC connection whose wallet pays it (NWCBackend), ""
	// for a payout from the Cashu wallet. An NWC payout pays a bolt11
	// (RefundBolt11) and its Quote is the invoice's payment hash.
	NWC Backend
	// Wallet identifies the wallet that pays it: only a process holding
	// that wallet resolves the reservation if it is left in flight.
	Wallet string
	// Amount is what the recipient gets: a token's value (whole sats) or
	// a bolt11's amount. For a credit token, 0 reserves every whole sat
	// left in the account.
	Amount Msat
	// RefundBolt11 and withdrawals: the invoice, its melt quote (asked
	// for before the reservation, paid after it) and the quote's fee
	// reserve; from an NWC wallet, the invoice's payment hash and no fee
	// reserve.
	Invoice    string
	Quote      string
	FeeReserve Msat
}

// From names what pays np: its NWC connection, else its mint.
func (np NewPayout) From() string {
	if np.NWC != "" {
		return string(np.NWC)
	}
	return np.MintURL
}

// Payout is a payout as the ledger records it.
type Payout struct {
	ID PayoutID
	NewPayout
	State PayoutState
	// Token is the Cashu token of a token payout, recorded once made and
	// before it is handed over (a bearer secret: never log it).
	Token string
	// Fee is what paying cost beyond Amount (an expense): the token's
	// swap fee once recorded, the melt's fee (or the NWC wallet's
	// routing fee) once booked.
	Fee       Msat
	Reason    string // why it was released
	CreatedAt time.Time
	EndedAt   time.Time // zero while reserved
}
