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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"
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
}

// Received is an event about a request: the server's event, unwrapped
// when it came gift wrapped (Wrapped then is its wrap's kind).
type Received struct {
	Event   *nostr.Event
	Wrapped int
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
			select {
			case ch <- Received{Event: in, Wrapped: wrapped}:
			default: // a waiter that stopped reading: dropped
			}
			return true
		}
	}
	return false
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
		if !p.c.opts.AssumeValid {
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
}

// Request sends the JSON-RPC request method(params) with a fresh id and
// returns its response and its event. params nil is sent as no params.
func (c *Client) Request(ctx context.Context, method string, params any, r Request) (Message, Received, error) {
	msg := map[string]any{"jsonrpc": "2.0", "id": c.ids.Add(1), "method": method}
	if params != nil {
		msg["params"] = params
	}
	body, err := json.Marshal(msg)
	if err != nil {
		return Message{}, Received{}, fmt.Errorf("ctxvmclient: %s: %w", method, err)
	}
	ev, err := c.Event(KindMessage, string(body), r.Tags...)
	if err != nil {
		return Message{}, Received{}, err
	}
	var wrap *nostr.Event
	if r.Wrap != 0 {
		if wrap, err = Wrap(*ev, c.Server, r.Wrap); err != nil {
			return Message{}, Received{}, err
		}
	}
	return c.Roundtrip(ctx, ev, wrap, r.OnNote)
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
