package ctxvm

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/vend"
)

// Direct payments (CEP-8): a request may carry its payment in a tag,
// ["direct_payment", <pmi>, <payload>]. capvend takes one kind: a Cashu
// token (PMICashuDirect, or capvend's own vend.PMICashu), which is vend's
// cashu way to pay arriving by another carrier than
// _meta["capvend/cashu"]: the tag's token becomes CallRequest.CashuToken,
// so vend's rules apply unchanged (refused in a plaintext event, change
// and refunds only in encrypted answers). See docs/CONTEXTVM.md, Direct
// payments.

// Tags of CEP-8 direct payments.
const (
	tagDirectPayment = "direct_payment"
	tagChange        = "change"
)

// PMICashuDirect is the payment method identifier of a Cashu token sent
// in a direct_payment tag: the name CEP-8 and CEP-21 use (no Cashu PMI
// is standardised yet). The payload is a serialized Cashu token
// (cashuB..., NUT-00 V4; cashuA V3 is taken too), and so is the change.
const PMICashuDirect = "bitcoin-cashu-v4-direct"

// directPMIs are the PMIs of direct_payment tags whose payload is taken
// as a Cashu token.
var directPMIs = []string{PMICashuDirect, vend.PMICashu}

// directPayment returns the PMI and payload of the first direct_payment
// tag of tags whose PMI the server takes (CEP-8: a client should send
// one; of several, the first supported one counts), or "" "".
func directPayment(tags nostr.Tags) (pmi, payload string) {
	for _, t := range tags {
		if len(t) >= 3 && t[0] == tagDirectPayment && t[2] != "" && (t[1] == directPMIs[0] || t[1] == directPMIs[1]) {
			return t[1], t[2]
		}
	}
	return "", ""
}

// directAccepted rewrites the payment_accepted of a call paid by a
// direct payment (pmi its PMI): the notification names the client's PMI,
// and the change the Vendor made (its _meta.change) also goes in the
// event's ["change", pmi, token] tag, as CEP-8 says; _meta.change stays,
// for clients that see only the JSON-RPC message (the stock SDK shows
// its applications no tags). The change tag goes only into an encrypted
// answer (vend makes none for a plaintext request; this holds anyway).
// Other notifications, and one about another payment (an invoice), are
// returned unchanged.
func (o *outbox) directAccepted(params any) (any, nostr.Tags) {
	b, err := json.Marshal(params)
	if err != nil {
		return params, nil
	}
	var p map[string]any
	if json.Unmarshal(b, &p) != nil || p["pmi"] != vend.PMICashu {
		return params, nil
	}
	p["pmi"] = o.direct
	var tags nostr.Tags
	if meta, ok := p["_meta"].(map[string]any); ok {
		if change, ok := meta["change"].(string); ok && change != "" {
			if !o.r.encrypted {
				delete(meta, "change")
			} else {
				tags = nostr.Tags{{tagChange, o.direct, change}}
			}
		}
	}
	return p, tags
}

// unredeemed says whether err refused a Cashu token without redeeming
// it: a payment failure for a reason found before any swap (too small,
// a foreign mint, malformed or not in sats, already spent). A failure
// whose swap's outcome is unknown (the mint stopped answering) or a
// refund is not one: CEP-8's payment_rejected promises the client its
// token was not taken.
func unredeemed(err error) bool {
	var re *vend.RefundError
	if errors.As(err, &re) || !errors.Is(err, vend.ErrPaymentFailed) || errors.Is(err, vend.ErrMintUnavailable) {
		return false
	}
	return errors.Is(err, vend.ErrUnderpaid) || errors.Is(err, vend.ErrForeignMint) || errors.Is(err, vend.ErrBadToken) ||
		errors.Is(err, vend.ErrProofSpent)
}

// directRejected is the payment_rejected params of a direct payment
// (pmi) the Vendor refused with the client error w.
func directRejected(pmi string, w *rpcError) map[string]any {
	msg := strings.TrimPrefix(w.Message, "Payment failed: ")
	return map[string]any{"pmi": pmi, "message": msg}
}
