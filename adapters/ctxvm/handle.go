package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// Tag and _meta names read on requests.
const (
	tagPMI                 = "pmi"
	tagPaymentInteraction  = "payment_interaction"
	explicitGating         = "explicit_gating"
	metaPMI                = "capvend/pmi"
	metaPaymentInteraction = "capvend/payment_interaction"
)

// Reasons an inbound event is dropped.
var (
	ErrBadEvent    = errors.New("bad id or signature")
	ErrStale       = errors.New("created_at outside the window")
	ErrTooLarge    = errors.New("content too large")
	ErrNotJSONRPC  = errors.New("content is not a JSON-RPC 2.0 message")
	ErrNotForUs    = errors.New("not addressed to this server")
	ErrWrongKind   = errors.New("unexpected kind")
	ErrUndecryptab = errors.New("gift wrap not decryptable")
	ErrBeforeStart = errors.New("stored event made before the server started")
	ErrTagMismatch = errors.New("method tag differs from the content's method")
	ErrNotJob      = errors.New("job request without a c tag")
	ErrForgedRumor = errors.New("rumor not by the seal's signer")
)

// rpcError is a JSON-RPC error object.
type rpcError = rpcerr.Error

// message is an inbound JSON-RPC message.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
	// A response's (to our elicitation/create): ContextVM only.
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

// request is an inbound event that passed every check.
type request struct {
	ev        *nostr.Event // the request event: signed (inside the wrap, if any), or a NIP-59 rumor
	encrypted bool
	msg       message // as JSON-RPC, whatever the dialect
	dialect   dialect
	command   string   // NIP-90's c tag
	wrap      wrapping // how it came, how answers go
}

// parse checks an event from a relay and returns the request it carries,
// or why it is dropped. It never panics on any input.
func (s *Server) parse(ev *nostr.Event) (*request, error) {
	if ev == nil {
		return nil, ErrBadEvent
	}
	if len(ev.Content) > s.cfg.MaxContentBytes {
		return nil, ErrTooLarge
	}
	if err := s.verify(ev); err != nil {
		return nil, err
	}
	var w wrapping
	switch ev.Kind {
	case KindMessage, KindJobRequest:
		if ev.Kind == KindJobRequest && ev.CreatedAt < s.started {
			return nil, ErrBeforeStart // stored: see Run
		}
	case KindGiftWrap, KindEphemeralGiftWrap:
		if s.cfg.Encryption == EncryptionDisabled {
			return nil, ErrWrongKind
		}
		if ev.Kind == KindGiftWrap && ev.CreatedAt < s.started {
			return nil, ErrBeforeStart
		}
		inner, iw, err := s.unwrap(ev)
		if err != nil {
			return nil, err
		}
		ev, w = inner, iw
	default:
		return nil, ErrWrongKind
	}
	return s.parseRequest(ev, w)
}

// parseRequest checks a request event (plaintext, or out of its wrap,
// its id and signature checked) and reads its dialect and message.
func (s *Server) parseRequest(ev *nostr.Event, w wrapping) (*request, error) {
	if ev.Kind != KindMessage && ev.Kind != KindJobRequest {
		return nil, ErrWrongKind
	}
	if ev.Tags.FindWithValue("p", s.pk) == nil {
		return nil, ErrNotForUs
	}
	now := s.cfg.Now()
	if d := ev.CreatedAt.Time().Sub(now); d > s.cfg.Window || d < -s.cfg.Window {
		return nil, ErrStale
	}
	r := &request{ev: ev, encrypted: w.kind != 0, wrap: w}
	var err error
	if ev.Kind == KindJobRequest {
		r.dialect = dialectNIP90
		r.msg, r.command, err = parseJob(ev)
	} else {
		r.dialect, r.msg, err = parseMessage(ev)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// validID says whether a JSON-RPC id is a string or a number (or null).
func validID(id json.RawMessage) bool {
	var v any
	if err := json.Unmarshal(id, &v); err != nil {
		return false
	}
	switch v.(type) {
	case string, float64, nil:
		return true
	}
	return false
}

// handle serves one event from a relay: it returns once its answer (if
// any) is published or given up.
func (s *Server) handle(ctx context.Context, ev *nostr.Event) {
	v, mine := s.preShard(ev)
	if !mine {
		s.log.Debug("nostr request dropped: another instance's shard", logKeyEvent, ev.ID)
		return
	}
	r, err := s.parse(ev)
	if err != nil {
		s.log.Debug("nostr event dropped", logKeyEvent, ev.ID, logKeyReason, err)
		return
	}
	if r.dialect == dialectContextVM {
		s.noteOversized(r.ev)
		if r.notification() && oversized.IsFrame(r.msg.Method, r.msg.Params) {
			// A CEP-22 frame: served as the request it completes, if any.
			if r = s.takeFrame(ctx, r); r == nil {
				return
			}
		}
	}
	if r.dialect == dialectContextVM && r.msg.Method == "" && len(r.msg.ID) > 0 {
		// A response: to one of our elicitations, or dropped.
		s.answerElicit(r)
		return
	}
	out := s.newOutbox(ctx, r)
	defer out.close()
	if r.notification() {
		// A notification, or a response we did not ask for: no answer.
		return
	}
	if r.msg.Method == "" {
		return
	}
	if !s.claim(ctx, r, v) {
		return
	}
	if !s.access.permits(r.ev.PubKey) {
		out.answer(nil, &rpcError{Code: rpcerr.CodeInvalidRequest, Message: "Forbidden"}, nil, false)
		return
	}
	if s.cfg.Encryption == EncryptionRequired && !r.encrypted {
		out.answer(nil, &rpcError{Code: rpcerr.CodeInvalidRequest, Message: "Encryption required"}, nil, false)
		return
	}
	if r.dialect == dialectContextVM {
		s.sess.touch(r, s.cfg.Now(), s.cfg.Window)
	}
	// The signer, proven by its signature: an upstream may be told
	// (CEP-16, upstream.ServerConfig.ClientPubkey).
	ctx = vend.WithClientPubkey(ctx, r.ev.PubKey)
	if kept(r.msg.Method) {
		if !s.startReplay(ctx, r, out) {
			return
		}
		defer s.endReplay(r)
	}
	switch r.msg.Method {
	case "initialize":
		var tags nostr.Tags
		if r.dialect == dialectRev1 || r.dialect == dialectRev11 {
			// DVMCP clients put this server id in the s tag of
			// their later requests.
			tags = nostr.Tags{{"d", ServerID(s.pk)}}
		}
		out.answer(s.initializeResult(r.msg.Params), nil, tags, true)
	case "ping":
		out.answer(json.RawMessage(`{}`), nil, nil, false)
	case "completion/complete":
		res, rerr := s.complete(ctx, r.msg.Params)
		out.answer(res, rerr, nil, false)
	case "tools/list":
		res, tags := s.listTools()
		out.answer(res, nil, tags, false)
	case "tools/call":
		res, rerr := s.call(ctx, r, out)
		out.answer(res, rerr, nil, false)
		s.remember(ctx, r, res, rerr) // once the answer is out, or while it goes
	case "prompts/list", "prompts/get", "resources/list", "resources/templates/list", "resources/read":
		res, rerr, tags := s.serveCatalog(ctx, r, out)
		out.answer(res, rerr, tags, false)
		s.remember(ctx, r, res, rerr)
	default:
		out.answer(nil, &rpcError{Code: rpcerr.CodeMethodNotFound, Message: "Method not found"}, nil, false)
	}
}

// knownProtocols are the MCP versions whose initialize is answered with
// the client's own version.
var knownProtocols = []string{"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}

func (s *Server) initializeResult(params json.RawMessage) json.RawMessage {
	var p struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	_ = json.Unmarshal(params, &p)
	v := latestProtocol
	if slices.Contains(knownProtocols, p.ProtocolVersion) {
		v = p.ProtocolVersion
	}
	b, _ := json.Marshal(map[string]any{
		"protocolVersion": v,
		"capabilities":    s.capabilities(),
		"serverInfo":      map[string]any{"name": s.cfg.Name, "version": s.cfg.Version},
	})
	return b
}

// call serves a tools/call.
func (s *Server) call(ctx context.Context, r *request, out *outbox) (json.RawMessage, *rpcError) {
	var p struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Meta      map[string]any  `json:"_meta"`
	}
	if err := json.Unmarshal(r.msg.Params, &p); err != nil || p.Name == "" {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params"}
	}
	cr := s.callRequest(r, out, vend.ItemTool, p.Name, p.Arguments, p.Meta)
	if r.dialect == dialectContextVM {
		cr.Elicit = s.elicitFunc(r, out)
	}
	return s.sell(ctx, cr, out)
}

// callRequest is the vend.CallRequest of a tools/call (or priced
// prompts/get, resources/read) of r: see docs/CONTEXTVM.md, From
// request to call.
func (s *Server) callRequest(r *request, out *outbox, kind vend.ItemKind, name string, args json.RawMessage, meta map[string]any) vend.CallRequest {
	cr := vend.CallRequest{
		Kind:         kind,
		Transport:    r.dialect.transport(),
		Client:       r.ev.PubKey,
		RequestID:    r.ev.ID,
		Name:         name,
		Arguments:    args,
		Notify:       out.notify,
		Work:         work(r.ev),
		WorkRequired: s.cfg.PowDifficulty,
		// A plaintext event is public: every relay keeps and serves it
		// and the answer. vend refuses a bearer secret in it and hands
		// none back.
		Public: !r.encrypted,
	}
	if len(cr.Arguments) == 0 || string(cr.Arguments) == "null" {
		cr.Arguments = json.RawMessage(`{}`)
	}
	for _, t := range r.ev.Tags {
		if len(t) >= 2 && t[0] == tagPMI && t[1] != "" {
			cr.PMIs = append(cr.PMIs, t[1])
		}
		if len(t) >= 2 && t[0] == tagPaymentInteraction && t[1] == explicitGating {
			cr.Explicit = true
		}
	}
	if m := meta; m != nil {
		if tok, ok := m["progressToken"]; ok && tok != nil {
			cr.ProgressToken, _ = json.Marshal(tok)
		}
		if tok, ok := m[vend.MetaCashuToken].(string); ok {
			cr.CashuToken = tok
		}
		if proof, ok := m[vend.MetaPaymentProof].(string); ok {
			cr.PaymentProof = proof
		}
		if from, ok := m[vend.MetaInvoiceFrom].(string); ok {
			cr.InvoiceFrom = vend.Backend(from)
		}
		if inv, ok := m[vend.MetaRefundInvoice].(string); ok {
			cr.RefundInvoice = inv
		}
		// Credit: a token, or true for the account of the pubkey that
		// signed the request (proven: the event's signature).
		switch c := m[vend.MetaCredit].(type) {
		case string:
			cr.Credit = c
		case bool:
			cr.CreditSelf = c
		}
		if v, ok := m[metaPaymentInteraction].(string); ok && v == explicitGating {
			cr.Explicit = true
		}
		if list, ok := m[metaPMI].([]any); ok {
			for _, x := range list {
				if str, ok := x.(string); ok && !slices.Contains(cr.PMIs, str) {
					cr.PMIs = append(cr.PMIs, str)
				}
			}
		}
	}
	if r.dialect == dialectContextVM {
		// A CEP-8 direct payment: the same Cashu token as the _meta
		// alias's, by the tag (which wins), so that vend's one check
		// refuses it in a plaintext event.
		if pmi, tok := directPayment(r.ev.Tags); tok != "" {
			cr.CashuToken = tok
			out.direct = pmi
		}
	}
	return cr
}

// sell runs cr (the request of out) through the Vendor and returns the
// result body or the JSON-RPC error for the client (details only
// logged). A direct payment refused without being redeemed also gets
// CEP-8's payment_rejected before the error.
func (s *Server) sell(ctx context.Context, cr vend.CallRequest, out *outbox) (json.RawMessage, *rpcError) {
	res, err := s.cfg.Vendor.CallItem(ctx, cr)
	if err != nil {
		var pe *vend.PublicSecretError
		if out.direct != "" && errors.As(err, &pe) && strings.HasPrefix(pe.What, "a Cashu token") {
			// vend names the _meta carrier; the token came in the tag.
			err = &vend.PublicSecretError{What: "a Cashu token (the direct_payment tag)"}
		}
		w := toWire(err, cr.Name)
		lvl := rpcerr.LogLevel(w.Code)
		s.log.Log(ctx, lvl, string(cr.Kind.Or())+" request answered with an error", logKeyTool, cr.Name, logKeyClient, cr.Client, logKeyCode, w.Code, logKeyErr, err)
		if out.direct != "" && unredeemed(err) {
			out.notify(vend.NotifyPaymentRejected, directRejected(out.direct, w))
		}
		return nil, w
	}
	if !json.Valid(res.Body) {
		s.log.Error("vendor returned an invalid result body", logKeyTool, cr.Name)
		return nil, &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
	}
	return res.Body, nil
}

// toWire maps a Vendor error to the JSON-RPC error sent to the client.
func toWire(err error, tool string) *rpcError {
	e := rpcerr.FromVend(err, tool)
	return &e
}

// outboxSize bounds the notifications waiting to be published for one
// request; more are dropped (the answer never is).
const outboxSize = 64

// outbox publishes the events about one request in order: notifications
// first, the answer last. Its goroutine starts with the first
// notification or request of ours; an answer with nothing queued before
// it is published in the answering goroutine (most requests have no
// notification: that saves a goroutine and its hand-offs per request).
type outbox struct {
	s   *Server
	r   *request
	ctx context.Context

	mu     sync.Mutex     // guards ch, closed, and ch's closing against late notifications
	ch     chan *outEvent // nil until the first queued event; pointers: a buffer of outboxSize events was 7 KB a request
	done   chan struct{}  // closed when run returned; nil while ch is
	closed bool           // the answer is out (or on its way): notifications are dropped

	hold bool // a new client: wait FirstAnswerDelay before the first event (read by whoever sends: run's goroutine, or answer's before run starts)

	// free gives the request's MaxInFlight slot back (idempotent; nil
	// when it holds none): the request now waits for a payment.
	free func()

	// direct is the PMI of the request's direct payment (direct.go), ""
	// when it has none. Set before the Vendor's call, read by notify.
	direct string
}

type outEvent struct {
	method    string // a notification's or a request's
	params    any
	id        string          // a request's (ours: elicitation/create)
	sent      chan error      // a request's: gets the publication's outcome (buffered 1)
	result    json.RawMessage // the answer's
	rerr      *rpcError
	tags      nostr.Tags
	response  bool // the answer, not a notification
	discovery bool // carries the discovery tags whatever came before
}

func (s *Server) newOutbox(ctx context.Context, r *request) *outbox {
	o := &outbox{s: s, r: r, ctx: ctx}
	o.free, _ = ctx.Value(slotKey{}).(func())
	o.hold = s.cfg.FirstAnswerDelay > 0 && s.newClient(r.ev.PubKey)
	return o
}

// queue returns the queue of o's goroutine, starting it on first use; o.mu
// is held.
func (o *outbox) queue() chan *outEvent {
	if o.ch == nil {
		o.ch, o.done = make(chan *outEvent, outboxSize), make(chan struct{})
		go o.run()
	}
	return o.ch
}

func (o *outbox) run() {
	defer close(o.done)
	for e := range o.ch {
		o.publish(e)
	}
}

// publish sends e, logs its failure and reports its outcome to e.sent.
func (o *outbox) publish(e *outEvent) {
	err := o.send(e)
	if err != nil {
		o.s.log.Warn("nostr answer not published", logKeyClient, o.r.ev.PubKey, logKeyEvent, o.r.ev.ID, logKeyErr, err)
	}
	if e.sent != nil {
		e.sent <- err
	}
}

// close waits until everything queued is published or given up.
// Notifications after close are dropped.
func (o *outbox) close() {
	o.mu.Lock()
	already := o.closed
	o.closed = true
	ch, done := o.ch, o.done
	if ch != nil && !already {
		close(ch)
	}
	o.mu.Unlock()
	if done != nil {
		<-done
	}
}

// notify queues a notification (vend.CallRequest.Notify), sent in the
// request's dialect. It never blocks: when the queue is full the
// notification is dropped.
func (o *outbox) notify(method string, params any) {
	if method == vend.NotifyPaymentRequired && o.free != nil {
		// Waiting for a payment holds no slot: vend bounds waiting
		// calls (limits.max_unpaid_total, shedding the oldest).
		o.free()
	}
	var tags nostr.Tags
	if method == vend.NotifyPaymentAccepted && o.direct != "" {
		params, tags = o.directAccepted(params)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	select {
	case o.queue() <- &outEvent{method: method, params: params, tags: tags}:
	default:
		o.s.log.Debug("notification dropped: outbox full", logKeyMethod, method)
	}
}

// request queues a JSON-RPC request of ours (id, method, params) to the
// request's client, after the notifications queued before it; the
// publication's outcome goes to sent (buffered 1). It waits for room in
// the queue, and returns false, queueing nothing, once the answer is out.
func (o *outbox) request(id, method string, params json.RawMessage, sent chan error) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return false
	}
	o.queue() <- &outEvent{method: method, params: params, id: id, sent: sent}
	return true
}

// answer publishes the response to the request: queued after the events
// before it, or, when nothing was ever queued, right here (it returns
// once published or given up). Either way the events offered after it
// are dropped; close still waits for a queued answer.
func (o *outbox) answer(result json.RawMessage, rerr *rpcError, tags nostr.Tags, discovery bool) {
	e := &outEvent{result: result, rerr: rerr, tags: tags, response: true, discovery: discovery}
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	if o.ch != nil {
		defer o.mu.Unlock()
		o.ch <- e
		return
	}
	o.closed = true // no goroutine will start: hold is ours
	o.mu.Unlock()
	o.publish(e)
}

// send encodes e in the request's dialect, signs (and wraps, for an
// encrypted request) each event and publishes them in order.
func (o *outbox) send(e *outEvent) error {
	client := o.r.ev.PubKey
	if o.hold {
		// A new client: its subscription may not be in place at the
		// relay yet (see Config.FirstAnswerDelay).
		o.hold = false
		o.s.sleep(o.ctx, o.s.cfg.FirstAnswerDelay)
	}
	for _, d := range o.drafts(*e) {
		tags := d.tags
		if d.response && (o.s.firstAnswer(client) || e.discovery) {
			if o.r.dialect == dialectContextVM {
				tags = append(tags, o.s.cvmDiscoveryTags()...)
			} else {
				tags = append(tags, o.s.discoveryTags()...)
			}
		}
		ev := nostr.Event{Kind: d.kind, CreatedAt: nostr.Timestamp(o.s.cfg.Now().Unix()), Tags: tags, Content: d.content}
		if err := o.deliver(ev); err != nil {
			if d.response {
				// Never silent: a small error where the answer did
				// not go.
				o.undelivered(err)
			}
			return err
		}
	}
	return nil
}

// seal signs ev, and wraps it the way the request came: in a ContextVM
// gift wrap, or as a NIP-59 rumor in a seal in a gift wrap.
func (o *outbox) seal(ev nostr.Event) (nostr.Event, error) {
	w, client := o.r.wrap, o.r.ev.PubKey
	if w.nip59 {
		seal, err := o.s.seal(ev, client, w.rumor14)
		if err != nil {
			return ev, err
		}
		return o.s.giftWrap(seal, client, answerWrapKind(o.r.ev))
	}
	if err := o.s.sign(&ev); err != nil {
		return ev, err
	}
	if w.kind != 0 {
		return o.s.giftWrap(ev, client, answerWrapKind(o.r.ev))
	}
	return ev, nil
}
