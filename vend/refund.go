package vend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A refund is money owed back to a client for a paid call that did not
// deliver (the tool failed, a crash interrupted a call that must not run
// twice, a payment arrived after capvend gave up). A hold invoice is
// canceled instead and needs no refund: Lightning returns the money. Every
// other payment's refund is a record in the ledger (owed) and the money in
// liabilities:refunds, until it is paid out:
//
//   - a Cashu payment (a token, or a mint quote's invoice) is paid back at
//     once as ecash: the backend's wallet makes a Cashu token of the mint
//     the payment came from, the payout is booked (liabilities:refunds to
//     assets:cashu:<mint>) and the token is handed to the client in the
//     answer (RefundError, or _meta[MetaRefund] of an isError result). If
//     the token cannot be made (the mint is down) the refund stays owed,
//     and is paid when the client repeats the request or by the operator;
//   - an LND payment on a plain invoice (or an NWC wallet's) stays owed:
//     the operator pays it with `capvend refunds pay` (a Cashu token to
//     hand over, or the bolt11 the client gave in _meta[MetaRefundInvoice],
//     paid from the Cashu wallet or an NWC wallet).
//
// A refund is paid at most once, by one payer: its payout is reserved in
// the ledger before any money leaves (Payout), and the ledger's schema
// allows one reservation and one payout per refund.

// RefundID identifies a refund in the ledger.
type RefundID int64

// RefundState is where a refund stands: owed, then paid (final).
type RefundState string

// The states of a refund.
const (
	RefundOwed RefundState = "owed" // the money is in liabilities:refunds
	RefundPaid RefundState = "paid" // paid out once; final
)

// RefundMethod is how a refund was paid out.
type RefundMethod string

// The ways to pay a refund.
const (
	RefundCashu  RefundMethod = "cashu"  // a Cashu token handed to the client
	RefundBolt11 RefundMethod = "bolt11" // the client's Lightning invoice, paid from the Cashu wallet (melt) or an NWC wallet
)

// Refund is money owed (or paid) back to a client for one call.
type Refund struct {
	ID        RefundID
	CallID    CallID
	PaymentID PaymentID // the settled payment the money came with
	Transport string    // who: the call's transport and client
	Client    string
	Amount    Msat    // what is owed: what the payment brought in for the call
	Backend   Backend // the payment's backend
	Kind      PaymentKind
	MintURL   string // a Cashu payment's mint: a Cashu refund is paid in its ecash
	// Invoice is the bolt11 the client gave for a refund
	// (_meta[MetaRefundInvoice]), "" if none.
	Invoice   string
	Reason    string
	State     RefundState
	CreatedAt time.Time
	// Set once paid.
	PaidAt time.Time
	Method RefundMethod
	Paid   Msat   // what the client got: the token's value or the invoice's amount
	Fee    Msat   // what paying cost beyond Paid (mint and Lightning fees)
	Token  string // the Cashu token paid (a bearer secret: never log it)
	Ref    string // a bolt11 payout's melt quote id, or its payment hash when an NWC wallet paid it
	// PaidFrom is what paid it: the mint whose ecash did, or the NWC
	// connection (NWCBackend) whose wallet did.
	PaidFrom string
}

// RefundPayout is how an owed refund was paid, for RefundLedger.PayRefund.
type RefundPayout struct {
	Method  RefundMethod
	MintURL string  // the wallet's mint whose ecash paid it ("" if NWC is set)
	NWC     Backend // the NWC connection whose wallet paid it (a bolt11)
	// Paid is what the client receives: a token's value (whole sats,
	// at most the owed amount rounded up to a sat) or a bolt11's amount
	// (at most the owed amount).
	Paid  Msat
	Fee   Msat   // what paying cost beyond Paid
	Token string // RefundCashu: the token
	Ref   string // RefundBolt11: the melt quote id, or the payment hash (NWC)
}

// ErrRefundPaid: the refund was paid out before; nothing was booked again.
var ErrRefundPaid = errors.New("refund already paid")

// RefundLedger is the ledger's role of refunds (*ledger.Ledger has it). The
// ledger creates a call's refund, owed, in the same transaction as the
// refund entry (Refund, or a late settlement).
type RefundLedger interface {
	// CallRefund returns the refund of a call, or ErrNotFound (the call
	// was not refunded, or its hold invoice was canceled).
	CallRefund(ctx context.Context, id CallID) (Refund, error)
	// PayRefund books the payout of an owed refund in one transaction:
	// the refund becomes paid with p, and one journal entry moves its
	// amount out of liabilities:refunds to the asset that paid it (fees
	// an expense). Exactly once: a refund paid before gives
	// ErrRefundPaid and books nothing.
	PayRefund(ctx context.Context, id RefundID, p RefundPayout) (Refund, error)
}

// RefundPayer is a payment backend that can pay a refund at once as ecash
// (billing/cashu).
type RefundPayer interface {
	// PayRefund pays an owed refund with a Cashu token from the
	// backend's wallet (the ecash of r.MintURL, else its first mint):
	// the payout is reserved in the ledger before the token is made (a
	// refund another payer has in flight is refused, ErrPayoutInFlight),
	// then booked. It returns the refund paid, with its token. A refund
	// paid already is returned as it is (the same token); an error
	// leaves it owed.
	PayRefund(ctx context.Context, r Refund) (Refund, error)
}

// RefundInfo is what a client learns of its refund: the JSON object sent
// in a failed call's error data ("refund") or result _meta[MetaRefund].
type RefundInfo struct {
	ID     int64  `json:"id"`
	Amount int64  `json:"amount"` // sats: the token's value, or what is owed (rounded up)
	Unit   string `json:"unit"`   // "sat"
	// Cashu is the token that pays the refund: redeem it at its mint.
	Cashu string `json:"cashu,omitempty"`
	// Owed is set while the refund is not paid: the server owes it (the
	// operator pays it, to the refund invoice if the client gave one).
	Owed bool `json:"owed,omitempty"`
	// Withheld is set when the refund was paid as a token that this
	// answer does not carry: it went to a public channel. The client
	// repeats its request encrypted to receive the token.
	Withheld bool `json:"withheld,omitempty"`
}

// Info is what the client is told of r.
func (r Refund) Info() RefundInfo {
	i := RefundInfo{ID: int64(r.ID), Amount: r.Amount.SatsCeil(), Unit: "sat"}
	if r.State == RefundPaid && r.Method == RefundCashu {
		i.Amount, i.Cashu = r.Paid.SatsCeil(), r.Token
	}
	i.Owed = r.State == RefundOwed
	return i
}

// withoutToken is i without its token, for an answer on a public
// channel: a paid refund's token is not shown there (Withheld says so).
func (i RefundInfo) withoutToken() RefundInfo {
	if i.Cashu != "" {
		i.Cashu, i.Withheld = "", true
	}
	return i
}

// RefundError is the answer to a paid call that failed and was refunded:
// Err says what failed (it matches ErrUpstream, or ErrPaymentFailed for a
// call refunded before it ran) and Refund how the money comes back.
// Fronts send Refund as the JSON-RPC error's data.refund.
type RefundError struct {
	Refund RefundInfo
	Err    error
}

func (e *RefundError) Error() string {
	if e.Refund.Owed {
		return fmt.Sprintf("%v (refund %d owed)", e.Err, e.Refund.ID)
	}
	return fmt.Sprintf("%v (refund %d paid)", e.Err, e.Refund.ID)
}

// Unwrap returns Err.
func (e *RefundError) Unwrap() error { return e.Err }

// The _meta keys of refunds.
const (
	// MetaRefundInvoice is the request _meta key of a bolt11 invoice the
	// client wants a refund paid to, if one is owed and cannot be paid
	// at once.
	MetaRefundInvoice = "capvend/refund_invoice"
	// MetaRefund is the result _meta key carrying the RefundInfo of a
	// refunded call whose tool answered with isError.
	MetaRefund = "capvend/refund"
)

// maxRefundInvoice bounds a refund invoice's length (a bolt11 with a long
// description and route hints stays far below).
const maxRefundInvoice = 2048

// checkRefundInvoice normalizes a client's refund invoice: "" stays "", a
// bolt11 ("lightning:" prefix allowed, any case) is returned lower-case,
// anything else is an error. The amount is checked when it is paid.
func checkRefundInvoice(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "lightning:")
	if s == "" {
		return "", nil
	}
	const charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
	sep := strings.LastIndexByte(s, '1')
	if len(s) > maxRefundInvoice || !strings.HasPrefix(s, "ln") || sep < 4 || len(s)-sep < 8 {
		return "", fmt.Errorf("_meta[%q] is not a bolt11 invoice", MetaRefundInvoice)
	}
	for _, c := range s[sep+1:] {
		if !strings.ContainsRune(charset, c) {
			return "", fmt.Errorf("_meta[%q] is not a bolt11 invoice", MetaRefundInvoice)
		}
	}
	return s, nil
}

// refunded completes the answer to c's refunded call: res (an isError
// result) or err (what failed), with the call's refund attached. An owed
// refund of a Cashu payment is paid now if the backend can (a token from
// its wallet); otherwise the client is told the refund is owed. A call
// without a refund (its hold invoice was canceled) is answered as it is.
// On a public channel the refund is never paid or shown as a token (it
// stays owed, or paid and not shown): the client repeats its request
// encrypted to receive it.
func (c *pending) refunded(ctx context.Context, res CallResult, err error) (CallResult, error) {
	v, call := c.v, &c.call
	r, rerr := v.cfg.Ledger.CallRefund(ctx, call.ID)
	if rerr != nil {
		if !errors.Is(rerr, ErrNotFound) {
			v.cfg.Log.Error("vend: reading a call's refund", "call", int64(call.ID), "err", rerr)
		}
		return res, err
	}
	if r.State == RefundOwed && r.Backend == BackendCashu && ctx.Value(noClientKey{}) == nil && c.r.secretsAllowed() {
		r = v.payRefund(ctx, r)
	}
	info := r.Info()
	if !c.r.secretsAllowed() {
		info = info.withoutToken()
	}
	if err != nil {
		return CallResult{}, &RefundError{Refund: info, Err: err}
	}
	res.Body = withRefundMeta(res.Body, info)
	return res, nil
}

type noClientKey struct{}

// withoutClient marks ctx as serving no client: work started by a payment
// report or by Recover, whose answer waits in the ledger for a replay. A
// Cashu refund is then left owed rather than made into a token nobody
// receives; the client's repeat of the request pays it.
func withoutClient(ctx context.Context) context.Context {
	return context.WithValue(ctx, noClientKey{}, true)
}

// payRefund pays an owed Cashu refund as ecash through a backend that can,
// and returns the refund as it then stands (still owed on failure).
func (v *Vendor) payRefund(ctx context.Context, r Refund) Refund {
	for _, b := range v.cfg.Backends {
		rp, ok := b.(RefundPayer)
		if !ok || b.Name() != r.Backend {
			continue
		}
		// The token, once made, must be booked: not the client's ctx.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		paid, err := rp.PayRefund(pctx, r)
		cancel()
		if err != nil {
			v.cfg.Log.Warn("vend: refund not paid as ecash now; it stays owed", "call", int64(r.CallID), "refund", int64(r.ID), "err", err)
			return r
		}
		v.cfg.Log.Info("vend: refund paid as ecash", "call", int64(r.CallID), "refund", int64(r.ID), "amount_msat", int64(paid.Paid))
		return paid
	}
	return r
}

// withRefundMeta adds info to a result's _meta under MetaRefund. A body
// that is not a JSON object is returned unchanged.
func withRefundMeta(body json.RawMessage, info RefundInfo) json.RawMessage {
	return withMeta(body, MetaRefund, info)
}
