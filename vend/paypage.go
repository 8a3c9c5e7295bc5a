package vend

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"time"
)

// The pay page (GET /pay/{token} on the HTTP listener) shows a person
// what to pay for a call: the tool, the amount, the invoice as a QR code
// and a lightning: link, its expiry, and whether it was paid.
//
// Its token is a view-only page token (cvv_...), not the call's payment
// token (cvp_...): a URL ends up in browser history, in proxy and server
// logs, in a Referer, in a chat transcript, and a payment token there
// would release the paid call to whoever reads it. The page token
// releases nothing: it names the call (its id) with an HMAC under a key
// derived from the ledger's root key, so it cannot be guessed or made
// for another call, and needs no record. What the page shows is what the
// payer needs and may learn anyway (the invoice, which every bound scheme
// refuses to another client, the amount, the expiry, paid or not): never
// a payment token, macaroon, MPP challenge id or preimage.

// payPagePrefix starts every page token.
const payPagePrefix = "cvv_"

// ErrPayPageUnknown: a pay page token that is malformed, not made by this
// server, or names a call without an invoice. Fronts answer 404.
var ErrPayPageUnknown = errors.New("unknown pay page")

// PayPage is what the pay page of a call shows.
type PayPage struct {
	Call        CallID
	Tool        string // the name the client called (exposed)
	Description string // what is sold and how the price was computed
	Amount      Msat
	Invoice     string // the bolt11 to pay
	Ref         string // the payment's reference (payment hash, quote id)
	ExpiresAt   time.Time
	// Paid: the payment settled (or, a hold invoice, is locked in), or
	// the call went on past it. Expired: it can no longer be paid.
	Paid, Expired bool
	// Canceled: the call was canceled (by its client, or by a restore of
	// the ledger) and never runs; with Paid, what was paid is owed back.
	Canceled bool
}

// payPageKey derives the page token key from the L402 root key.
func (v *Vendor) payPageKey(ctx context.Context) ([]byte, error) {
	root, _, err := v.l402RootKey(ctx)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, root)
	m.Write([]byte("capvend pay page v1"))
	return m.Sum(nil), nil
}

func payPageMAC(key []byte, id CallID) []byte {
	m := hmac.New(sha256.New, key)
	_ = binary.Write(m, binary.BigEndian, uint64(id))
	return m.Sum(nil)[:16]
}

// PayPageToken returns the view-only pay page token of call id. It
// releases nothing (see above); the same call always has the same token.
func (v *Vendor) PayPageToken(ctx context.Context, id CallID) (string, error) {
	key, err := v.payPageKey(ctx)
	if err != nil {
		return "", err
	}
	b := binary.BigEndian.AppendUint64(nil, uint64(id))
	return payPagePrefix + base64.RawURLEncoding.EncodeToString(append(b, payPageMAC(key, id)...)), nil
}

// PayPage returns what the pay page of token shows now: the call's newest
// invoice. ErrPayPageUnknown for a token this server did not make, or a
// call with no invoice. Read only.
func (v *Vendor) PayPage(ctx context.Context, token string) (PayPage, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, payPagePrefix))
	if !strings.HasPrefix(token, payPagePrefix) || err != nil || len(raw) != 8+16 {
		return PayPage{}, ErrPayPageUnknown
	}
	id := CallID(binary.BigEndian.Uint64(raw))
	key, err := v.payPageKey(ctx)
	if err != nil {
		return PayPage{}, err
	}
	if !hmac.Equal(raw[8:], payPageMAC(key, id)) {
		return PayPage{}, ErrPayPageUnknown
	}
	c, err := v.cfg.Ledger.Call(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return PayPage{}, ErrPayPageUnknown
	}
	if err != nil {
		return PayPage{}, err
	}
	ps, err := v.cfg.Ledger.CallPayments(ctx, id)
	if err != nil {
		return PayPage{}, err
	}
	var p *Payment
	for i := range ps {
		if ps[i].Bolt11 != "" {
			p = &ps[i]
		}
	}
	if p == nil {
		return PayPage{}, ErrPayPageUnknown
	}
	pg := PayPage{Call: id, Tool: c.Name, Amount: p.Amount, Invoice: p.Bolt11, Ref: p.Ref, ExpiresAt: p.ExpiresAt}
	if name, _, _, err := v.cfg.Ledger.CallArguments(ctx, id); err == nil && name != "" {
		pg.Tool = name // the name the client called
		if t, err := v.lookup(c.Kind, name); err == nil {
			pg.Description = describe(&t, p.Amount)
		}
	}
	switch {
	case c.State == CallCanceled:
		pg.Canceled = true
		pg.Paid = p.State == PaymentSettled || p.State == PaymentAccepted
	case p.State == PaymentSettled || p.State == PaymentAccepted:
		pg.Paid = true
	case c.State != CallQuoted && c.State != CallAwaitingPayment && c.State != CallExpired && c.State != CallCanceled:
		pg.Paid = true // paid, running or ran: the payment was taken
	case p.State != PaymentOpen || !time.Now().Before(p.ExpiresAt):
		pg.Expired = true
	}
	return pg, nil
}

// addPayPage adds to e, the explicit-gating answer of c, the pay page
// token of its call when the payment has an invoice.
func (c *pending) addPayPage(ctx context.Context, e *PaymentRequiredError) {
	if c.pay.Bolt11 == "" {
		return
	}
	if tok, err := c.v.PayPageToken(ctx, c.call.ID); err == nil {
		e.PayPage = tok
	}
}

// showPayPage hands the request's front the pay page token of c's call
// (CallRequest.PayPage), once it was told what to pay.
func (c *pending) showPayPage(ctx context.Context) {
	if c.r.PayPage == nil || c.pay.Bolt11 == "" {
		return
	}
	if tok, err := c.v.PayPageToken(ctx, c.call.ID); err == nil {
		c.r.PayPage(tok)
	}
}
