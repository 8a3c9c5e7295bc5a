package vend

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MPP Lightning charge: the "Payment" HTTP authentication scheme's
// "charge" intent for the "lightning" method (draft-lightning-charge-00,
// as @getalby/lightning-tools' fetchWithMpp and Lightning Labs' Aperture
// speak it; docs/PAYING.md has the wire). An unpaid explicit-gating
// call of a request that asked for HTTP 402 (CallRequest.L402) is answered
// with a challenge beside its invoice (PaymentRequiredError.MPP); the
// client pays the invoice and repeats the call with the credential
// (CallRequest.MPP): the challenge echoed, and the preimage.
//
// The challenge needs no record: its id is an HMAC, under a key derived
// from the L402 root key, of the other auth-params (realm, method, intent,
// request, expires), and its request names the invoice and its payment
// hash. A credential is good when its echoed challenge's id is that HMAC,
// its preimage hashes to the request's payment hash, and that payment is
// the one of a call selling exactly what the request asks: it releases
// that call, once, like an L402 macaroon.

// schemeMPP: an MPP Payment credential. The preimage alone is no secret
// (every routing hop learns it), but the challenge id is: the payer's
// wallet sees only the invoice, and the id is handed to the client in its
// 402 answer only. So the credential is a bearer one, and it releases the
// one call its invoice pays.
var schemeMPP = Scheme{Name: SchemeMPP, Credential: "an MPP Payment credential (the challenge id) with its invoice's preimage",
	Bearer: true, Releases: ReleasesCall, Private: true, HandsBack: "the challenge id (the 402 answer)"}

// MPP auth-param values capvend issues.
const (
	MPPMethod = "lightning"
	MPPIntent = "charge"
	// MPPRealm is the realm of every challenge: the service, as L402's.
	MPPRealm = L402Service
)

// ErrMPPInvalid refuses an MPP credential that does not verify: not
// base64url JSON, not a challenge of this server (its id), the wrong
// method or intent, expired, or a preimage that is not its invoice's.
// Fronts answer HTTP 401. Nothing runs and nothing is charged.
var ErrMPPInvalid = errors.New("invalid MPP Payment credential")

// MPPChallenge is a "Payment" challenge's auth-params
// (WWW-Authenticate: Payment id="…", realm="…", method="lightning",
// intent="charge", request="…", expires="…").
type MPPChallenge struct {
	ID      string `json:"id"`
	Realm   string `json:"realm"`
	Method  string `json:"method"`
	Intent  string `json:"intent"`
	Request string `json:"request"` // base64url (no padding) of the JCS request object
	Expires string `json:"expires,omitempty"`
}

// mppRequest is a challenge's request object (draft-lightning-charge-00's
// charge request): amount in sats, currency "sat", the invoice.
type mppRequest struct {
	Amount        string           `json:"amount"`
	Currency      string           `json:"currency"`
	Description   string           `json:"description,omitempty"`
	MethodDetails mppMethodDetails `json:"methodDetails"`
}

type mppMethodDetails struct {
	Invoice     string `json:"invoice"`
	Network     string `json:"network,omitempty"`
	PaymentHash string `json:"paymentHash,omitempty"`
}

// mppCredential is the decoded Authorization: Payment token.
type mppCredential struct {
	Challenge MPPChallenge `json:"challenge"`
	Source    string       `json:"source,omitempty"`
	Payload   struct {
		Preimage string `json:"preimage"`
	} `json:"payload"`
}

// jcs is the JSON Canonicalization Scheme (RFC 8785) of v, for values
// whose strings are all that vary: encoding/json sorts map keys and
// struct fields are declared sorted; HTML is not escaped.
func jcs(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimRight(b.Bytes(), "\n")
}

// mppID is the id of a challenge with these other auth-params.
func mppID(key []byte, c MPPChallenge) string {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{c.Realm, c.Method, c.Intent, c.Request, c.Expires} {
		m.Write([]byte(f))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// mppKey derives the challenge key from the L402 root key: one secret in
// the ledger, a key of its own for each use.
func (v *Vendor) mppKey(ctx context.Context) ([]byte, error) {
	root, _, err := v.l402RootKey(ctx)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, root)
	m.Write([]byte("capvend mpp challenge v1"))
	return m.Sum(nil), nil
}

// lightningNetwork names the network of a bolt11 by its prefix, as
// draft-lightning-charge-00 names them ("mainnet", "regtest", "signet";
// testnet as "testnet").
func lightningNetwork(bolt11 string) string {
	s := strings.ToLower(bolt11)
	switch {
	case strings.HasPrefix(s, "lnbcrt"):
		return "regtest"
	case strings.HasPrefix(s, "lntbs"):
		return "signet"
	case strings.HasPrefix(s, "lntb"):
		return "testnet"
	}
	return "mainnet"
}

// addMPP adds to e, the explicit-gating answer of c, the MPP challenge
// of its invoice, when the request asked for HTTP 402 answers on a
// private channel and the payment is an LND invoice (whose Ref is the
// payment hash the preimage proves).
func (c *pending) addMPP(ctx context.Context, e *PaymentRequiredError) error {
	if !c.r.L402 || !c.r.secretsAllowed() || c.pay.Kind != KindInvoice {
		return nil
	}
	key, err := c.v.mppKey(ctx)
	if err != nil {
		return fmt.Errorf("MPP challenge of call %d: %w", c.call.ID, err)
	}
	req := mppRequest{Amount: strconv.FormatInt(c.pay.Amount.SatsCeil(), 10), Currency: "sat",
		Description: describe(&c.t, c.pay.Amount),
		MethodDetails: mppMethodDetails{Invoice: c.pay.Bolt11, Network: lightningNetwork(c.pay.Bolt11),
			PaymentHash: c.pay.Ref}}
	ch := MPPChallenge{Realm: MPPRealm, Method: MPPMethod, Intent: MPPIntent,
		Request: base64.RawURLEncoding.EncodeToString(jcs(req)), Expires: c.pay.ExpiresAt.UTC().Format(time.RFC3339)}
	ch.ID = mppID(key, ch)
	e.MPP = &ch
	return nil
}

// parseMPP decodes an Authorization: Payment token (base64url, padded or
// not) and checks its shape and its id under key, at now: the request's
// payment hash and the verified preimage (hex, lowercase).
func parseMPP(key []byte, token string, now time.Time) (hash, preimage string, err error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(strings.TrimSpace(token), "="))
	if err != nil {
		return "", "", fmt.Errorf("%w: not base64url", ErrMPPInvalid)
	}
	var cr mppCredential
	if err := json.Unmarshal(raw, &cr); err != nil {
		return "", "", fmt.Errorf("%w: not a credential object", ErrMPPInvalid)
	}
	ch := cr.Challenge
	if ch.Method != MPPMethod || ch.Intent != MPPIntent {
		return "", "", fmt.Errorf("%w: not a lightning charge", ErrMPPInvalid)
	}
	if !hmac.Equal([]byte(ch.ID), []byte(mppID(key, ch))) {
		return "", "", fmt.Errorf("%w: not a challenge of this server", ErrMPPInvalid)
	}
	// Issued here: the rest of the challenge is what capvend wrote.
	if exp, err := time.Parse(time.RFC3339, ch.Expires); err != nil || !now.Before(exp.Add(L402Grace)) {
		return "", "", fmt.Errorf("%w: challenge expired", ErrMPPInvalid)
	}
	rb, _ := base64.RawURLEncoding.DecodeString(ch.Request)
	var req mppRequest
	if err := json.Unmarshal(rb, &req); err != nil || req.MethodDetails.PaymentHash == "" {
		return "", "", fmt.Errorf("%w: no payment hash", ErrMPPInvalid)
	}
	pre, err := hex.DecodeString(cr.Payload.Preimage)
	if err != nil || len(pre) != 32 {
		return "", "", fmt.Errorf("%w: no preimage (32 bytes, hex)", ErrMPPInvalid)
	}
	sum := sha256.Sum256(pre)
	if hex.EncodeToString(sum[:]) != req.MethodDetails.PaymentHash {
		return "", "", fmt.Errorf("%w: the preimage is not the invoice's", ErrMPPInvalid)
	}
	return req.MethodDetails.PaymentHash, hex.EncodeToString(pre), nil
}

// grantByMPP verifies r's MPP credential for a call selling bind and
// returns the call it releases: paid, or awaiting a payment the preimage
// proves (the backend reports it soon).
func (v *Vendor) grantByMPP(ctx context.Context, r *CallRequest, bind Binding) (Call, error) {
	key, err := v.mppKey(ctx)
	if err != nil {
		return Call{}, err
	}
	hash, _, err := parseMPP(key, r.MPP, time.Now())
	if err != nil {
		return Call{}, err
	}
	p, err := v.cfg.Ledger.Payment(ctx, hash)
	if errors.Is(err, ErrNotFound) || (err == nil && p.Kind != KindInvoice) {
		return Call{}, fmt.Errorf("%w: no such payment", ErrMPPInvalid)
	}
	if err != nil {
		return Call{}, err
	}
	return v.grantOfPayment(ctx, p, bind, ErrMPPInvalid)
}

// grantOfPayment returns the call payment p pays if it sells exactly bind
// and may still be released: paid, or awaiting p. invalid is the
// scheme's refusal sentinel.
func (v *Vendor) grantOfPayment(ctx context.Context, p Payment, bind Binding, invalid error) (Call, error) {
	c, err := v.cfg.Ledger.Call(ctx, p.CallID)
	if err != nil {
		return Call{}, err
	}
	if c.Binding() != bind {
		return Call{}, fmt.Errorf("%w: %w", invalid, ErrTokenMismatch)
	}
	switch c.State {
	case CallPaid, CallAwaitingPayment:
		return c, nil
	case CallExpired, CallCanceled:
		return Call{}, endedGrant(c)
	case CallQuoted:
		return Call{}, fmt.Errorf("%w: no such payment", invalid)
	}
	return Call{}, ErrTokenUsed
}
