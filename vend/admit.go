package vend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// CallTool serves one tools/call: see docs/ARCHITECTURE.md, The flow of
// a priced call. It returns the tool's result (possibly with isError when the tool
// ran and failed: a paid call is then refunded), or an error a front maps
// to a JSON-RPC error: ErrUnknownTool, *InvalidParamsError, ErrRequestReused,
// *PaymentRequiredError, *PaymentPendingError, ErrPaymentExpired,
// ErrPaymentFailed, ErrNoPaymentMethod, ErrLimit, ErrUpstream; a paid call
// that failed and was refunded answers with *RefundError (wrapping
// ErrUpstream) or, when the tool answered isError, that result with the
// refund in _meta[MetaRefund].
func (v *Vendor) CallItem(ctx context.Context, req CallRequest) (CallResult, error) {
	// A call waiting for payment keeps the frames of CallTool, quote,
	// awaitPayment and waitPaid on its goroutine's stack: they are kept
	// small (the work is in functions that have returned by then), so
	// 10,000 waiting calls fit in little memory.
	v.flight.n.Add(1)
	defer v.flight.n.Add(-1)
	r := &req
	ctx, err := v.enter(ctx, r)
	if err != nil {
		return CallResult{}, err
	}
	if r.RefundInvoice, err = checkRefundInvoice(r.RefundInvoice); err != nil {
		return CallResult{}, &InvalidParamsError{Tool: r.Name, Reason: err.Error()}
	}
	a, res, err := v.admit(ctx, r)
	if a == nil {
		return res, err
	}
	defer v.unpaid.unhold(a.slot) // a slot no payment request took
	account, topUp := r.account, isTopUp(&a.t)
	if topUp {
		if account, err = a.bindTopUp(ctx, account); err != nil {
			a.endUnpaid(ctx, "top-up account refused")
			return CallResult{}, err
		}
	}
	switch {
	case a.known:
		res, err = a.resume(ctx)
	case a.drawn:
		res, err = a.runDrawn(ctx, account)
		return v.withBalance(ctx, account, a.balance, res, err)
	case a.scheme == SchemeCashu:
		res, err = a.payWithToken(ctx)
	default:
		turn := a.turn
		a.turn = nil // given up once the request is issued: not kept while the call waits
		res, err = a.quote(ctx, a.slot, turn)
	}
	return v.withCredit(ctx, account, topUp && r.secretsAllowed(), res, err)
}

// enter starts serving r, whatever path serves it (CallTool, CallFree):
// a no-op Notify if it has none, urgency for a known payer's request, and
// the rate limit counted once. ctx is then the request's.
func (v *Vendor) enter(ctx context.Context, r *CallRequest) (context.Context, error) {
	if r.Notify == nil {
		r.Notify = func(string, any) {}
	}
	if v.payers.has(limitKey(r)) {
		ctx = Urgent(ctx)
	}
	if !v.allow(ctx, r) {
		return ctx, fmt.Errorf("%w: more than %d calls a minute", ErrLimit, v.cfg.RequestsPerMinute)
	}
	return ctx, nil
}

// admitted is a priced call recorded in the ledger.
type admitted struct {
	pending
	known bool // a replay, or an explicit-gating grant: not a new call
	// drawn: a new call paid from credit, drawn and claimed for its
	// execution (admitCredit), balance left in its account.
	drawn   bool
	balance Msat
	// slot is the unpaid slot held for a new call's payment request (see
	// unpaidBook.hold), nil if none; turn its place in the line to issue
	// it (see issueQueue), nil if none.
	slot *unpaidQuote
	turn *ticket
}

// admit checks a call, runs it at once if it is free, and otherwise records
// it (or finds the call it repeats). A nil *admitted means the call is
// answered by res and err.
func (v *Vendor) admit(ctx context.Context, r *CallRequest) (*admitted, CallResult, error) {
	if r.L402 {
		r.Explicit = true // the challenge is the answer
	}
	if err := checkTravel(r); err != nil { // _meta's secrets
		return nil, CallResult{}, err
	}
	t, err := v.lookup(r.Kind, r.Name)
	if err != nil {
		return nil, CallResult{}, err
	}
	// Parsed once: this one encoding is validated, priced, hashed,
	// recorded and sent upstream; the live request carries it from here.
	args, q, err := v.check(&t, r)
	if err != nil {
		return nil, CallResult{}, err
	}
	r.Arguments = args
	if err := checkTravel(r); err != nil { // the arguments' secrets
		return nil, CallResult{}, err
	}
	// The credit token (perhaps an argument check took out) is checked
	// before anything is recorded.
	if r.account, err = v.creditAccount(ctx, r); err != nil {
		return nil, CallResult{}, &InvalidParamsError{Tool: r.Name, Reason: err.Error()}
	}
	if q.Price <= 0 {
		if err := checkWork(r); err != nil {
			return nil, CallResult{}, err
		}
		res, err := v.runFree(ctx, &t, args, r)
		return nil, res, err
	}
	hash, err := CanonicalHash(method(&t, args))
	if err != nil {
		return nil, CallResult{}, &InvalidParamsError{Tool: r.Name, Reason: err.Error()}
	}
	bind := Binding{Kind: t.Kind.Or(), Server: t.Server, Name: t.UpstreamName, ArgsHash: hash}
	// The ways to pay, in the order of Schemes: a credential that names a
	// call already recorded (an L402 macaroon, a payment token, an
	// explicit-gating repeat) releases it; else the request is a new call
	// paid by a Cashu token, from credit, or by an invoice.
	// What the answer would hand back is checked first: a paid top-up
	// grant released to a plaintext repeat would answer with its token.
	if err := checkOutbound(&t, r); err != nil {
		return nil, CallResult{}, err
	}
	if r.CashuToken == "" {
		if a, err := v.releaseGrant(ctx, r, &t, args, bind); a != nil || err != nil {
			return a, CallResult{}, err
		}
	}
	return v.admitNew(ctx, r, &t, args, q, hash, bind)
}

// admitNew records r, a new call of t (or finds the call its request key
// recorded before: a replay), to be paid by a Cashu token, from credit or
// by an invoice; or runs it free under its daily quota.
func (v *Vendor) admitNew(ctx context.Context, r *CallRequest, t *Item, args json.RawMessage, q Quote, hash string, bind Binding) (*admitted, CallResult, error) {
	if r.Anonymous {
		// Anonymous request ids collide between clients: never treat
		// one as a replay of another client's call.
		r.RequestID += "#" + randomHex(8)
	}
	if q.FreePerDay > 0 && checkWork(r) == nil { // too little work: priced
		free, err := v.cfg.Ledger.ClaimFreeUse(ctx, FreeUse{Transport: r.Transport, Client: quotaKey(r),
			RequestID: r.RequestID, Server: t.Server, Tool: priceKey(t), ArgsHash: hash, PerDay: q.FreePerDay, PerDayTotal: q.FreePerDayTotal})
		if err != nil {
			return nil, CallResult{}, err
		}
		if free {
			v.cfg.Log.Info("vend: free call (daily quota)", "tool", t.Name, "price_msat", int64(q.Price))
			res, err := v.runFree(ctx, t, args, r)
			return nil, res, err
		}
	}
	scheme := choosePayment(t, r)
	paysNow := scheme != SchemeInvoice // no unpaid quote
	if err := checkWork(r); err != nil && !paysNow {
		return nil, CallResult{}, err // it would get an unpaid quote
	}
	var slot *unpaidQuote
	var turn *ticket
	var err error
	if !paysNow {
		// A new quote takes a slot of its client's unpaid limit, and a
		// place in the line to issue its payment request, before anything
		// is written: a client at its limit, or a request finding the
		// line full, is refused for free (a flood costs no ledger write),
		// unless this is a replay of a call it holds already.
		if slot, err = v.holdUnpaid(ctx, r); err == nil {
			turn, err = v.joinIssuing(r)
		}
		if err != nil {
			v.unpaid.release(slot)
			slot = nil
			if _, ferr := v.cfg.Ledger.CallByRequest(ctx, r.Transport, r.Client, r.RequestID); ferr != nil {
				return nil, CallResult{}, err
			}
		}
	}
	nc := NewCall{
		Transport: r.Transport, Client: r.Client, RequestID: r.RequestID, Server: t.Server, Kind: t.Kind.Or(), Name: t.UpstreamName,
		ArgsHash: hash, Price: q.Price, Idempotent: q.Idempotent, ExposedName: t.Name, Arguments: args, Explicit: r.Explicit,
		RefundInvoice: r.RefundInvoice, Run: v.runID, LimitKey: v.sharedLimitKey(r),
	}
	p := pending{v: v, t: *t, args: args, r: r, scheme: scheme}
	if isCredit(scheme) {
		return v.admitCredit(ctx, nc, bind, p)
	}
	call, created, err := v.cfg.Ledger.RecordCall(ctx, nc)
	if err != nil || !created {
		v.unpaid.release(slot)
		v.leaveIssuing(turn)
		slot, turn = nil, nil
	}
	if err != nil {
		return nil, CallResult{}, err
	}
	p.call = call
	if !created {
		p.scheme = SchemeReplay
	}
	return &admitted{pending: p, known: !created, slot: slot, turn: turn}, CallResult{}, nil
}

// check runs the checks of a call of t before anything is done for it:
// its arguments parsed once (callArgs, which takes a payment argument out
// into r.PaymentToken), validated against t's schema, and priced. A
// failure is an *InvalidParamsError.
func (v *Vendor) check(t *Item, r *CallRequest) (json.RawMessage, Quote, error) {
	args, inst, err := v.callArgs(t, r)
	if err == nil {
		err = v.schemas.validate(t, args, inst)
	}
	var q Quote
	switch {
	case err != nil:
	case isTopUp(t):
		q, err = v.topUpQuote(args)
	default:
		q, err = v.book().Quote(t.Server, priceKey(t), args)
	}
	if err != nil {
		return nil, Quote{}, &InvalidParamsError{Tool: r.Name, Reason: err.Error()}
	}
	return args, q, nil
}

// callArgs parses r's arguments once, strictly (parseArgs), for t: a
// prompt's must be strings, a read has none, and a tool call's PaymentArg
// is taken out into r.PaymentToken. A tool call's arguments come with
// their parsed value too (inst, for the schema: encodeArgs wrote it as
// args, and jsonschema.UnmarshalJSON reads args back as it).
func (v *Vendor) callArgs(t *Item, r *CallRequest) (args json.RawMessage, inst any, err error) {
	m, err := parseArgsObject(r.Arguments)
	if err != nil {
		return nil, nil, err
	}
	switch t.Kind {
	case ItemPrompt:
		args, err := encodeArgs(m)
		if err == nil {
			_, err = promptArgs(args)
		}
		return args, nil, err
	case ItemResource:
		return json.RawMessage("{}"), nil, nil // a read has no arguments
	}
	tok, err := takePaymentArg(m)
	if err != nil {
		return nil, nil, err
	}
	credit, err := takeStringArg(m, CreditArg, "a credit token")
	if err != nil {
		return nil, nil, err
	}
	if credit != "" {
		if r.Credit != "" && r.Credit != credit {
			return nil, nil, fmt.Errorf("%s and _meta[%q] name different credit tokens", CreditArg, MetaCredit)
		}
		r.Credit = credit
	}
	if tok != "" {
		if r.PaymentToken != "" && r.PaymentToken != tok {
			return nil, nil, fmt.Errorf("%s and _meta[%q] name different payment tokens", PaymentArg, MetaPaymentToken)
		}
		r.PaymentToken = tok
	}
	args, err = encodeArgs(m)
	if err != nil {
		return nil, nil, err
	}
	return args, m, nil
}

// runFree runs a call nobody pays for: a free tool, or one within its
// daily free quota. Nothing is recorded. A tool call goes through the
// RawToolSource when its upstream can take it (the same answer, cheaper:
// see CallFree).
func (v *Vendor) runFree(ctx context.Context, t *Item, args json.RawMessage, r *CallRequest) (CallResult, error) {
	raw, _ := v.cfg.Tools.(RawToolSource)
	if raw != nil && (t.Kind.Or() != ItemTool || !raw.CanCallRaw(*t)) {
		raw = nil
	}
	body, err := v.executeVia(ctx, 0, raw, t, args, r)
	v.obs.FreeCall(*t, err)
	if err != nil {
		return CallResult{}, err
	}
	return CallResult{Body: body, IsError: isErrorResult(body)}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
