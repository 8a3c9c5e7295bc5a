package vend

import "encoding/json"

// pending is one priced call on its way through the flow: the call as the
// ledger has it, its payment once one is asked for, and the request it
// answers. Its methods are the steps of the flow (pay.go, run.go); one
// pending is used by one goroutine at a time.
type pending struct {
	v    *Vendor
	call Call
	// pay is the call's payment, nil until one is requested or found.
	pay *Payment
	// t and args are the request's own item and arguments (or, for a call
	// run from the ledger, the recorded ones): they describe the call and
	// answer a request that finds it run already, but are never executed:
	// a paid call runs what the ledger recorded (claimAndFinish).
	t    Item
	args json.RawMessage
	r    *CallRequest
	// byToken: the request presented the payment token of this call
	// (CallRequest.PaymentToken), good for one execution: if the call
	// ran, runs or ended elsewhere, the request is refused
	// (ErrTokenUsed), never answered with that call's result.
	byToken bool
	// proven: the request proved the call's Lightning payment (an L402
	// preimage): a payment the backend has not reported yet is waited
	// for (awaitProven), not answered as pending.
	proven bool
	// claimed: the payment is only claimed (an x402 payload names the
	// invoice, no preimage proves it): the wait is bounded by X402Wait,
	// then the request is answered pending.
	claimed bool
	// scheme is the way to pay that admitted the request (choose), and
	// released the call to it: what its executions record (Release).
	scheme SchemeName
}

// release is who released c's call for an execution: its scheme and
// request (see Release). An anonymous request has no identity: unless it
// is the request that recorded the call (its request key, made unique,
// is the call's own), its Client is "", which a bound scheme never
// releases to.
func (c *pending) release() Release {
	client := c.r.Client
	if c.r.Anonymous && c.r.RequestID != c.call.RequestID {
		client = ""
	}
	return Release{Scheme: c.scheme, Transport: c.r.Transport, Client: client}
}
