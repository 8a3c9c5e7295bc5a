package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
	"github.com/capvend/capvend/adapters/rpcerr"
)

// Oversized transfer (CEP-22): answers too large for one event go to
// clients that take them as frames; requests that came as frames are
// reassembled. See docs/CONTEXTVM.md, Oversized transfer.

// Defaults of the Config fields of oversized requests.
const (
	DefaultMaxRequestBytes    = 1 << 20
	DefaultMaxReassemblyBytes = 64 << 20
)

// errTooLarge: an answer larger than the relays take, to a client that
// cannot take it in frames.
var errTooLarge = errors.New("too large for the relays, and the client asked for no oversized transfer")

// wrapOverhead bounds the bytes of a published gift wrap besides its
// content: ["EVENT",{"kind":21059,"id":..,"pubkey":..,"created_at":..,
// "tags":[["p",..]],"content":"","sig":..}] is about 300.
const wrapOverhead = 400

// progressToken is the request's params._meta.progressToken (a string or
// a number), or nil.
func (r *request) progressToken() json.RawMessage {
	var p struct {
		Meta struct {
			ProgressToken json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	}
	if json.Unmarshal(r.msg.Params, &p) != nil {
		return nil
	}
	if _, err := oversized.TokenKey(p.Meta.ProgressToken); err != nil {
		return nil
	}
	return p.Meta.ProgressToken
}

// noteOversized remembers that client takes oversized transfers (a
// support_oversized_transfer tag on any of its events).
func (s *Server) noteOversized(ev *nostr.Event) {
	if findTag(ev.Tags, oversized.TagSupport) == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bigOK) >= maxSessions {
		clear(s.bigOK)
	}
	s.bigOK[ev.PubKey] = true
}

// takesOversized says whether client said it takes oversized transfers.
func (s *Server) takesOversized(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bigOK[client]
}

// canSplit says whether answers to o's request may go as frames: a
// ContextVM request with a progressToken, from a client that takes
// oversized transfers (CEP-22 allows nothing else).
func (o *outbox) canSplit() bool {
	return o.r.dialect == dialectContextVM && o.r.progressToken() != nil && o.s.takesOversized(o.r.ev.PubKey)
}

// deliver signs (and wraps) ev, one of the events about o's request, and
// publishes it: whole if it fits every relay's limits, else as CEP-22
// frames when the client takes them, else whole anyway (a relay that
// advertises no limit may take it). errTooLarge when it cannot go at all.
func (o *outbox) deliver(ev nostr.Event) error {
	w := o.r.wrap
	if w.nip59 || o.r.dialect != dialectContextVM {
		sealed, err := o.seal(ev)
		if err != nil {
			return err
		}
		return o.s.publishRetry(o.ctx, sealed)
	}
	limits := o.s.sendLimits(o.ctx)
	if err := o.s.sign(&ev); err != nil {
		return err
	}
	if w.kind == 0 {
		if limits.Content <= 0 && 6*(len(ev.Content)+len(ev.Tags)*140)+1024 < limits.Message {
			// Small beyond doubt (an escape is 6 bytes at most): the
			// usual answer is not measured.
			return o.s.publishRetry(o.ctx, ev)
		}
		env, _ := nostr.EventEnvelope{Event: ev}.MarshalJSON()
		if !limits.Fits(oversized.Size{Message: len(env), Content: len(ev.Content)}) && o.canSplit() {
			return o.split(ev, limits)
		}
		return o.s.publishRetry(o.ctx, ev)
	}
	inner := len(ev.String())
	if inner > oversized.MaxWrapped(limits, wrapOverhead) && o.canSplit() {
		return o.split(ev, limits)
	}
	if inner > oversized.MaxNIP44Plaintext {
		return errTooLarge
	}
	wrapped, err := o.s.giftWrap(ev, o.r.ev.PubKey, answerWrapKind(o.r.ev))
	if err != nil {
		return err
	}
	return o.s.publishRetry(o.ctx, wrapped)
}

// split sends ev (signed: its content and tags are the message's) as
// CEP-22 frames: start (with ev's tags: discovery, cap ...), chunks and
// end (tagged p and e), each signed, wrapped like the request, published
// in order on each relay. A frame no relay takes ends the transfer: an
// abort frame is sent, and the error returned.
func (o *outbox) split(ev nostr.Event, limits oversized.Limits) error {
	msg := oversized.Valid(ev.Content)
	token := o.r.progressToken()
	client := o.r.ev.PubKey
	cont := nostr.Tags{{"p", client}, {"e", o.r.ev.ID}}
	wrapped := o.r.wrap.kind != 0
	measure := func(data string) (oversized.Size, error) {
		f := oversized.Frame{ProgressToken: token, Progress: 1 << 40, CVM: oversized.CVM{Type: oversized.Type, FrameType: oversized.FrameChunk, Data: data}}
		e := nostr.Event{ID: zeros64, PubKey: o.s.pk, Sig: zeros64 + zeros64, Kind: KindMessage, CreatedAt: nostr.Timestamp(o.s.cfg.Now().Unix()),
			Tags: cont, Content: f.Content()}
		if wrapped {
			return oversized.Size{Message: len(e.String())}, nil
		}
		env, err := nostr.EventEnvelope{Event: e}.MarshalJSON()
		return oversized.Size{Message: len(env), Content: len(e.Content)}, err
	}
	lim := limits
	if wrapped {
		lim = oversized.Limits{Message: oversized.MaxWrapped(limits, wrapOverhead)}
	}
	chunks, err := oversized.Cut(msg, lim, measure)
	if err != nil {
		o.s.pubs.count(&o.s.pubs.TransfersOutFailed)
		return err
	}
	frames := oversized.Build(msg, token, chunks, 2)
	ctx := context.WithValue(o.ctx, chainKey{}, &relayChain{})
	start := time.Now()
	for i, f := range frames {
		tags := cont
		if i == 0 {
			tags = ev.Tags
		}
		if err := o.publishFrame(ctx, f, tags); err != nil {
			o.s.pubs.count(&o.s.pubs.TransfersOutFailed)
			// The stock client only logs an abort (its request waits on):
			// the caller sends an error answer after it.
			abort := oversized.Abort(token, f.Progress, "the relays did not take a frame")
			if aerr := o.publishFrame(ctx, abort, cont); aerr != nil {
				o.s.log.Debug("abort frame not published", logKeyClient, client, logKeyErr, aerr)
			}
			return fmt.Errorf("frame %d of %d of an oversized transfer: %w", i+1, len(frames), err)
		}
	}
	o.s.pubs.count(&o.s.pubs.TransfersOut)
	o.s.log.Debug("oversized answer sent", logKeyClient, client, logKeyEvent, o.r.ev.ID, "bytes", len(msg), "chunks", len(chunks),
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

const zeros64 = "0000000000000000000000000000000000000000000000000000000000000000"

// publishFrame signs (and wraps, like the request) one frame tagged tags
// and publishes it.
func (o *outbox) publishFrame(ctx context.Context, f oversized.Frame, tags nostr.Tags) error {
	ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Timestamp(o.s.cfg.Now().Unix()), Tags: tags, Content: f.Content()}
	sealed, err := o.seal(ev)
	if err != nil {
		return err
	}
	return o.s.publishRetry(ctx, sealed)
}

// undelivered answers a request whose answer no relay took (err says
// why) with a small JSON-RPC error instead, in the request's dialect: a
// small event may go where a large one did not, and the client learns at
// once instead of waiting for its timeout. An answer that is kept (a paid
// call's result, a stored reply) is sent again on a replay of the same
// request event.
func (o *outbox) undelivered(cause error) {
	o.s.pubs.count(&o.s.pubs.Undelivered)
	why := "the relays did not take it"
	if errors.Is(cause, errTooLarge) || isTooLarge(cause) {
		why = "it is larger than the relays take; a client that supports oversized transfer (CEP-22) and sends a progressToken gets it in parts"
	}
	rerr := &rpcError{Code: rpcerr.CodeUndelivered, Message: "Answer not delivered: " + why + "; send the same request event again to get a kept answer"}
	o.s.log.Warn("nostr answer not delivered: sending an error instead", logKeyClient, o.r.ev.PubKey, logKeyEvent, o.r.ev.ID, logKeyErr, cause)
	for _, d := range o.drafts(outEvent{rerr: rerr, response: true}) {
		ev := nostr.Event{Kind: d.kind, CreatedAt: nostr.Timestamp(o.s.cfg.Now().Unix()), Tags: d.tags, Content: d.content}
		sealed, err := o.seal(ev)
		if err == nil {
			err = o.s.publishRetry(o.ctx, sealed)
		}
		if err != nil {
			o.s.log.Warn("nostr error answer not published either", logKeyClient, o.r.ev.PubKey, logKeyEvent, o.r.ev.ID, logKeyErr, err)
			return
		}
	}
}

// isTooLarge says whether err is a publication every relay refused for
// its size.
func isTooLarge(err error) bool {
	var pe *PublishError
	return errors.As(err, &pe) && pe.tooLarge()
}

// frameInfo is what the receiver keeps of a start or end frame: the
// event and how it came.
type frameInfo struct {
	ev   *nostr.Event
	wrap wrapping
}

// takeFrame handles a CEP-22 frame from a client (r is its checked
// event): it returns the request the frames make once this one completes
// them, else nil. A failed transfer is answered with a JSON-RPC error
// when its end came (the client waits for the answer to its end frame),
// else with an abort frame.
func (s *Server) takeFrame(ctx context.Context, r *request) *request {
	f, err := oversized.Parse(r.msg.Params)
	if err != nil {
		s.log.Debug("oversized frame dropped", logKeyEvent, r.ev.ID, logKeyErr, err)
		return nil
	}
	if !s.access.permits(r.ev.PubKey) {
		// A refused client's frames hold no memory; its end frame, which
		// its request waits on, is answered as any refused request.
		if f.CVM.FrameType == oversized.FrameEnd {
			s.sendLoose(ctx, r, `{"jsonrpc":"2.0","error":{"code":-32600,"message":"Forbidden"}}`, nostr.Tags{{"p", r.ev.PubKey}, {"e", r.ev.ID}})
		}
		return nil
	}
	if f.CVM.FrameType == oversized.FrameStart && s.newClient(r.ev.PubKey) {
		// The client could not know we take transfers: the accept the
		// CEP asks for (the stock client does not wait for it).
		s.sendAccept(ctx, r, f.ProgressToken)
	}
	m, err := s.recv.Add(r.ev.PubKey, f, !r.encrypted, s.cfg.Now(), frameInfo{ev: r.ev, wrap: r.wrap})
	if err != nil {
		var e *oversized.Error
		if errors.As(err, &e) {
			s.transferFailed(ctx, e)
		}
		return nil
	}
	if m == nil {
		return nil
	}
	req, err := s.reassembled(m)
	if err != nil {
		s.pubs.count(&s.pubs.TransfersInFailed)
		s.log.Info("oversized request dropped", logKeyClient, m.Peer, "token", m.Token, logKeyErr, err)
		return nil
	}
	s.pubs.count(&s.pubs.TransfersIn)
	s.log.Debug("oversized request received", logKeyClient, m.Peer, logKeyEvent, req.ev.ID, "bytes", len(m.Data), "frames", m.Frames)
	return req
}

// reassembled is the request a completed transfer carries: its event is
// the end frame's (its id is the request's: the e tag of the answers,
// the ledger's RequestID), with the start frame's negotiation tags (pmi,
// payment_interaction, direct_payment, support_encryption_ephemeral ...),
// its content the message; encrypted only if every frame was.
func (s *Server) reassembled(m *oversized.Message) (*request, error) {
	start, _ := m.Start.(frameInfo)
	end, ok := m.End.(frameInfo)
	if !ok || start.ev == nil {
		return nil, errors.New("no start or end frame")
	}
	ev := *end.ev
	ev.Content = string(m.Data)
	ev.Tags = append(nostr.Tags(nil), end.ev.Tags...)
	for _, t := range start.ev.Tags {
		if len(t) == 0 {
			continue
		}
		switch t[0] {
		case tagPMI, tagPaymentInteraction, tagDirectPayment, tagEphemeral, oversized.TagSupport, "support_encryption":
			if !containsTag(ev.Tags, t) {
				ev.Tags = append(ev.Tags, t)
			}
		}
	}
	d, msg, err := parseMessage(&ev)
	if err != nil {
		return nil, err
	}
	if d != dialectContextVM || oversized.IsFrame(msg.Method, msg.Params) {
		return nil, ErrNotJSONRPC
	}
	return &request{ev: &ev, encrypted: !m.Plaintext, msg: msg, dialect: dialectContextVM, wrap: end.wrap}, nil
}

func containsTag(tags nostr.Tags, t nostr.Tag) bool {
	for _, x := range tags {
		if strings.Join(x, "\x00") == strings.Join(t, "\x00") {
			return true
		}
	}
	return false
}

// sendAccept publishes the accept frame of token to r's client (tagged
// p, and the discovery tags: it is the first event to this client).
func (s *Server) sendAccept(ctx context.Context, r *request, token json.RawMessage) {
	tags := nostr.Tags{{"p", r.ev.PubKey}}
	if s.firstAnswer(r.ev.PubKey) {
		tags = append(tags, s.cvmDiscoveryTags()...)
	}
	s.sendLoose(ctx, r, oversized.Accept(token).Content(), tags)
}

// sendLoose signs content tagged tags, wraps it the way r came, and
// publishes it: an event about r outside its outbox (accept and abort
// frames, the error of a failed transfer).
func (s *Server) sendLoose(ctx context.Context, r *request, content string, tags nostr.Tags) {
	o := &outbox{s: s, r: r, ctx: ctx}
	ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Timestamp(s.cfg.Now().Unix()), Tags: tags, Content: content}
	sealed, err := o.seal(ev)
	if err == nil {
		err = s.publishRetry(ctx, sealed)
	}
	if err != nil {
		s.log.Debug("oversized transfer event not published", logKeyClient, r.ev.PubKey, logKeyErr, err)
	}
}

// transferFailed reports a failed inbound transfer: logged, counted, and
// told to the client: a JSON-RPC error (without an id: the request's is
// in the frames that failed; the stock client gives its pending request
// the error) tagged e with the end frame when it came, else an abort
// frame.
func (s *Server) transferFailed(ctx context.Context, e *oversized.Error) {
	if !e.Again {
		s.pubs.count(&s.pubs.TransfersInFailed)
		s.log.Warn("oversized request failed", logKeyClient, e.Peer, "token", e.Token, logKeyErr, e)
	}
	info, _ := e.End.(frameInfo)
	if info.ev == nil {
		info, _ = e.Start.(frameInfo)
		if info.ev == nil {
			return // nothing of it came but chunks: nobody to tell
		}
		r := &request{ev: info.ev, wrap: info.wrap, encrypted: info.wrap.kind != 0}
		tok, _ := json.Marshal(e.Token)
		s.sendLoose(ctx, r, oversized.Abort(tok, 1, e.Error()).Content(), nostr.Tags{{"p", e.Peer}})
		return
	}
	r := &request{ev: info.ev, wrap: info.wrap, encrypted: info.wrap.kind != 0}
	content := marshal(struct {
		JSONRPC string    `json:"jsonrpc"`
		Error   *rpcError `json:"error"`
	}{"2.0", &rpcError{Code: rpcerr.CodeInvalidRequest, Message: "Invalid Request: oversized transfer failed: " + e.Error()}})
	s.sendLoose(ctx, r, content, nostr.Tags{{"p", e.Peer}, {"e", info.ev.ID}})
}

// sweepTransfers ends the inbound transfers that ran out of time, every
// second, until ctx ends (Run runs it).
func (s *Server) sweepTransfers(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, e := range s.recv.Sweep(s.cfg.Now()) {
				s.transferFailed(ctx, e)
			}
		}
	}
}
