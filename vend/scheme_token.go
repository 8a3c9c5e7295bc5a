package vend

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// schemePaymentToken: the payment token (cvp_...) of a payment-required
// answer, given back as PaymentArg or _meta[MetaPaymentToken], releases
// the one call it names, once, to whoever holds it: for clients with
// neither a session nor _meta (a stock MCP host, where only the model can
// act). Issued only on a private channel.
var schemePaymentToken = Scheme{Name: SchemePaymentToken, Credential: "the payment token (cvp_...) of a payment-required answer",
	Bearer: true, Releases: ReleasesCall, Private: true, HandsBack: "the token (the payment-required answer)"}

// PaymentArg is the tool argument that carries a payment token on a
// retry: fronts that hand out tokens (CallRequest.PaymentTokens) list it
// in priced tools' input schemas, and vend strips it from a tool call's
// arguments before they are validated, priced, hashed, recorded or sent
// upstream (the upstream never sees it). A tool whose own input schema
// declares a property of that name is not offered (Tools, CallItem's
// ErrUnknownTool): capvend could not tell its argument from a token.
const PaymentArg = "capvend_payment"

// MetaPaymentToken is the _meta key that may carry a payment token
// instead of PaymentArg (a prompts/get or resources/read has no argument
// of capvend's to carry it).
const MetaPaymentToken = "capvend/payment"

// Errors of a call presenting a payment token (CallRequest.PaymentToken).
// Nothing runs and nothing is charged.
var (
	// ErrTokenUnknown: no payment token like it was ever issued.
	ErrTokenUnknown = errors.New("unknown payment token")
	// ErrTokenMismatch: the token was issued for another call (another
	// kind, tool or arguments). Fronts answer like ErrRequestReused
	// (-32600).
	ErrTokenMismatch = errors.New("payment token is for another call")
	// ErrTokenUsed: the call the token paid for ran (or is running, or
	// was refunded): a token is good for one execution.
	ErrTokenUsed = errors.New("payment token already used")
	// ErrTokenExpired: the token's invoice expired (or was withdrawn)
	// unpaid. It matches ErrPaymentExpired.
	ErrTokenExpired = fmt.Errorf("payment token's invoice expired unpaid: %w", ErrPaymentExpired)
	// ErrTokenCanceled: the call the token (or macaroon, or credential)
	// names was canceled (by its client, or by a restore of the ledger
	// that ended it unrun): nothing runs, and a payment made for it is
	// owed back. Not ErrTokenExpired: that answer tells the client to
	// pay again.
	ErrTokenCanceled = errors.New("payment token's call was canceled")
)

// endedGrant is the error of a credential whose call ended unrun: expired
// (its invoice expired unpaid) or canceled. It goes to whoever presents
// the credential, so it says nothing of why the call was canceled: the
// reason in the books is the operator's (a restore names the replica the
// ledger came from; a backend's error names its node).
func endedGrant(c Call) error {
	if c.State == CallCanceled {
		return errCanceledOwed
	}
	return ErrTokenExpired
}

// errCanceledOwed is ErrTokenCanceled as clients are told it.
var errCanceledOwed = fmt.Errorf("%w; a payment made for it is owed back, never run", ErrTokenCanceled)

// GrantTokens is the ledger's role of the payment-token scheme: the
// payment tokens of explicit-gating grants.
type GrantTokens interface {
	// AddGrantToken records tokenHash (hex SHA-256 of a token) as naming
	// the explicit-gating call id, payable until expires (its invoice's
	// expiry). Atomic; a hash recorded before, or a call that is not an
	// explicit-gating one, is an error and nothing is recorded.
	AddGrantToken(ctx context.Context, id CallID, tokenHash string, expires time.Time) error
	// GrantByToken returns the call tokenHash names, as it is now, and
	// the token's expiry; ErrNotFound if no such token was recorded.
	// Read only.
	GrantByToken(ctx context.Context, tokenHash string) (Call, time.Time, error)
}

// tokenPrefix starts every payment token, so that a person (or a model)
// can tell one from an invoice or a preimage.
const tokenPrefix = "cvp_"

// newPaymentToken returns a fresh payment token (160 random bits) and the
// hash the ledger keeps of it.
func newPaymentToken() (token, hash string, err error) {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = tokenPrefix + hex.EncodeToString(b[:])
	return token, tokenHash(token), nil
}

// tokenHash is what the ledger keeps of a token: its SHA-256, hex.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// issueToken records a new payment token for the explicit-gating call c
// (whose payment is c.pay) and returns it.
func (c *pending) issueToken(ctx context.Context) (string, error) {
	gt := c.v.cfg.Ledger
	tok, hash, err := newPaymentToken()
	if err != nil {
		return "", err
	}
	if err := gt.AddGrantToken(ctx, c.call.ID, hash, c.pay.ExpiresAt); err != nil {
		return "", err
	}
	return tok, nil
}

// grantByToken finds the call r's payment token names, and refuses the
// token unless that call sells exactly bind and is awaiting payment (its
// invoice not yet expired) or paid and not yet run.
func (v *Vendor) grantByToken(ctx context.Context, r *CallRequest, bind Binding) (Call, error) {
	c, expires, err := v.cfg.Ledger.GrantByToken(ctx, tokenHash(r.PaymentToken))
	if errors.Is(err, ErrNotFound) {
		return Call{}, ErrTokenUnknown
	}
	if err != nil {
		return Call{}, err
	}
	if c.Binding() != bind {
		return Call{}, ErrTokenMismatch
	}
	switch c.State {
	case CallPaid:
		return c, nil
	case CallAwaitingPayment:
		if !time.Now().Before(expires) {
			return Call{}, ErrTokenExpired
		}
		return c, nil
	case CallExpired, CallCanceled:
		return Call{}, endedGrant(c)
	case CallQuoted: // never: a token is issued with the payment request
		return Call{}, ErrTokenUnknown
	}
	return Call{}, ErrTokenUsed
}

// takePaymentArg removes PaymentArg from a tool call's parsed arguments
// (the root object) and returns its value: "" when absent, null (models
// fill optional arguments so) or empty. Any other value that is not a
// string is invalid params.
func takePaymentArg(m map[string]any) (string, error) {
	return takeStringArg(m, PaymentArg, "the value of a payment-required answer")
}

// takeStringArg removes the argument name from m and returns its string
// value ("" when absent or null); what is a description of the value for
// the error of a value that is no string.
func takeStringArg(m map[string]any, name, what string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", nil
	}
	delete(m, name)
	if v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s must be a string (%s)", name, what)
	}
	return s, nil
}

// declaresPaymentArg reports whether a tool's input schema declares a
// property named PaymentArg (or CreditArg) at its root.
func declaresPaymentArg(schema json.RawMessage) bool {
	if !bytes.Contains(schema, []byte(PaymentArg)) && !bytes.Contains(schema, []byte(CreditArg)) {
		return false
	}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return false
	}
	_, ok := s.Properties[PaymentArg]
	_, credit := s.Properties[CreditArg]
	return ok || credit
}

// offered reports whether t may be offered: a tool declaring PaymentArg
// is not (logged once per tool name).
func (v *Vendor) offered(t *Item) bool {
	if t.Kind.Or() != ItemTool || !declaresPaymentArg(t.InputSchema) {
		return true
	}
	if _, seen := v.reserved.LoadOrStore(t.Server+"\x00"+t.Name, true); !seen {
		v.cfg.Log.Error("vend: tool not offered: its input schema declares "+PaymentArg+" or "+CreditArg+", which capvend reserves for payment and credit tokens",
			"tool", t.Name, "server", t.Server)
	}
	return false
}
