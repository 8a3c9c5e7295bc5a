// Package vend is capvend's core: the Vendor that sells MCP tool calls,
// prompt gets and resource reads, exactly once per payment, whatever the
// front or the way to pay.
//
// # What it owns
//
// The domain types of a priced call (CallRequest, Call, Payment,
// Settlement, Result, Binding), the state machine a call and its payment
// move through (CallState), the sentinel and typed errors every front
// maps to JSON-RPC, and the small interfaces vend uses: a Ledger that
// records every state change durably, PaymentBackends, a ToolSource of
// upstream tools and a PriceBook. The Vendor admits a request, quotes it,
// chooses how it is paid from the table of ways to pay (Schemes, one
// scheme_*.go file each), runs the item once, stores the answer for a
// replay and refunds what did not deliver (refund.go). Around that:
// payment tokens, prepaid credit (credit.go), pay pages, the limits
// (limits.go), free calls on a short path (free.go) and recovery after a
// crash (Recover).
//
// # How it fits
//
// Of capvend's packages vend imports only pricing: no adapter, no
// Lightning or Cashu library and no SQL. The fronts (adapters/mcpfront,
// adapters/ctxvm) call it, the payment backends (billing/...), the ledger
// and adapters/upstream implement its interfaces from outside, and
// internal/cli wires them together. docs/ARCHITECTURE.md, "What may import what", holds the rule.
//
// # Where the detail is
//
// docs/ARCHITECTURE.md: the flow of a priced call (parse once, validate,
// quote, choose the way to pay, record, ask a backend, claim, run once),
// the table of ways to pay with one sequence each, the ledger's state
// machines with credit accounts, and crashes. docs/PAYING.md: what
// clients send, with payment tokens and prepaid credit on the wire.
// docs/OPERATING.md: prices, limits and refunds as the operator sets them.
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
