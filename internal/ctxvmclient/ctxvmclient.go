// Package ctxvmclient is a ContextVM client in Go: it sends MCP JSON-RPC
// requests to one server over one Nostr relay, in plaintext (kind 25910)
// or gift wrapped (NIP-44, kinds 1059 and 21059), and reads the answers
// and the notifications about them (payment_required first, for a priced
// call). `capvend demo`, capvend's tests and its benchmarks use it; it is
// a client of the wire, not of package ctxvm (whose tests use it too, so
// it must not import it).
//
// One goroutine reads the relay connection, so events arrive in the
// relay's order. An event about a request someone waits for (Expect,
// Roundtrip) goes to that waiter; every other event goes to Events, in
// order, when Options.Events is set, and is dropped otherwise.
//
// A Client is safe for concurrent use: any number of requests may be in
// flight (a load generator keeps many).
package ctxvmclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"
	"github.com/nbd-wtf/go-nostr/nip44"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
)

// Event kinds of ContextVM (the same numbers as package ctxvm's).
const (
	KindMessage           = 25910 // a JSON-RPC message
	KindGiftWrap          = 1059  // a NIP-44 encrypted, signed KindMessage
	KindEphemeralGiftWrap = 21059 // the same, not stored by relays
)

// Options configures Dial. The zero value is a plaintext client with a
// fresh key that verifies the server's signatures.
type Options struct {
	// SecretKey is the client's key, 64 hex characters; "": a fresh one.
	SecretKey string
	// Kinds are the kinds subscribed to (tagged ["p", <client>]); nil:
	// KindMessage, KindGiftWrap and KindEphemeralGiftWrap.
	Kinds []int
	// Events, when set, keeps the events no waiter claims, in the relay's
	// order, for Events (a buffer of 100: the reader waits when it is
	// full). When not set they are dropped.
	Events bool
	// AssumeValid skips checking the signatures of the server's events (a
	// load generator measures the server, not itself).
	AssumeValid bool
	// Oversized speaks CEP-22 (oversized transfer): every request says
	// so (a support_oversized_transfer tag) and carries a progressToken
	// (its id, unless it has one); answers that come as frames are
	// reassembled (Pending.Next returns them whole); and a request too
	// large for the relay (its advertised NIP-11 limits, read at Dial, or
	// oversized.DefaultThreshold) is sent as frames.
	Oversized bool
}

// Client is a ContextVM client on one relay connection; see the package
// doc. Close it.
type Client struct {
	SecretKey string // hex
	PublicKey string // hex
	Server    string // the server's pubkey, hex

	opts   Options
	key    *btcec.PrivateKey
	conn   *nostr.Connection
	cancel context.CancelFunc
	read   chan struct{} // closed when the reader ends
	events chan *nostr.Event
	ids    atomic.Int64

	mu      sync.Mutex
	oks     map[string]chan nostr.OKEnvelope // by event id
	waiting map[string]chan Received         // by request event id

	limits oversized.Limits    // the relay's (Options.Oversized)
	recv   *oversized.Receiver // answers coming as frames (Options.Oversized)
}

// Received is an event about a request: the server's event, unwrapped
// when it came gift wrapped (Wrapped then is its wrap's kind). A message
// that came as CEP-22 frames (Options.Oversized) is the end frame's
// event with the reassembled message as its content (so no longer
// signed: each frame's signature was checked), Frames their number.
type Received struct {
	Event   *nostr.Event
	Wrapped int
	Frames  int
	err     error // a transfer that failed
}

// Message is a JSON-RPC message from the server: a response (ID, Result
// or Error) or a notification (Method, Params).
type Message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// IsResponse says whether m is the response to a request, not a
// notification (or a request of the server's, such as an elicitation).
func (m Message) IsResponse() bool { return m.Method == "" }

// Error is a JSON-RPC error response.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("error %d %s", e.Code, e.Message) }

// ErrBadEvent is returned for a server event that is badly signed or not
// a JSON-RPC 2.0 message.
var ErrBadEvent = errors.New("ctxvmclient: bad event from the server")

// Dial connects to the relay at url, subscribes to the events tagged for
// the client and returns once the relay has sent EOSE. ctx bounds only
// the dialing; the connection lives until Close.
func Dial(ctx context.Context, url, server string, opts Options) (*Client, error) {
	sk := opts.SecretKey
	if sk == "" {
		sk = nostr.GeneratePrivateKey()
	}
	skb, err := hex.DecodeString(sk)
	if err != nil || len(skb) != 32 {
		return nil, errors.New("ctxvmclient: the secret key is not 64 hex characters")
	}
	key, pub := btcec.PrivKeyFromBytes(skb)
	kinds := opts.Kinds
	if kinds == nil {
		kinds = []int{KindMessage, KindGiftWrap, KindEphemeralGiftWrap}
	}
	conn, err := nostr.NewConnection(ctx, url, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("ctxvmclient: relay %s: %w", url, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	c := &Client{SecretKey: strings.ToLower(sk), PublicKey: hex.EncodeToString(schnorr.SerializePubKey(pub)), Server: server,
		opts: opts, key: key, conn: conn, cancel: cancel, read: make(chan struct{}),
		oks: map[string]chan nostr.OKEnvelope{}, waiting: map[string]chan Received{}}
	if opts.Events {
		c.events = make(chan *nostr.Event, 100)
	}
	if opts.Oversized {
		c.recv = oversized.NewReceiver(oversized.Policy{MaxBytes: 256 << 20, MaxPeerBytes: 512 << 20, MaxTotalBytes: 512 << 20})
		c.limits = oversized.Limits{Message: oversized.DefaultThreshold}
		if info, err := nip11.Fetch(ctx, url); err == nil && info.Limitation != nil && info.Limitation.MaxMessageLength > 0 {
			c.limits = oversized.Limits{Message: info.Limitation.MaxMessageLength, Content: max(info.Limitation.MaxContentLength, 0)}
		}
	}
	eose := make(chan struct{}, 1)
	go c.reader(rctx, eose)
	req, _ := json.Marshal(nostr.ReqEnvelope{SubscriptionID: "s", Filters: nostr.Filters{{Kinds: kinds, Tags: nostr.TagMap{"p": {c.PublicKey}}}}})
	if err := conn.WriteMessage(ctx, req); err != nil {
		c.Close()
		return nil, fmt.Errorf("ctxvmclient: relay %s: %w", url, err)
	}
	select {
	case <-eose:
		return c, nil
	case <-c.read:
		c.Close()
		return nil, fmt.Errorf("ctxvmclient: relay %s closed the connection", url)
	case <-ctx.Done():
		c.Close()
		return nil, fmt.Errorf("ctxvmclient: relay %s: no EOSE: %w", url, ctx.Err())
	}
}

// Close closes the connection; waiters then get errors. Idempotent.
func (c *Client) Close() error {
	c.cancel()
	err := c.conn.Close()
	<-c.read
	return err
}

// Events returns the events no waiter claimed, in the relay's order, as
// they came (gift wraps wrapped); nil unless Options.Events. The channel
// is never closed.
func (c *Client) Events() <-chan *nostr.Event { return c.events }

// reader reads the connection until it fails or ctx ends.
func (c *Client) reader(ctx context.Context, eose chan<- struct{}) {
	defer close(c.read)
	parser := nostr.NewMessageParser()
	for {
		var buf strings.Builder
		if err := c.conn.ReadMessage(ctx, &buf); err != nil {
			return
		}
		env, err := parser.ParseMessage(buf.String())
		if err != nil {
			continue // not a message of the relay's we know
		}
		switch env := env.(type) {
		case *nostr.EventEnvelope:
			if !c.route(&env.Event) && c.events != nil {
				select {
				case c.events <- &env.Event:
				case <-ctx.Done():
					return
				}
			}
		case *nostr.OKEnvelope:
			c.mu.Lock()
			ch := c.oks[env.EventID]
			c.mu.Unlock()
			if ch != nil {
				select {
				case ch <- *env:
				default:
				}
			}
		case *nostr.EOSEEnvelope:
			select {
			case eose <- struct{}{}:
			default:
			}
		}
	}
}

// route hands ev to the waiter of the request it answers, if any, and
// says whether it did. Gift wraps are opened only while someone waits.
func (c *Client) route(ev *nostr.Event) bool {
	c.mu.Lock()
	n := len(c.waiting)
	c.mu.Unlock()
	if n == 0 {
		return false
	}
	in, wrapped := ev, 0
	if ev.Kind == KindGiftWrap || ev.Kind == KindEphemeralGiftWrap {
		inner, err := Unwrap(ev, c.SecretKey)
		if err != nil {
			return false
		}
		in, wrapped = inner, ev.Kind
	}
	if in.PubKey != c.Server {
		return false
	}
	for tag := range in.Tags.FindAll("e") {
		c.mu.Lock()
		ch := c.waiting[tag[1]]
		c.mu.Unlock()
		if ch != nil {
			rec := Received{Event: in, Wrapped: wrapped}
			if c.recv != nil {
				var done bool
				if rec, done = c.frame(rec); !done {
					return true // a frame: more to come
				}
			}
			select {
			case ch <- rec:
			default: // a waiter that stopped reading: dropped
			}
			return true
		}
	}
	return false
}

// frame passes a CEP-22 frame to the receiver: done says whether rec is
// for the waiter (what came, or the message the frame completed, or the
// transfer's failure) or the frame was taken (more to come).
func (c *Client) frame(rec Received) (Received, bool) {
	var m struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal([]byte(rec.Event.Content), &m) != nil || !oversized.IsFrame(m.Method, m.Params) {
		return rec, true
	}
	if !c.opts.AssumeValid {
		if ok, _ := rec.Event.CheckSignature(); !ok || !rec.Event.CheckID() {
			rec.err = fmt.Errorf("%w: a frame badly signed", ErrBadEvent)
			return rec, true
		}
	}
	f, err := oversized.Parse(m.Params)
	if err != nil {
		rec.err = fmt.Errorf("%w: %v", ErrBadEvent, err)
		return rec, true
	}
	msg, err := c.recv.Add(c.Server, f, rec.Wrapped == 0, time.Now(), rec)
	switch {
	case err != nil:
		rec.err = fmt.Errorf("ctxvmclient: %w", err)
		return rec, true
	case msg == nil:
		return rec, false
	}
	end := msg.End.(Received)
	ev := *end.Event
	ev.Content = string(msg.Data)
	return Received{Event: &ev, Wrapped: end.Wrapped, Frames: msg.Frames}, true
}

// Event returns a signed event of kind tagged ["p", server] and tags.
func (c *Client) Event(kind int, content string, tags ...nostr.Tag) (*nostr.Event, error) {
	ev := &nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Content: content, Tags: append(nostr.Tags{{"p", c.Server}}, tags...)}
	if err := c.Sign(ev); err != nil {
		return nil, err
	}
	return ev, nil
}

// Sign sets ev's pubkey, id and signature with the client's key (parsed
// once, not per event).
func (c *Client) Sign(ev *nostr.Event) error {
	ev.PubKey = c.PublicKey
	h := sha256.Sum256(ev.Serialize())
	sig, err := schnorr.Sign(c.key, h[:], schnorr.FastSign())
	if err != nil {
		return fmt.Errorf("ctxvmclient: sign: %w", err)
	}
	ev.ID, ev.Sig = hex.EncodeToString(h[:]), hex.EncodeToString(sig.Serialize())
	return nil
}

// Publish sends ev and waits for the relay's OK; a refusal is an error
// with the relay's reason (khatru refuses an ephemeral event no one
// listens for: "mute: no one was listening").
func (c *Client) Publish(ctx context.Context, ev *nostr.Event) error {
	ch := make(chan nostr.OKEnvelope, 1)
	c.mu.Lock()
	c.oks[ev.ID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.oks, ev.ID)
		c.mu.Unlock()
	}()
	b, _ := json.Marshal(nostr.EventEnvelope{Event: *ev})
	if err := c.conn.WriteMessage(ctx, b); err != nil {
		return fmt.Errorf("ctxvmclient: publish: %w", err)
	}
	select {
	case ok := <-ch:
		if !ok.OK {
			return fmt.Errorf("ctxvmclient: relay refused %s: %s", ev.ID, ok.Reason)
		}
		return nil
	case <-c.read:
		return errors.New("ctxvmclient: the relay connection closed")
	case <-ctx.Done():
		return fmt.Errorf("ctxvmclient: no OK from the relay: %w", ctx.Err())
	}
}

// Pending receives the events about one request; see Expect.
type Pending struct {
	c  *Client
	id string
	ch chan Received
}

// Expect makes the events about the request event id (its answer and the
// notifications before it) go to the returned Pending, until Done. Call
// it before publishing the request.
func (c *Client) Expect(id string) *Pending {
	p := &Pending{c: c, id: id, ch: make(chan Received, 64)}
	c.mu.Lock()
	c.waiting[id] = p.ch
	c.mu.Unlock()
	return p
}

// Done ends the wait: later events about the request go to Events (or
// are dropped).
func (p *Pending) Done() {
	p.c.mu.Lock()
	if p.c.waiting[p.id] == p.ch {
		delete(p.c.waiting, p.id)
	}
	p.c.mu.Unlock()
}

// Next returns the next message about the request and its event
// (unwrapped). A badly signed event (unless Options.AssumeValid) or one
// that is no JSON-RPC 2.0 message is ErrBadEvent.
func (p *Pending) Next(ctx context.Context) (Message, Received, error) {
	select {
	case r := <-p.ch:
		var m Message
		if r.err != nil {
			return m, r, r.err
		}
		if !p.c.opts.AssumeValid && r.Frames == 0 {
			if ok, _ := r.Event.CheckSignature(); !ok || !r.Event.CheckID() {
				return m, r, fmt.Errorf("%w: badly signed", ErrBadEvent)
			}
		}
		if err := json.Unmarshal([]byte(r.Event.Content), &m); err != nil || m.JSONRPC != "2.0" {
			return m, r, fmt.Errorf("%w: %q", ErrBadEvent, r.Event.Content)
		}
		return m, r, nil
	case <-p.c.read:
		return Message{}, Received{}, errors.New("ctxvmclient: the relay connection closed")
	case <-ctx.Done():
		return Message{}, Received{}, ctx.Err()
	}
}

// Answer reads the messages about the request up to its response,
// passing each notification to onNote first (nil: skipped); an error of
// onNote ends the wait with it.
func (p *Pending) Answer(ctx context.Context, onNote func(Message) error) (Message, Received, error) {
	for {
		m, r, err := p.Next(ctx)
		if err != nil {
			return m, r, err
		}
		if m.IsResponse() {
			return m, r, nil
		}
		if onNote != nil {
			if err := onNote(m); err != nil {
				return m, r, err
			}
		}
	}
}

// Roundtrip publishes the request event ev (or wrap, its gift wrap, when
// not nil) and returns its response; see Answer.
func (c *Client) Roundtrip(ctx context.Context, ev, wrap *nostr.Event, onNote func(Message) error) (Message, Received, error) {
	p := c.Expect(ev.ID)
	defer p.Done()
	out := ev
	if wrap != nil {
		out = wrap
	}
	if err := c.Publish(ctx, out); err != nil {
		return Message{}, Received{}, err
	}
	return p.Answer(ctx, onNote)
}

// Request says how to send one request (Request, Call).
type Request struct {
	Tags   nostr.Tags          // besides ["p", server]
	Wrap   int                 // 0: plaintext; KindGiftWrap or KindEphemeralGiftWrap: wrapped in it
	OnNote func(Message) error // notifications about it, before its response
	// Split, with Options.Oversized, sends the request as CEP-22 frames
	// whatever its size, as it says (tests of a server's receiver).
	Split *Split
}

// Split says how a request goes as CEP-22 frames.
type Split struct {
	// ChunkBytes cuts the message into chunks of at most this many bytes
	// of data (0: as large as the relay takes).
	ChunkBytes int
	// Handshake numbers the chunks from 3, leaving progress 2 to the
	// server's accept (as the stock client does when it did not learn
	// the server takes transfers), and does not wait for the accept
	// either (nor does the stock client).
	Handshake bool
	// Order, if set, is the order the frames are published in, as indexes
	// of start, the chunks and end (a permutation of 0..n-1 for n frames:
	// it gets n). The server's answer is to the end frame.
	Order func(n int) []int
}

// Request sends the JSON-RPC request method(params) with a fresh id and
// returns its response and its event. params nil is sent as no params.
// With Options.Oversized, see there.
func (c *Client) Request(ctx context.Context, method string, params any, r Request) (Message, Received, error) {
	id := c.ids.Add(1)
	msg := map[string]any{"jsonrpc": "2.0", "id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	tags := r.Tags
	if c.opts.Oversized {
		tags = append(slices.Clone(tags), nostr.Tag{oversized.TagSupport})
		var err error
		if msg["params"], err = withProgressToken(params, id); err != nil {
			return Message{}, Received{}, fmt.Errorf("ctxvmclient: %s: %w", method, err)
		}
	}
	body, err := json.Marshal(msg)
	if err != nil {
		return Message{}, Received{}, fmt.Errorf("ctxvmclient: %s: %w", method, err)
	}
	ev, err := c.Event(KindMessage, string(body), tags...)
	if err != nil {
		return Message{}, Received{}, err
	}
	if c.opts.Oversized && (r.Split != nil || c.tooLarge(ev, r.Wrap)) {
		return c.sendSplit(ctx, string(body), tags, r)
	}
	var wrap *nostr.Event
	if r.Wrap != 0 {
		if wrap, err = Wrap(*ev, c.Server, r.Wrap); err != nil {
			return Message{}, Received{}, err
		}
	}
	return c.Roundtrip(ctx, ev, wrap, r.OnNote)
}

// withProgressToken is params (a JSON object, or nil) with
// _meta.progressToken set to id unless it has one.
func withProgressToken(params any, id int64) (map[string]any, error) {
	p := map[string]any{}
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, errors.New("params are not a JSON object")
		}
	}
	meta, _ := p["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	if _, ok := meta["progressToken"]; !ok {
		meta["progressToken"] = id
	}
	p["_meta"] = meta
	return p, nil
}

// tooLarge says whether the request ev, sent whole (gift wrapped in
// wrap, when not 0), is over the relay's limits.
func (c *Client) tooLarge(ev *nostr.Event, wrap int) bool {
	if wrap != 0 {
		return len(ev.String()) > oversized.MaxWrapped(c.limits, 400)
	}
	env, _ := nostr.EventEnvelope{Event: *ev}.MarshalJSON()
	return !c.limits.Fits(oversized.Size{Message: len(env), Content: len(ev.Content)})
}

// sendSplit sends the request body as CEP-22 frames (the first with
// tags, the others tagged p only), each signed and wrapped like the
// request, each published once the relay took the one before; and
// returns the answer to the end frame.
func (c *Client) sendSplit(ctx context.Context, body string, tags nostr.Tags, r Request) (Message, Received, error) {
	var m struct {
		Params struct {
			Meta struct {
				ProgressToken json.RawMessage `json:"progressToken"`
			} `json:"_meta"`
		} `json:"params"`
	}
	_ = json.Unmarshal([]byte(body), &m)
	token := m.Params.Meta.ProgressToken
	cont := nostr.Tags{{"p", c.Server}}
	measure := func(data string) (oversized.Size, error) {
		if r.Split != nil && r.Split.ChunkBytes > 0 {
			return oversized.Size{Message: len(data)}, nil
		}
		f := oversized.Frame{ProgressToken: token, Progress: 1 << 40, CVM: oversized.CVM{Type: oversized.Type, FrameType: oversized.FrameChunk, Data: data}}
		e := nostr.Event{ID: strings.Repeat("0", 64), PubKey: c.PublicKey, Sig: strings.Repeat("0", 128), Kind: KindMessage, CreatedAt: nostr.Now(),
			Tags: cont, Content: f.Content()}
		if r.Wrap != 0 {
			return oversized.Size{Message: len(e.String())}, nil
		}
		env, err := nostr.EventEnvelope{Event: e}.MarshalJSON()
		return oversized.Size{Message: len(env), Content: len(e.Content)}, err
	}
	limits := c.limits
	switch {
	case r.Split != nil && r.Split.ChunkBytes > 0:
		limits = oversized.Limits{Message: r.Split.ChunkBytes}
	case r.Wrap != 0:
		limits = oversized.Limits{Message: oversized.MaxWrapped(c.limits, 400)}
	}
	chunks, err := oversized.Cut(body, limits, measure)
	if err != nil {
		return Message{}, Received{}, fmt.Errorf("ctxvmclient: %w", err)
	}
	base := int64(2)
	if r.Split != nil && r.Split.Handshake {
		base = 3
	}
	frames := oversized.Build(body, token, chunks, base)
	events := make([]*nostr.Event, len(frames))
	var endID string // the signed end frame's: the answer's e tag
	for i, f := range frames {
		t := cont
		if i == 0 {
			t = append(nostr.Tags{{"p", c.Server}}, tags...)
		}
		ev, err := c.Event(KindMessage, f.Content(), t[1:]...)
		if err != nil {
			return Message{}, Received{}, err
		}
		endID = ev.ID
		if r.Wrap != 0 {
			if ev, err = Wrap(*ev, c.Server, r.Wrap); err != nil {
				return Message{}, Received{}, err
			}
		}
		events[i] = ev
	}
	order := make([]int, len(events))
	for i := range order {
		order[i] = i
	}
	if r.Split != nil && r.Split.Order != nil {
		order = r.Split.Order(len(events))
	}
	p := c.Expect(endID)
	defer p.Done()
	for _, i := range order {
		if err := c.Publish(ctx, events[i]); err != nil {
			return Message{}, Received{}, fmt.Errorf("ctxvmclient: frame %d of %d: %w", i+1, len(events), err)
		}
	}
	return p.Answer(ctx, r.OnNote)
}

// Call is Request returning the result; a JSON-RPC error response is an
// *Error.
func (c *Client) Call(ctx context.Context, method string, params any, r Request) (json.RawMessage, nostr.Tags, error) {
	m, rec, err := c.Request(ctx, method, params, r)
	if err != nil {
		return nil, nil, err
	}
	if m.Error != nil {
		return nil, rec.Event.Tags, m.Error
	}
	return m.Result, rec.Event.Tags, nil
}

// WaitReady pings the server until it answers: a server subscribes after
// it starts, and the relay refuses an ephemeral event no one listens for.
// It tries every half second until ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	var last error
	for {
		try, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, _, err := c.Request(try, "ping", nil, Request{})
		timedOut := try.Err() != nil
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if !timedOut {
			select { // refused: the server is not subscribed yet
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ctxvmclient: the server never answered a ping: %w", last)
		}
	}
}

// Wrap gift wraps the signed event ev for recipient the way ContextVM
// clients do: ev NIP-44 encrypted by a one-time key into an event of kind
// (KindGiftWrap or KindEphemeralGiftWrap) tagged ["p", recipient].
func Wrap(ev nostr.Event, recipient string, kind int) (*nostr.Event, error) {
	sk := nostr.GeneratePrivateKey()
	ck, err := nip44.GenerateConversationKey(recipient, sk)
	if err != nil {
		return nil, fmt.Errorf("ctxvmclient: wrap: %w", err)
	}
	ct, err := nip44.Encrypt(ev.String(), ck)
	if err != nil {
		return nil, fmt.Errorf("ctxvmclient: wrap: %w", err)
	}
	w := &nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", recipient}}, Content: ct}
	if err := w.Sign(sk); err != nil {
		return nil, fmt.Errorf("ctxvmclient: wrap: %w", err)
	}
	return w, nil
}

// Unwrap opens a gift wrap for the holder of sk and returns the signed
// event inside; an inner event that is badly signed is ErrBadEvent.
func Unwrap(w *nostr.Event, sk string) (*nostr.Event, error) {
	ck, err := nip44.GenerateConversationKey(w.PubKey, sk)
	if err != nil {
		return nil, fmt.Errorf("ctxvmclient: unwrap: %w", err)
	}
	plain, err := nip44.Decrypt(w.Content, ck)
	if err != nil {
		return nil, fmt.Errorf("ctxvmclient: unwrap: %w", err)
	}
	var inner nostr.Event
	if err := json.Unmarshal([]byte(plain), &inner); err != nil {
		return nil, fmt.Errorf("ctxvmclient: unwrap: %w", err)
	}
	if ok, _ := inner.CheckSignature(); !ok || !inner.CheckID() {
		return nil, fmt.Errorf("%w: inner event badly signed", ErrBadEvent)
	}
	return &inner, nil
}

// Names calls a list method (tools/list, prompts/list) and returns the
// names of what the server lists, in its order.
func (c *Client) Names(ctx context.Context, method string, r Request) ([]string, error) {
	res, _, err := c.Call(ctx, method, nil, r)
	if err != nil {
		return nil, err
	}
	var lists map[string]json.RawMessage
	if err := json.Unmarshal(res, &lists); err != nil {
		return nil, fmt.Errorf("ctxvmclient: %s: %w", method, err)
	}
	var names []string
	for key, raw := range lists {
		if key == "nextCursor" || key == "_meta" {
			continue
		}
		var items []struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(raw, &items) == nil {
			for _, it := range items {
				names = append(names, it.Name)
			}
		}
	}
	return names, nil
}
