package vend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// schemeGrant: explicit gating's repeat. The quoted client pays the
// invoice of its payment-required answer and repeats the same call; the
// repeat finds the paid call (a grant, single-use) by the client's
// identity and the call's Binding. Bound: it releases nothing to another
// client, and nothing to a client without an identity (an anonymous MCP
// HTTP client: its payment token releases its call).
var schemeGrant = Scheme{Name: SchemeGrant, Credential: "none: the quoted client (session, Nostr key, stdio) repeats the call",
	Releases: ReleasesCall}

// schemePreimage: explicit gating's repeat with the preimage of the plain
// invoice paid (_meta[MetaPaymentProof]), which picks the grant. Every
// routing hop and the payer's wallet learn a plain invoice's preimage at
// settlement: it is no secret of the client's, so it is bound like
// schemeGrant (a preimage of another client's call releases nothing: the
// request is quoted anew). Kept off public channels all the same: it is
// the L402 credential's other half.
var schemePreimage = Scheme{Name: SchemePreimage, Credential: "the paid invoice's preimage, from the quoted client",
	Releases: ReleasesCall, Private: true}

// GrantBook finds the explicit-gating grant a repeated call may use
// (schemeGrant). *ledger.Ledger implements it.
type GrantBook interface {
	// FindGrant returns the newest call of client selling exactly b
	// (kind, server, tool and args hash) that is awaiting payment or paid
	// and not yet executed (an explicit-gating grant), or ErrNotFound.
	FindGrant(ctx context.Context, client string, b Binding) (Call, error)
}

// releaseGrant finds the recorded call r's credential names, in the order
// of Schemes: an L402 macaroon's, an MPP credential's, an x402 payload's,
// a payment token's, or explicit gating's
// grant (by the preimage r presents, else the client's own newest). A nil
// *admitted and nil error: r names none (or an L402 credit macaroon,
// which made r.account the account that pays), it is a new call.
func (v *Vendor) releaseGrant(ctx context.Context, r *CallRequest, t *Item, args json.RawMessage, bind Binding) (*admitted, error) {
	p := pending{v: v, t: *t, args: args, r: r}
	if r.Macaroon != nil {
		// An L402 macaroon names its grant, and its preimage proves
		// the payment: that call or nothing; a credit macaroon names
		// the account that pays (r.account).
		grant, ok, err := v.grantByMacaroon(ctx, r, t, bind)
		if err != nil {
			return nil, err
		}
		r.Explicit = true
		if ok {
			p.call, p.scheme, p.byToken, p.proven = grant, SchemeL402, true, true
			return v.released(&p)
		}
	}
	if r.MPP != "" {
		// An MPP credential names its invoice, whose preimage it
		// carries: that call or nothing.
		grant, err := v.grantByMPP(ctx, r, bind)
		if err != nil {
			return nil, err
		}
		r.Explicit = true
		p.call, p.scheme, p.byToken, p.proven = grant, SchemeMPP, true, true
		return v.released(&p)
	}
	if len(r.X402) > 0 {
		// An x402 payload names its invoice, which the client says it
		// paid: that call, to its own client, or nothing.
		grant, err := v.grantByX402(ctx, r, bind)
		if err != nil {
			return nil, err
		}
		r.Explicit = true
		p.call, p.scheme, p.byToken, p.proven, p.claimed = grant, SchemeX402, true, true, true
		return v.released(&p)
	}
	if r.PaymentToken != "" {
		// A payment token names its grant: that call or nothing.
		grant, err := v.grantByToken(ctx, r, bind)
		if err != nil {
			return nil, err
		}
		r.Explicit = true
		p.call, p.scheme, p.byToken = grant, SchemePaymentToken, true
		return v.released(&p)
	}
	if r.Explicit {
		if grant, scheme, ok := v.findGrant(ctx, r, bind); ok {
			p.call, p.scheme = grant, scheme
			return v.released(&p)
		}
	}
	return nil, nil
}

// released admits p, a recorded call its request's credential (p.scheme)
// names, if the scheme may release it to that request: a bound scheme
// only to the call's own client (Release.Check). A bound credential of
// another client's call releases nothing (nil: the request is a new call
// of its own), and says so in the log: it was learned, not held.
func (v *Vendor) released(p *pending) (*admitted, error) {
	if err := p.release().Check(p.call.NewCall); err != nil {
		v.cfg.Log.Warn("vend: a credential of another client's call released nothing", "call", int64(p.call.ID),
			"scheme", string(p.scheme), "transport", p.r.Transport, "err", err)
		return nil, nil
	}
	return &admitted{pending: *p, known: true}, nil
}

// findGrant finds the paid (or still awaited) explicit-gating call of r's
// client that a repeat of the same call may use: the one whose invoice's
// preimage r presents (SchemePreimage), else, for an identified client,
// its own newest one for the same call (SchemeGrant). Either must sell
// exactly bind; whose call it is, released checks.
func (v *Vendor) findGrant(ctx context.Context, r *CallRequest, bind Binding) (Call, SchemeName, bool) {
	if r.PaymentProof != "" {
		pre, err := hex.DecodeString(r.PaymentProof)
		if err != nil || len(pre) != 32 {
			return Call{}, "", false
		}
		sum := sha256.Sum256(pre)
		p, err := v.cfg.Ledger.Payment(ctx, hex.EncodeToString(sum[:]))
		if err != nil {
			return Call{}, "", false
		}
		c, err := v.cfg.Ledger.Call(ctx, p.CallID)
		if err != nil || c.Binding() != bind || (c.State != CallAwaitingPayment && c.State != CallPaid) {
			return Call{}, "", false
		}
		return c, SchemePreimage, true
	}
	if r.Anonymous {
		return Call{}, "", false
	}
	c, err := v.cfg.Ledger.FindGrant(ctx, r.Client, bind)
	return c, SchemeGrant, err == nil
}
