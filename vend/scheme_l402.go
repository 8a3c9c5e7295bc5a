package vend

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/macaroon.v2"
)

// L402 (bLIP-0026, as Lightning Labs' Aperture speaks it): an unpaid
// explicit-gating call of a request that asked for it (CallRequest.L402)
// is answered with a macaroon beside its invoice
// (PaymentRequiredError.Macaroon); the client pays the invoice and repeats
// the call with the macaroon and the invoice's preimage
// (CallRequest.Macaroon, CallRequest.PaymentProof), which release that
// call, once, and nothing else.
//
// The macaroon's identifier is Aperture's (version 0): version (2 bytes,
// big endian) | payment hash (32) | token id (32), where capvend's token id
// is the call id (8 bytes, big endian) followed by 24 random bytes. Its
// first-party caveats, all of which must hold:
//
//	services=capvend:0                 the service (Aperture's form)
//	capvend_valid_until=<unix seconds> expiry: the invoice's, plus L402Grace
//	capvend_call=<kind> <args hash> <name>
//	                                   the one call it pays: item kind,
//	                                   canonical arguments hash, exposed name
//	preimage=<hex>                     optional: the preimage, when the
//	                                   client sends it in the macaroon
//	                                   (Aperture's gRPC form)
//
// Any other condition is refused (a caveat a client added must hold, and
// capvend cannot check one it does not know).
//
// A credit macaroon ("an L402 token for N sats") is the challenge of an
// L402 request of TopUpTool: it carries capvend_credit=<account> (the
// account the top-up credits) instead of capvend_call; a macaroon with
// both, or neither, is refused. Its identifier's payment hash names the
// top-up's invoice and its token id begins with the top-up call's id; it
// stays good for Credit.ExpiresAfter (L402CreditValidity if credit never
// expires) after its invoice's expiry. Presented with the preimage on a
// retry of the top-up it releases that top-up, once; presented with any
// priced call it pays the call from the account (the top-up is run
// first, through TopUp, if it was paid and not yet credited), as a
// credit token would, as many times as the balance covers.

// schemeL402: an L402 call macaroon with its invoice's preimage (HTTP
// Authorization: L402 or LSAT) releases the one call it was minted for,
// once. The preimage alone is no secret (every routing hop learns it),
// but the macaroon is: handed to the client in its 402 answer only.
var schemeL402 = Scheme{Name: SchemeL402, Credential: "an L402 call macaroon with its invoice's preimage", Bearer: true,
	Releases: ReleasesCall, Private: true, HandsBack: "the macaroon (the 402 answer)"}

// schemeL402Credit: an L402 credit macaroon ("an L402 token for N sats")
// with its top-up invoice's preimage pays any priced call from the
// account its top-up credited, as a credit token would.
var schemeL402Credit = Scheme{Name: SchemeL402Credit, Credential: "an L402 credit macaroon with its top-up invoice's preimage",
	Bearer: true, Releases: ReleasesAccount, Private: true, HandsBack: "the macaroon (the 402 answer)"}

// L402Service is the service name in the services caveat.
const L402Service = "capvend"

// L402Grace is how long after its invoice's expiry an L402 macaroon stays
// good: a client that paid at the last moment can still repeat its call.
const L402Grace = time.Hour

// L402CreditValidity is how long after its invoice's expiry a credit
// macaroon stays good when credit never expires (Credit.ExpiresAfter 0).
const L402CreditValidity = 365 * 24 * time.Hour

// Caveat conditions of capvend's macaroons (see above).
const (
	caveatServices   = "services"
	caveatValidUntil = L402Service + "_valid_until"
	caveatCall       = L402Service + "_call"
	caveatCredit     = L402Service + "_credit"
	caveatPreimage   = "preimage"
)

// l402Version is the identifier version minted (Aperture's latest).
const l402Version = 0

// l402IDLen is the length of an identifier: version, payment hash, token id.
const l402IDLen = 2 + 32 + 32

// ErrL402Invalid refuses an L402 credential that does not verify: it is
// not a macaroon, not capvend's (signature), malformed, expired, revoked,
// its preimage is not its invoice's, or its caveats do not hold for the
// request. Fronts answer HTTP 401. Nothing runs and nothing is charged.
var ErrL402Invalid = errors.New("invalid L402 credential")

// L402Keys is the ledger's role of the L402 schemes: the macaroon root
// key and the revocations of L402.
type L402Keys interface {
	// L402RootKey returns the root key macaroons are signed with: 32
	// random bytes generated and stored the first time it is asked for,
	// the same ever after (concurrent first calls get the one stored).
	L402RootKey(ctx context.Context) ([]byte, error)
	// RevokeL402 records tokenID (64 hex digits, L402TokenID) as
	// revoked, with why. Idempotent; atomic.
	RevokeL402(ctx context.Context, tokenID, reason string) error
	// L402Revoked reports whether tokenID was revoked. Read only.
	L402Revoked(ctx context.Context, tokenID string) (bool, error)
}

// l402Key caches the root key: it never changes once stored.
type l402Key struct {
	mu  sync.Mutex
	key []byte
}

// l402RootKey returns the root key (from the ledger the first time) and
// the ledger's L402Keys; ErrL402Invalid if the ledger keeps none.
func (v *Vendor) l402RootKey(ctx context.Context) ([]byte, L402Keys, error) {
	lk := v.cfg.Ledger
	v.l402.mu.Lock()
	defer v.l402.mu.Unlock()
	if v.l402.key == nil {
		key, err := lk.L402RootKey(ctx)
		if err != nil {
			return nil, nil, err
		}
		v.l402.key = key
	}
	return v.l402.key, lk, nil
}

// callCaveat is the value of the capvend_call caveat of a call of t with
// arguments hash argsHash.
func callCaveat(t *Item, argsHash string) string {
	return string(t.Kind.Or()) + " " + argsHash + " " + t.Name
}

// mintMacaroon returns the L402 macaroon (binary) of the explicit-gating
// call c, whose payment c.pay is a Lightning invoice: a call macaroon, or
// for a top-up a credit macaroon of the account it credits.
func (c *pending) mintMacaroon(ctx context.Context) ([]byte, error) {
	key, _, err := c.v.l402RootKey(ctx)
	if err != nil {
		return nil, err
	}
	hash, err := hex.DecodeString(c.pay.Ref)
	if err != nil || len(hash) != 32 {
		return nil, fmt.Errorf("payment of call %d has no Lightning payment hash", c.call.ID)
	}
	if !isTopUp(&c.t) {
		return mintL402(key, hash, c.call.ID, c.pay.ExpiresAt.Add(L402Grace), caveatCall+"="+callCaveat(&c.t, c.call.ArgsHash))
	}
	cl, ok := c.v.creditLedger()
	if !ok {
		return nil, ErrCreditOff
	}
	account, err := cl.TopUpAccount(ctx, c.call.ID)
	if err != nil {
		return nil, err
	}
	valid := c.v.cfg.Credit.ExpiresAfter
	if valid <= 0 {
		valid = L402CreditValidity
	}
	return mintL402(key, hash, c.call.ID, c.pay.ExpiresAt.Add(max(valid, L402Grace)), caveatCredit+"="+account)
}

// addMacaroon adds to e, the explicit-gating answer of c, the L402
// macaroon of its invoice when the request asked for L402 (r.L402), the
// ledger keeps L402 keys and the payment is an LND invoice (whose Ref is
// the payment hash the preimage proves); else it leaves e as it is.
func (c *pending) addMacaroon(ctx context.Context, e *PaymentRequiredError) error {
	if !c.r.L402 || !c.r.secretsAllowed() || c.pay.Kind != KindInvoice {
		return nil
	}
	mac, err := c.mintMacaroon(ctx)
	if err != nil {
		c.v.cfg.Log.Error("vend: minting an L402 macaroon failed", "tool", c.t.Name, "call", int64(c.call.ID), "err", err)
		return fmt.Errorf("L402 macaroon of call %d: %w", c.call.ID, err)
	}
	e.Macaroon = mac
	return nil
}

// addChallenges adds to e, the explicit-gating answer of c, the HTTP 402
// challenges of every scheme that has one (L402's macaroon, MPP's
// challenge, x402's requirements), each when its scheme allows.
func (c *pending) addChallenges(ctx context.Context, e *PaymentRequiredError) error {
	if err := c.addMacaroon(ctx, e); err != nil {
		return err
	}
	if err := c.addMPP(ctx, e); err != nil {
		return err
	}
	c.addX402(e)
	c.addPayPage(ctx, e)
	return nil
}

// mintL402 mints a macaroon for payment hash hash and call id, good until
// until, with what caveat: capvend_call (callCaveat) or capvend_credit.
func mintL402(key, hash []byte, id CallID, until time.Time, what string) ([]byte, error) {
	ident := make([]byte, 0, l402IDLen)
	ident = binary.BigEndian.AppendUint16(ident, l402Version)
	ident = append(ident, hash...)
	ident = binary.BigEndian.AppendUint64(ident, uint64(id))
	var nonce [24]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	ident = append(ident, nonce[:]...)
	m, err := macaroon.New(key, ident, L402Service, macaroon.V2)
	if err != nil {
		return nil, err
	}
	for _, cav := range []string{
		caveatServices + "=" + L402Service + ":0",
		caveatValidUntil + "=" + strconv.FormatInt(until.Unix(), 10),
		what,
	} {
		if err := m.AddFirstPartyCaveat([]byte(cav)); err != nil {
			return nil, err
		}
	}
	return m.MarshalBinary()
}

// l402Grant is what a verified macaroon names.
type l402Grant struct {
	hash    string // payment hash, hex
	tokenID string // hex
	call    CallID
	// credit is the account of a credit macaroon (capvend_credit), ""
	// for a call macaroon.
	credit   string
	preimage string // hex, verified
}

// L402TokenID returns the token id (hex) of the binary macaroon mac, the
// value RevokeL402 takes, without verifying anything.
func L402TokenID(mac []byte) (string, error) {
	var m macaroon.Macaroon
	if err := m.UnmarshalBinary(mac); err != nil {
		return "", fmt.Errorf("%w: not a macaroon", ErrL402Invalid)
	}
	g, err := parseL402ID(m.Id())
	if err != nil {
		return "", err
	}
	return g.tokenID, nil
}

func parseL402ID(id []byte) (l402Grant, error) {
	if len(id) != l402IDLen || binary.BigEndian.Uint16(id) != l402Version {
		return l402Grant{}, fmt.Errorf("%w: not a capvend L402 identifier", ErrL402Invalid)
	}
	return l402Grant{
		hash:    hex.EncodeToString(id[2:34]),
		tokenID: hex.EncodeToString(id[34:]),
		call:    CallID(binary.BigEndian.Uint64(id[34:42])),
	}, nil
}

// verifyMacaroon checks the L402 credential of r (r.Macaroon, and the
// preimage in r.PaymentProof or a preimage caveat) against key at now:
// the signature, every caveat, exactly one of capvend_call and
// capvend_credit, and that the preimage hashes to the identifier's
// payment hash. A call macaroon's capvend_call must be call (callCaveat
// of the request); a credit macaroon's account is the grant's credit. It
// needs no network and no ledger.
func verifyMacaroon(key []byte, r *CallRequest, call string, now time.Time) (l402Grant, error) {
	var m macaroon.Macaroon
	if err := m.UnmarshalBinary(r.Macaroon); err != nil {
		return l402Grant{}, fmt.Errorf("%w: not a macaroon", ErrL402Invalid)
	}
	g, err := parseL402ID(m.Id())
	if err != nil {
		return l402Grant{}, err
	}
	conds, err := m.VerifySignature(key, nil)
	if err != nil {
		return l402Grant{}, fmt.Errorf("%w: not signed by this server", ErrL402Invalid)
	}
	g.preimage = r.PaymentProof
	var service, until, called, mismatch bool
	for _, c := range conds {
		k, val, ok := strings.Cut(c, "=")
		if !ok {
			return l402Grant{}, fmt.Errorf("%w: malformed caveat", ErrL402Invalid)
		}
		switch strings.TrimSpace(k) {
		case caveatServices:
			if service, err = hasService(val); err != nil || !service {
				return l402Grant{}, fmt.Errorf("%w: not a token for service %s", ErrL402Invalid, L402Service)
			}
		case caveatValidUntil:
			sec, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil || !now.Before(time.Unix(sec, 0)) {
				return l402Grant{}, fmt.Errorf("%w: token expired", ErrL402Invalid)
			}
			until = true
		case caveatCall:
			called, mismatch = true, mismatch || val != call
		case caveatCredit:
			if !validAccount(val) || (g.credit != "" && g.credit != val) {
				return l402Grant{}, fmt.Errorf("%w: a credit caveat names no account, or two", ErrL402Invalid)
			}
			g.credit = val
		case caveatPreimage:
			if g.preimage != "" && !strings.EqualFold(g.preimage, val) {
				return l402Grant{}, fmt.Errorf("%w: two different preimages", ErrL402Invalid)
			}
			g.preimage = val
		default:
			return l402Grant{}, fmt.Errorf("%w: unknown caveat %q", ErrL402Invalid, k)
		}
	}
	if called && g.credit != "" {
		return l402Grant{}, fmt.Errorf("%w: both %s and %s: a token pays one call or credit, not both", ErrL402Invalid, caveatCall, caveatCredit)
	}
	if !service || !until || (!called && g.credit == "") {
		return l402Grant{}, fmt.Errorf("%w: a caveat capvend mints is missing", ErrL402Invalid)
	}
	if mismatch {
		return l402Grant{}, fmt.Errorf("%w: %w", ErrL402Invalid, ErrTokenMismatch)
	}
	pre, err := hex.DecodeString(g.preimage)
	if err != nil || len(pre) != 32 {
		return l402Grant{}, fmt.Errorf("%w: no preimage (32 bytes, hex)", ErrL402Invalid)
	}
	sum := sha256.Sum256(pre)
	if want, _ := hex.DecodeString(g.hash); !bytes.Equal(sum[:], want) {
		return l402Grant{}, fmt.Errorf("%w: the preimage is not the invoice's", ErrL402Invalid)
	}
	g.preimage = strings.ToLower(g.preimage)
	return g, nil
}

// hasService reports whether a services caveat value
// ("name:tier,name:tier") names L402Service.
func hasService(val string) (bool, error) {
	for _, s := range strings.Split(val, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(s), ":")
		if name == L402Service {
			return true, nil
		}
	}
	return false, nil
}

// grantByMacaroon verifies r's L402 credential for a call of t selling
// bind and returns the call it releases: paid, or awaiting a payment the
// preimage proves (the backend reports it soon). A call macaroon's call
// must be the identifier's, paid by the identifier's invoice, and sell
// exactly bind; so must a credit macaroon's top-up when t is TopUpTool.
// A credit macaroon presented with any other priced call releases no
// call: ok is false and r is to be paid from its account (creditByMacaroon).
func (v *Vendor) grantByMacaroon(ctx context.Context, r *CallRequest, t *Item, bind Binding) (c Call, ok bool, err error) {
	g, c, err := v.macaroonCall(ctx, r, callCaveat(t, bind.ArgsHash))
	if err != nil {
		return Call{}, false, err
	}
	if g.credit != "" && !isTopUp(t) {
		return Call{}, false, v.creditByMacaroon(ctx, r, g, c)
	}
	if c.Binding() != bind {
		return Call{}, false, fmt.Errorf("%w: %w", ErrL402Invalid, ErrTokenMismatch)
	}
	switch c.State {
	case CallPaid, CallAwaitingPayment:
		return c, true, nil
	case CallExpired, CallCanceled:
		return Call{}, false, endedGrant(c)
	case CallQuoted:
		return Call{}, false, fmt.Errorf("%w: no such payment", ErrL402Invalid)
	}
	return Call{}, false, ErrTokenUsed
}

// macaroonCall verifies r's L402 credential (call: the request's
// callCaveat), that it is not revoked, and that its identifier's invoice
// is the payment of its call (for a credit macaroon, a top-up of its
// account), and returns what it names and that call.
func (v *Vendor) macaroonCall(ctx context.Context, r *CallRequest, call string) (l402Grant, Call, error) {
	key, lk, err := v.l402RootKey(ctx)
	if err != nil {
		return l402Grant{}, Call{}, err
	}
	g, err := verifyMacaroon(key, r, call, time.Now())
	if err != nil {
		return l402Grant{}, Call{}, err
	}
	if revoked, err := lk.L402Revoked(ctx, g.tokenID); err != nil {
		return l402Grant{}, Call{}, err
	} else if revoked {
		return l402Grant{}, Call{}, fmt.Errorf("%w: token revoked", ErrL402Invalid)
	}
	p, err := v.cfg.Ledger.Payment(ctx, g.hash)
	if errors.Is(err, ErrNotFound) || (err == nil && p.CallID != g.call) {
		return l402Grant{}, Call{}, fmt.Errorf("%w: no such payment", ErrL402Invalid)
	}
	if err != nil {
		return l402Grant{}, Call{}, err
	}
	c, err := v.cfg.Ledger.Call(ctx, g.call)
	if err != nil {
		return l402Grant{}, Call{}, err
	}
	if g.credit == "" {
		return g, c, nil
	}
	cl, ok := v.creditLedger()
	if !ok {
		return l402Grant{}, Call{}, ErrCreditOff
	}
	if c.Server != CreditServer || c.Name != topUpUpstream {
		return l402Grant{}, Call{}, fmt.Errorf("%w: a credit token of no top-up", ErrL402Invalid)
	}
	if acct, err := cl.TopUpAccount(ctx, c.ID); err != nil || acct != g.credit {
		return l402Grant{}, Call{}, fmt.Errorf("%w: the top-up credits another account", ErrL402Invalid)
	}
	return g, c, nil
}

// creditByMacaroon makes r, presenting the verified credit macaroon g of
// the top-up call c, a call paid from g's account (r's account): the
// top-up must be credited, or paid and then credited here through TopUp
// with the macaroon and its preimage (the client paid the invoice and
// went on to a call without repeating the top-up). A top-up that never
// paid, or was refunded, credits nothing: the token is refused. A credit
// token of another account in the same request is refused too.
func (v *Vendor) creditByMacaroon(ctx context.Context, r *CallRequest, g l402Grant, c Call) error {
	if r.account != "" && r.account != g.credit {
		return fmt.Errorf("%w: the L402 token and the credit token name different accounts", ErrL402Invalid)
	}
	switch c.State {
	case CallDelivered:
	case CallPaid, CallAwaitingPayment, CallExecuting:
		_, err := v.TopUp(ctx, TopUpRequest{Transport: r.Transport, Client: r.Client, RequestID: r.RequestID + "#topup",
			Sats: c.Price.SatsCeil(), Macaroon: r.Macaroon, PaymentProof: g.preimage})
		if err != nil && !errors.Is(err, ErrTokenUsed) { // used: credited by another request meanwhile
			return err
		}
		if cur, err := v.cfg.Ledger.Call(ctx, c.ID); err != nil || cur.State != CallDelivered {
			return fmt.Errorf("%w: the top-up is not credited yet", ErrPaymentFailed)
		}
	case CallExpired, CallCanceled:
		return endedGrant(c)
	case CallQuoted:
		return fmt.Errorf("%w: no such payment", ErrL402Invalid)
	default: // failed or refunded: nothing was credited
		return fmt.Errorf("%w: the top-up was refunded", ErrL402Invalid)
	}
	r.account = g.credit
	return nil
}

// awaitProven waits for the backend to report the payment the request's
// preimage proved (or, c.claimed, its x402 payload claimed: for at most
// X402Wait) (the payer learns the preimage when the invoice
// settles; the report may lag), then runs the call. It sends no
// notification: an L402 answer is one HTTP response. Bounded by ctx and
// by the invoice's expiry plus L402Grace.
func (c *pending) awaitProven(ctx context.Context) (CallResult, error) {
	v, p := c.v, c.pay
	events := v.waiters.add(p.Ref)
	defer v.waiters.remove(p.Ref, events)
	if cur := v.currentPayment(ctx, p.Ref); cur != nil && cur.State != PaymentOpen {
		c.pay = cur
		return c.afterPayment(ctx)
	}
	wait := time.Until(p.ExpiresAt.Add(L402Grace))
	if c.claimed {
		wait = min(wait, X402Wait)
	}
	bound := time.NewTimer(wait)
	defer bound.Stop()
	select {
	case paid := <-events:
		c.pay = paid
		return c.afterPayment(ctx)
	case <-bound.C:
		if c.claimed && time.Now().Before(p.ExpiresAt) {
			// Only claimed, and not reported: the invoice is still
			// payable, and the payload good once it is paid.
			return CallResult{}, &PaymentPendingError{RetryAfter: 2, ExpiresAt: p.ExpiresAt}
		}
		return CallResult{}, ErrPaymentExpired
	case <-ctx.Done():
		// As in waitPaid: a report already handed to this waiter is
		// taken on (nobody else would run the call for it).
		v.waiters.remove(p.Ref, events)
		select {
		case paid := <-events:
			c.pay = paid
			return c.afterPayment(context.WithoutCancel(ctx))
		default:
			return CallResult{}, ctx.Err()
		}
	}
}
