package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// Tests run under -race like every package; the known data races inside
// go-nostr's Relay are suppressed by internal/racesupp (see TestMain in
// leak_test.go), nothing of capvend's.

// fakeVendor sells "free" (0), "paid" (21 sats, notifies payment_required
// then payment_accepted) and "gated" (always payment required).
type fakeVendor struct {
	mu     sync.Mutex
	calls  []vend.CallRequest
	signer []string        // vend.ClientPubkeyFrom the ctx of each call
	block  chan struct{}   // the tool "block" waits for it
	payers map[string]bool // pubkeys KnownPayer says paid before
}

func (f *fakeVendor) KnownPayer(client string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.payers[client]
}

func (f *fakeVendor) RecentPayers(n int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []string
	for k := range f.payers {
		keys = append(keys, k)
	}
	return keys[:min(n, len(keys))]
}

var fakeTools = []vend.Item{
	{Name: "free", Description: "free echo", InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)},
	{Name: "paid", Description: "paid echo", Price: 21_000},
	{Name: "gated", Price: 5_000},
}

func (f *fakeVendor) Tools() []vend.Item { return fakeTools }

func (f *fakeVendor) ListedPrice(t vend.Item) (lo, hi vend.Msat) { return t.Price, t.Price }

func (f *fakeVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, r)
	f.signer = append(f.signer, vend.ClientPubkeyFrom(ctx))
	f.mu.Unlock()
	var args struct {
		Text string `json:"text"`
	}
	json.Unmarshal(r.Arguments, &args)
	switch r.Name {
	case "free":
		return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"free:` + args.Text + `"}]}`)}, nil
	case "paid":
		r.Notify(vend.NotifyPaymentRequired, vend.PaymentOption{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, Description: "paid echo", TTL: 600})
		r.Notify(vend.NotifyPaymentAccepted, map[string]any{"amount": 21, "pmi": vend.PMILightning})
		return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"paid:` + args.Text + `"}]}`)}, nil
	case "rejected":
		r.Notify(vend.NotifyPaymentRejected, map[string]any{"amount": 21, "pmi": vend.PMILightning, "message": "the payment request expired unpaid"})
		return vend.CallResult{}, vend.ErrPaymentExpired
	case "progress":
		r.Notify(vend.NotifyProgress, map[string]any{"progressToken": r.ProgressToken, "progress": 1, "message": "waiting for payment"})
		return vend.CallResult{Body: json.RawMessage(`{"content":[]}`)}, nil
	case "await": // waits for a payment that the test makes (closing block)
		r.Notify(vend.NotifyPaymentRequired, vend.PaymentOption{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, Description: "await", TTL: 600})
		<-f.block
		return vend.CallResult{Body: json.RawMessage(`{"content":[]}`)}, nil
	case "block":
		<-f.block
		return vend.CallResult{Body: json.RawMessage(`{"content":[]}`)}, nil
	case "direct": // a Cashu token pays at once, as vend's cashu scheme (direct_test.go)
		return directCall(r)
	case "gated":
		return vend.CallResult{}, &vend.PaymentRequiredError{Options: []vend.PaymentOption{{Amount: 5, PayReq: "lnbcrt50n1fake", PMI: vend.PMILightning, Description: "gated", TTL: 600}}}
	}
	return vend.CallResult{}, vend.ErrUnknownTool
}

func (f *fakeVendor) lastCall() vend.CallRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startServer runs a Server on relay until the test ends.
func startServer(t *testing.T, relay string, v Vendor, mod func(*Config)) *Server {
	t.Helper()
	s, _ := startStoppable(t, relay, v, mod)
	return s
}

// startStoppable is startServer that also returns a function stopping the
// server (idempotent).
func startStoppable(t *testing.T, relay string, v Vendor, mod func(*Config)) (*Server, func()) {
	t.Helper()
	cfg := Config{Vendor: v, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{relay}, Name: "test server", FirstAnswerDelay: -1,
		About: "sells echoes", PMIs: []string{vend.PMILightning}, Logger: quietLog(), ShutdownGrace: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(30 * time.Second): // a deadlock guard, not a speed check
		t.Fatal("server never subscribed")
	}
	return s, stop
}

// client is the shared ContextVM client (internal/ctxvmclient) for a
// test: it keeps every event, in the relay's order, for next and expect,
// and fails the test where the client returns an error.
type client struct {
	t      *testing.T
	c      *ctxvmclient.Client
	sk, pk string
	server string
	events <-chan *nostr.Event
}

func newClient(t *testing.T, url, server string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a deadlock guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, url, server, ctxvmclient.Options{Events: true,
		Kinds: []int{KindMessage, KindGiftWrap, KindEphemeralGiftWrap, KindDVMCPResponse, KindDVMCPNotification, KindJobResult, KindJobFeedback}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, sk: c.SecretKey, pk: c.PublicKey, server: server, events: c.Events()}
}

// event returns a signed request event carrying content.
func (c *client) event(content string, tags ...nostr.Tag) *nostr.Event {
	ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: content,
		Tags: append(nostr.Tags{{"p", c.server}}, tags...)} // c.server, which a test may set after dialing
	if err := c.c.Sign(ev); err != nil {
		c.t.Fatal(err)
	}
	return ev
}

func (c *client) publish(ev *nostr.Event) {
	c.t.Helper()
	if err := c.tryPublish(ev); err != nil {
		c.t.Fatal(err)
	}
}

// tryPublish publishes ev and returns the relay's refusal, if any (khatru
// refuses an ephemeral event no one subscribed to).
func (c *client) tryPublish(ev *nostr.Event) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a deadlock guard
	defer cancel()
	return c.c.Publish(ctx, ev)
}

// send publishes a request and returns its event.
func (c *client) send(content string, tags ...nostr.Tag) *nostr.Event {
	c.t.Helper()
	ev := c.event(content, tags...)
	c.publish(ev)
	return ev
}

// next returns the next event for the client (unwrapped if it was a gift
// wrap, with wrapped set).
func (c *client) next() (ev *nostr.Event, wrapped bool) {
	c.t.Helper()
	select {
	case ev := <-c.events:
		if ev.Kind == KindGiftWrap {
			inner, err := ctxvmclient.Unwrap(ev, c.sk)
			if err != nil {
				c.t.Fatal(err)
			}
			return inner, true
		}
		return ev, false
	case <-time.After(30 * time.Second): // a deadlock guard
		c.t.Fatal("no event from the server")
	}
	return nil, false
}

// reply is a decoded server message.
type reply = ctxvmclient.Message

// expect reads the next event, checks it is the server's answer about req
// and decodes it.
func (c *client) expect(req *nostr.Event) (reply, *nostr.Event) {
	c.t.Helper()
	ev, _ := c.next()
	if ev.PubKey != c.server || ev.Kind != KindMessage {
		c.t.Fatalf("event from %s kind %d", ev.PubKey, ev.Kind)
	}
	if ok, _ := ev.CheckSignature(); !ok || !ev.CheckID() {
		c.t.Fatal("server event badly signed")
	}
	if ev.Tags.FindWithValue("p", c.pk) == nil || ev.Tags.FindWithValue("e", req.ID) == nil {
		c.t.Fatalf("tags %v lack p %s / e %s: %s", ev.Tags, c.pk, req.ID, ev.Content)
	}
	var r reply
	if err := json.Unmarshal([]byte(ev.Content), &r); err != nil {
		c.t.Fatal(err)
	}
	if r.JSONRPC != "2.0" {
		c.t.Fatalf("no jsonrpc: %s", ev.Content)
	}
	return r, ev
}

func hasTag(tags nostr.Tags, want ...string) bool {
	for _, t := range tags {
		if len(t) == len(want) && strings.Join(t, "\x00") == strings.Join(want, "\x00") {
			return true
		}
	}
	return false
}

func TestInitializeAndList(t *testing.T) {
	relay := testkit.Relay(t)
	s := startServer(t, relay, &fakeVendor{}, nil)
	c := newClient(t, relay, s.PublicKey())

	req := c.send(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	r, ev := c.expect(req)
	if string(r.ID) != "0" || r.Error != nil {
		t.Fatalf("initialize answer %s", ev.Content)
	}
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
		Capabilities    struct {
			Tools json.RawMessage `json:"tools"`
		} `json:"capabilities"`
		ServerInfo struct{ Name string } `json:"serverInfo"`
	}
	json.Unmarshal(r.Result, &init)
	if init.ProtocolVersion != "2025-11-25" || init.ServerInfo.Name != "test server" || init.Capabilities.Tools == nil {
		t.Errorf("initialize result %s", r.Result)
	}
	for _, want := range [][]string{{"name", "test server"}, {"about", "sells echoes"}, {"support_encryption"}, {"pmi", vend.PMILightning}} {
		if !hasTag(ev.Tags, want...) {
			t.Errorf("initialize answer lacks tag %v: %v", want, ev.Tags)
		}
	}

	// notifications/initialized gets no answer: the next event is the list's.
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	req = c.send(`{"jsonrpc":"2.0","id":"list-1","method":"tools/list","params":{}}`)
	r, ev = c.expect(req)
	if string(r.ID) != `"list-1"` {
		t.Fatalf("list answer %s", ev.Content)
	}
	var list struct {
		Tools []struct {
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"inputSchema"`
		} `json:"tools"`
	}
	json.Unmarshal(r.Result, &list)
	if len(list.Tools) != 3 || list.Tools[0].Name != "free" || !strings.Contains(string(list.Tools[0].InputSchema), `"text"`) ||
		string(list.Tools[1].InputSchema) != `{"type":"object"}` {
		t.Errorf("tools %s", r.Result)
	}
	if !hasTag(ev.Tags, "cap", "tool:paid", "21", "sats") || !hasTag(ev.Tags, "cap", "tool:gated", "5", "sats") {
		t.Errorf("list tags %v", ev.Tags)
	}
	if len(slices.Collect(ev.Tags.FindAll("cap"))) != 2 {
		t.Errorf("a cap tag for a free tool: %v", ev.Tags)
	}
	if ev.Tags.Find("name") != nil {
		t.Errorf("discovery tags again on the second answer: %v", ev.Tags)
	}
}

func TestCalls(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{}
	s := startServer(t, relay, v, nil)
	c := newClient(t, relay, s.PublicKey())

	t.Run("free", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free","arguments":{"text":"hi"}}}`)
		r, ev := c.expect(req)
		if string(r.Result) != `{"content":[{"type":"text","text":"free:hi"}]}` {
			t.Fatalf("answer %s", ev.Content)
		}
		if !hasTag(ev.Tags, "name", "test server") {
			t.Errorf("first answer lacks discovery tags: %v", ev.Tags)
		}
		got := v.lastCall()
		if got.Transport != Transport || got.Client != c.pk || got.RequestID != req.ID || got.Name != "free" ||
			string(got.Arguments) != `{"text":"hi"}` || got.Explicit || len(got.PMIs) != 0 {
			t.Errorf("call request %+v", got)
		}
	})
	t.Run("priced: notifications first", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"paid","arguments":{"text":"yo"},"_meta":{"progressToken":7,"capvend/cashu":"cashuBxyz","capvend/refund_invoice":"lnbcrt1refund"}}}`,
			nostr.Tag{"pmi", vend.PMILightning}, nostr.Tag{"pmi", "bitcoin-cashu-token"})
		var methods []string
		for range 2 {
			r, _ := c.expect(req)
			methods = append(methods, r.Method)
			if r.Method == vend.NotifyPaymentRequired && !strings.Contains(string(r.Params), `"pay_req":"lnbcrt210n1fake"`) {
				t.Errorf("payment_required params %s", r.Params)
			}
			if r.ID != nil {
				t.Errorf("notification with an id: %s", r.ID)
			}
		}
		if methods[0] != vend.NotifyPaymentRequired || methods[1] != vend.NotifyPaymentAccepted {
			t.Errorf("notifications %v", methods)
		}
		r, ev := c.expect(req)
		if string(r.ID) != "2" || string(r.Result) != `{"content":[{"type":"text","text":"paid:yo"}]}` {
			t.Fatalf("answer %s", ev.Content)
		}
		got := v.lastCall()
		if strings.Join(got.PMIs, ",") != vend.PMILightning+",bitcoin-cashu-token" || string(got.ProgressToken) != "7" || got.CashuToken != "cashuBxyz" ||
			got.RefundInvoice != "lnbcrt1refund" {
			t.Errorf("call request %+v", got)
		}
	})
	t.Run("explicit gating", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"gated"}}`, nostr.Tag{"payment_interaction", "explicit_gating"})
		r, ev := c.expect(req)
		if r.Error == nil || r.Error.Code != rpcerr.CodePaymentRequired || r.Error.Message != "Payment Required" ||
			!strings.Contains(ev.Content, `"payment_options":[{"amount":5,"pay_req":"lnbcrt50n1fake"`) || !strings.Contains(ev.Content, `"instructions"`) {
			t.Fatalf("answer %s", ev.Content)
		}
		if got := v.lastCall(); !got.Explicit || string(got.Arguments) != `{}` {
			t.Errorf("call request %+v", got)
		}
	})
	t.Run("unknown tool", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"nope"}}`)
		r, _ := c.expect(req)
		if r.Error == nil || r.Error.Code != rpcerr.CodeInvalidParams || r.Error.Message != "Unknown tool: nope" {
			t.Fatalf("answer %+v", r)
		}
	})
	t.Run("unknown method", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":5,"method":"logging/setLevel"}`)
		r, _ := c.expect(req)
		if r.Error == nil || r.Error.Code != rpcerr.CodeMethodNotFound || string(r.ID) != "5" {
			t.Fatalf("answer %+v", r)
		}
	})
	t.Run("ping", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":6,"method":"ping"}`)
		if r, _ := c.expect(req); string(r.Result) != `{}` {
			t.Fatalf("answer %+v", r)
		}
	})
}

// A relay that restarts is reconnected to and subscribed again by the
// server (go-nostr's pool retries after 3 s, then backs off).
func TestRelayRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the pool's reconnection (seconds)")
	}
	// Parallel: it waits seconds for the pool to reconnect, on a relay
	// and server of its own.
	t.Parallel()
	addr, stopRelay := testkit.StoppableRelay(t, "127.0.0.1:0")
	url := "ws://" + addr
	s := startServer(t, url, &fakeVendor{}, nil)
	c := newClient(t, url, s.PublicKey())
	req := c.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	c.expect(req)

	stopRelay()
	testkit.StoppableRelay(t, addr)
	c = newClient(t, url, s.PublicKey())
	for i := 0; ; i++ { // until the server is subscribed again
		req := c.event(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)
		if err := c.tryPublish(req); err != nil {
			if i > 600 { // a deadlock guard: a minute
				t.Fatalf("server never resubscribed: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if r, _ := c.expect(req); string(r.Result) != `{}` {
			t.Fatalf("answer %+v", r)
		}
		return
	}
}

// Beyond MaxInFlight requests, events are dropped unanswered.
func TestMaxInFlight(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{block: make(chan struct{})}
	logs := &syncbuf.Buffer{}
	s := startServer(t, relay, v, func(c *Config) {
		c.MaxInFlight = 1
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	c := newClient(t, relay, s.PublicKey())
	call := takeTheOnlySlot(v, logs, c)
	close(v.block)
	c.expect(call)         // fails on an answer to the dropped ping
	for len(s.slots) > 0 { // the call's handler returns after its answer is out
		time.Sleep(10 * time.Millisecond)
	}
	ping := c.send(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	c.expect(ping)
}

// takeTheOnlySlot has c start a call of the tool "block" (holding a server
// with MaxInFlight 1's only slot until v.block closes), then send a ping,
// and returns the call once the ping was dropped for want of a slot.
func takeTheOnlySlot(v *fakeVendor, logs *syncbuf.Buffer, c *client) *nostr.Event {
	call := c.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"block"}}`)
	for {
		v.mu.Lock()
		n := len(v.calls)
		v.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.send(`{"jsonrpc":"2.0","id":2,"method":"ping"}`) // no slot: dropped
	for !strings.Contains(logs.String(), "too many requests in flight") {
		time.Sleep(10 * time.Millisecond)
	}
	return call
}

// A request event seen again by a restarted server (same key) is the same
// call: same RequestID, same answers. (The ledger-backed Vendor then
// answers from the stored result; see internal/cli's contextvm test.)
func TestReplayAfterRestart(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{}
	sk := nostr.GeneratePrivateKey()
	withKey := func(c *Config) { c.SecretKey = sk }
	s, stop := startStoppable(t, relay, v, withKey)
	c := newClient(t, relay, s.PublicKey())
	req := c.send(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"paid","arguments":{"text":"again"}}}`)
	var first []string
	for range 3 {
		_, ev := c.expect(req)
		first = append(first, ev.Content)
	}
	stop()
	startServer(t, relay, v, withKey)
	c.publish(req) // the very same event
	for i := range 3 {
		if _, ev := c.expect(req); ev.Content != first[i] {
			t.Errorf("replay answer %d: %s, first %s", i, ev.Content, first[i])
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.calls) != 2 || v.calls[0].RequestID != req.ID || v.calls[1].RequestID != req.ID {
		t.Errorf("calls %+v", v.calls)
	}
}

func TestEncryption(t *testing.T) {
	relay := testkit.Relay(t)
	for _, mode := range []Encryption{EncryptionOptional, EncryptionRequired} {
		t.Run(string(mode), func(t *testing.T) {
			s := startServer(t, relay, &fakeVendor{}, func(c *Config) { c.Encryption = mode })
			c := newClient(t, relay, s.PublicKey())

			inner := c.event(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"paid","arguments":{"text":"secret"}}}`)
			c.publish(wrapFor(t, *inner, s.PublicKey()))
			for i := range 3 {
				ev, wrapped := c.next()
				if !wrapped || ev.PubKey != s.PublicKey() || ev.Tags.FindWithValue("e", inner.ID) == nil {
					t.Fatalf("event %d: wrapped %v %v", i, wrapped, ev)
				}
				if i == 2 && !strings.Contains(ev.Content, "paid:secret") {
					t.Errorf("answer %s", ev.Content)
				}
			}

			req := c.send(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)
			r, _ := c.expect(req) // fails if the answer was wrapped
			if mode == EncryptionRequired {
				if r.Error == nil || r.Error.Code != rpcerr.CodeInvalidRequest || r.Error.Message != "Encryption required" {
					t.Errorf("plaintext answered %+v", r)
				}
			} else if string(r.Result) != `{}` {
				t.Errorf("plaintext answered %+v", r)
			}
		})
	}
}

// wrapFor wraps a signed event for recipient the way ContextVM clients do.
func wrapFor(t testing.TB, ev nostr.Event, recipient string) *nostr.Event {
	return wrapKind(t, ev, recipient, KindGiftWrap)
}

// wrapKind is wrapFor in a gift wrap of kind (1059 or 21059).
func wrapKind(t testing.TB, ev nostr.Event, recipient string, kind int) *nostr.Event {
	w, err := ctxvmclient.Wrap(ev, recipient, kind)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// recorder is a Server whose publications are recorded instead of sent.
func recorder(t testing.TB, mod func(*Config)) (*Server, *[]nostr.Event) {
	cfg := Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://127.0.0.1:1"}, Logger: quietLog(), FirstAnswerDelay: -1,
		MaxContentBytes: 1 << 10}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out []nostr.Event
	s.publish = func(_ context.Context, ev nostr.Event) error {
		mu.Lock()
		defer mu.Unlock()
		out = append(out, ev)
		return nil
	}
	return s, &out
}

func TestDropped(t *testing.T) {
	s, out := recorder(t, nil)
	sk := nostr.GeneratePrivateKey()
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	signed := func(mod func(*nostr.Event)) *nostr.Event {
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: ping, Tags: nostr.Tags{{"p", s.PublicKey()}}}
		if mod != nil {
			mod(ev)
		}
		ev.Sign(sk)
		return ev
	}
	other := nostr.GeneratePrivateKey()
	otherPK, _ := nostr.GetPublicKey(other)
	for _, tc := range []struct {
		name string
		ev   *nostr.Event
		want error
	}{
		{"bad signature", func() *nostr.Event { e := signed(nil); e.Sig = strings.Repeat("0", 128); return e }(), ErrBadEvent},
		{"signature of another event", func() *nostr.Event {
			e := signed(nil)
			e.Sig = signed(func(e *nostr.Event) { e.Content = "{}" }).Sig
			return e
		}(), ErrBadEvent},
		{"content changed after signing", func() *nostr.Event {
			e := signed(nil)
			e.Content = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
			return e
		}(), ErrBadEvent},
		{"id changed", func() *nostr.Event { e := signed(nil); e.ID = strings.Repeat("a", 64); return e }(), ErrBadEvent},
		{"pubkey changed", func() *nostr.Event { e := signed(nil); e.PubKey = otherPK; return e }(), ErrBadEvent},
		{"too old", signed(func(e *nostr.Event) { e.CreatedAt -= 6 * 60 }), ErrStale},
		{"too new", signed(func(e *nostr.Event) { e.CreatedAt += 6 * 60 }), ErrStale},
		{"oversized", signed(func(e *nostr.Event) {
			e.Content = `{"jsonrpc":"2.0","id":1,"method":"ping","x":"` + strings.Repeat("x", 1<<10) + `"}`
		}), ErrTooLarge},
		{"method tag lies", signed(func(e *nostr.Event) { e.Tags = append(e.Tags, nostr.Tag{"method", "tools/list"}) }), ErrTagMismatch},
		{"rev1.1 not an object", signed(func(e *nostr.Event) { e.Content = `"ping"`; e.Tags = append(e.Tags, nostr.Tag{"method", "ping"}) }), ErrNotJSONRPC},
		{"job without c tag", signed(func(e *nostr.Event) { e.Kind = KindJobRequest }), ErrNotJob},
		{"job not json", signed(func(e *nostr.Event) {
			e.Kind = KindJobRequest
			e.Content = "{"
			e.Tags = append(e.Tags, nostr.Tag{"c", "execute-tool"})
		}), ErrNotJSONRPC},
		{"jsonrpc 1.0", signed(func(e *nostr.Event) { e.Content = `{"jsonrpc":"1.0","id":1,"method":"ping"}` }), ErrNotJSONRPC},
		{"not json", signed(func(e *nostr.Event) { e.Content = `ping` }), ErrNotJSONRPC},
		{"two messages", signed(func(e *nostr.Event) { e.Content = ping + ping }), ErrNotJSONRPC},
		{"object id", signed(func(e *nostr.Event) { e.Content = `{"jsonrpc":"2.0","id":{},"method":"ping"}` }), ErrNotJSONRPC},
		{"not for us", signed(func(e *nostr.Event) { e.Tags = nostr.Tags{{"p", otherPK}} }), ErrNotForUs},
		{"other kind", signed(func(e *nostr.Event) { e.Kind = 1 }), ErrWrongKind},
		{"wrap of garbage", func() *nostr.Event {
			w := wrapFor(t, *signed(nil), s.PublicKey())
			w.Content = "AAAA" + w.Content[4:]
			w.Sign(other)
			return w
		}(), ErrUndecryptab},
		{"wrap of a badly signed event", wrapFor(t, *func() *nostr.Event { e := signed(nil); e.Sig = strings.Repeat("0", 128); return e }(), s.PublicKey()), ErrBadEvent},
		{"wrap of a stale event", wrapFor(t, *signed(func(e *nostr.Event) { e.CreatedAt -= 3600 }), s.PublicKey()), ErrStale},
		{"wrap for someone else", wrapFor(t, *signed(nil), otherPK), ErrUndecryptab},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.parse(tc.ev); !errors.Is(err, tc.want) {
				t.Errorf("parse: %v, want %v", err, tc.want)
			}
			s.handle(context.Background(), tc.ev)
			if len(*out) != 0 {
				t.Fatalf("answered: %v", *out)
			}
		})
	}
	t.Run("no answer to notifications and responses", func(t *testing.T) {
		for _, content := range []string{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `{"jsonrpc":"2.0","id":1,"result":{}}`, `{"jsonrpc":"2.0","id":null,"method":"ping"}`} {
			s.handle(context.Background(), signed(func(e *nostr.Event) { e.Content = content }))
		}
		if len(*out) != 0 {
			t.Fatalf("answered: %v", *out)
		}
	})
	t.Run("disabled encryption ignores wraps", func(t *testing.T) {
		d, out := recorder(t, func(c *Config) { c.Encryption = EncryptionDisabled })
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: ping, Tags: nostr.Tags{{"p", d.PublicKey()}}}
		ev.Sign(sk)
		d.handle(context.Background(), wrapFor(t, *ev, d.PublicKey()))
		if len(*out) != 0 {
			t.Fatalf("answered: %v", *out)
		}
		d.handle(context.Background(), ev)
		if len(*out) != 1 {
			t.Fatalf("plaintext ping: %d answers", len(*out))
		}
	})
	t.Run("gift wrap stored before the start", func(t *testing.T) {
		s.started = nostr.Now()
		defer func() { s.started = 0 }()
		w := wrapFor(t, *signed(nil), s.PublicKey())
		w.CreatedAt = s.started - 1
		w.Sign(other)
		if _, err := s.parse(w); !errors.Is(err, ErrBeforeStart) {
			t.Errorf("parse: %v", err)
		}
	})
	t.Run("a good ping is answered", func(t *testing.T) {
		s.handle(context.Background(), signed(nil))
		if len(*out) != 1 || !strings.Contains((*out)[0].Content, `"result":{}`) {
			t.Fatalf("answers: %v", *out)
		}
	})
}

func TestToWire(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{vend.ErrUnknownTool, -32602, "Unknown tool: x"},
		{&vend.InvalidParamsError{Tool: "x", Reason: "text is required"}, -32602, "Invalid params: text is required"},
		{&vend.PaymentRequiredError{}, -32042, "Payment Required"},
		{&vend.PaymentPendingError{RetryAfter: 3}, -32043, "Payment Pending"},
		{fmt.Errorf("wrapped: %w", vend.ErrPaymentExpired), -32050, "Payment expired"},
		{vend.ErrPaymentFailed, -32051, "Payment failed"},
		{vend.ErrNoPaymentMethod, -32052, "No payment method in common"},
		{vend.ErrLimit, -32053, "Limit reached"},
		{vend.ErrUpstream, -32054, "Upstream server failed"},
		{errors.New("database /secret/path locked"), -32603, "Internal error"},
	} {
		w := toWire(tc.err, "x")
		if w.Code != tc.code || w.Message != tc.msg {
			t.Errorf("%v: %+v", tc.err, w)
		}
	}
	b, _ := json.Marshal(toWire(&vend.PaymentPendingError{RetryAfter: 3}, "x"))
	if !strings.Contains(string(b), `"retry_after":3`) || !strings.Contains(string(b), `"instructions"`) {
		t.Errorf("pending data %s", b)
	}
	b, _ = json.Marshal(toWire(&vend.PaymentRequiredError{}, "x"))
	if !strings.Contains(string(b), `"payment_options":[]`) {
		t.Errorf("required data %s", b)
	}
}

func TestNewRejects(t *testing.T) {
	good := Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://127.0.0.1:1"}}
	for name, mod := range map[string]func(*Config){
		"no vendor":   func(c *Config) { c.Vendor = nil },
		"no relays":   func(c *Config) { c.Relays = nil },
		"bad key":     func(c *Config) { c.SecretKey = "nsec1abc" },
		"encryption":  func(c *Config) { c.Encryption = "sometimes" },
		"negative":    func(c *Config) { c.Window = -1 },
		"zero secret": func(c *Config) { c.SecretKey = strings.Repeat("0", 64) },
	} {
		c := good
		mod(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		} else if c.SecretKey != "" && len(c.SecretKey) > 10 && strings.Contains(err.Error(), c.SecretKey) {
			t.Errorf("%s: error quotes the key", name)
		}
	}
	if _, err := New(good); err != nil {
		t.Fatal(err)
	}
}

// The shared client's kinds are the server's.
func TestClientKinds(t *testing.T) {
	if ctxvmclient.KindMessage != KindMessage || ctxvmclient.KindGiftWrap != KindGiftWrap || ctxvmclient.KindEphemeralGiftWrap != KindEphemeralGiftWrap {
		t.Fatal("internal/ctxvmclient's kinds differ from the server's")
	}
}
