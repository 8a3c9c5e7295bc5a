package vend

import (
	"context"
	"fmt"
)

// schemeCashu: a Cashu token in the request (_meta[MetaCashuToken], the
// X-Cashu header) pays the new call at once; what it brought beyond the
// price comes back as change, and a failed call's refund as a token:
// bearer ecash both ways, so never on a public channel.
var schemeCashu = Scheme{Name: SchemeCashu, Credential: "a Cashu token (cashuA/cashuB) in the request (its _meta, or a CEP-8 direct_payment tag)", Bearer: true,
	Releases: ReleasesPaid, Private: true, HandsBack: "change and refund tokens"}

// payWithToken takes a Cashu token for the call, then runs it.
func (c *pending) payWithToken(ctx context.Context) (CallResult, error) {
	v, call, r := c.v, &c.call, c.r
	ctx = Urgent(ctx) // the money is in the request
	for _, b := range v.cfg.Backends {
		ta, ok := b.(TokenAcceptor)
		if !ok {
			continue
		}
		receipt, err := ta.AcceptToken(ctx, call.ID, call.Price, r.CashuToken)
		if err != nil {
			c.endUnpaid(ctx, "token refused")
			// Both wrapped: fronts tell the client why (ErrProofSpent,
			// ErrUnderpaid, ErrForeignMint, ErrBadToken), never more.
			return CallResult{}, fmt.Errorf("%w: %w", ErrPaymentFailed, err)
		}
		v.paid(r)
		r.Notify(NotifyPaymentAccepted, map[string]any{"amount": receipt.Payment.Amount.SatsCeil(), "pmi": PMICashu,
			"_meta": map[string]any{"change": receipt.Change}})
		c.pay = &receipt.Payment
		return c.run(ctx)
	}
	c.endUnpaid(ctx, "no Cashu backend")
	return CallResult{}, fmt.Errorf("%w: this server takes no Cashu tokens", ErrNoPaymentMethod)
}
