package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// elicitVendor is fakeVendor with the tool "ask", which asks the client
// (r.Elicit) with askParams and returns the answer as its text, or
// "failed" (the error is kept).
type elicitVendor struct {
	fakeVendor
	mu   sync.Mutex
	errs []error
	nils int // calls without an Elicit
}

const askParams = `{"message":"Delete everything?","requestedSchema":{"type":"object","properties":{"confirm":{"type":"boolean"}},"required":["confirm"]}}`

func (v *elicitVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	if r.Name != "ask" {
		return v.fakeVendor.CallItem(ctx, r)
	}
	if r.Elicit == nil {
		v.mu.Lock()
		v.nils++
		v.mu.Unlock()
		return textResult("no elicit"), nil
	}
	ans, err := r.Elicit(ctx, json.RawMessage(askParams))
	if err != nil {
		v.mu.Lock()
		v.errs = append(v.errs, err)
		v.mu.Unlock()
		return textResult("failed"), nil
	}
	return textResult(string(ans)), nil
}

func (v *elicitVendor) lastErr() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs[len(v.errs)-1]
}

func textResult(s string) vend.CallResult {
	b, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": s}}})
	return vend.CallResult{Body: b}
}

// resultText is the text of a tools/call result made by textResult.
func resultText(t *testing.T, r reply) string {
	t.Helper()
	var res struct {
		Content []struct{ Text string } `json:"content"`
	}
	if r.Error != nil || json.Unmarshal(r.Result, &res) != nil || len(res.Content) != 1 {
		t.Fatalf("tools/call answer %s %+v", r.Result, r.Error)
	}
	return res.Content[0].Text
}

const (
	initElicit   = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}}`
	initNoElicit = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
)

// askSeq numbers the calls of "ask": the same content in the same second
// would be the same event, dropped as a duplicate.
var askSeq atomic.Int64

// callAsk is a new tools/call of "ask" (its JSON-RPC id is 7 + a number).
func callAsk() string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ask"}}`, 7+askSeq.Add(1))
}

var hex64 = regexp.MustCompile(`^"[0-9a-f]{64}"$`)

// expectElicit reads the server's elicitation/create about call and
// checks its form; it returns the request's id (JSON).
func (c *client) expectElicit(call *nostr.Event) string {
	c.t.Helper()
	r, ev := c.expect(call)
	if r.Method != methodElicit || !hex64.MatchString(string(r.ID)) || r.Result != nil || r.Error != nil {
		c.t.Fatalf("not an elicitation request: %s", ev.Content)
	}
	var got, want any
	json.Unmarshal(r.Params, &got)
	json.Unmarshal([]byte(askParams), &want)
	if b1, _ := json.Marshal(got); string(b1) != func() string { b2, _ := json.Marshal(want); return string(b2) }() {
		c.t.Errorf("params %s, want %s", r.Params, askParams)
	}
	if len(ev.Tags) != 2 {
		c.t.Errorf("tags %v: want only p and e", ev.Tags)
	}
	return string(r.ID)
}

// respond is the content of a JSON-RPC response with id (JSON) and result.
func respond(id, result string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"result":` + result + `}`
}

// waitLog waits until logs contains s.
func waitLog(t *testing.T, logs *syncbuf.Buffer, s string) { t.Helper(); waitCount(t, logs, s, 1) }

// waitCount waits until logs contains s n times.
func waitCount(t *testing.T, logs *syncbuf.Buffer, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a deadlock guard
	for strings.Count(logs.String(), s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("logged %q fewer than %d times", s, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestElicitation(t *testing.T) {
	relay := testkit.Relay(t)
	v := &elicitVendor{}
	logs := &syncbuf.Buffer{}
	s := startServer(t, relay, v, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.ElicitTimeout = 2 * time.Second
	})
	c := newClient(t, relay, s.PublicKey())
	c.ask(t, initElicit)

	t.Run("accept", func(t *testing.T) {
		call := c.send(callAsk())
		id := c.expectElicit(call)
		c.send(respond(id, `{"action":"accept","content":{"confirm":true},"_meta":{"x":1}}`))
		r, _ := c.expect(call)
		if got := resultText(t, r); got != `{"action":"accept","content":{"confirm":true}}` {
			t.Errorf("answer %s", got)
		}
		if string(r.ID) == "" || !strings.Contains(call.Content, `"id":`+string(r.ID)+`,`) {
			t.Errorf("id %s", r.ID)
		}
	})
	t.Run("decline", func(t *testing.T) {
		call := c.send(callAsk())
		id := c.expectElicit(call)
		c.send(respond(id, `{"action":"decline","content":{"confirm":true}}`))
		if got := resultText(t, first(c.expect(call))); got != `{"action":"decline"}` {
			t.Errorf("answer %s", got)
		}
	})
	t.Run("the client answers with an error", func(t *testing.T) {
		call := c.send(callAsk())
		id := c.expectElicit(call)
		c.send(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-1,"message":"no"}}`)
		if got := resultText(t, first(c.expect(call))); got != "failed" || !errors.Is(v.lastErr(), errElicitRefused) {
			t.Errorf("answer %s, err %v", got, v.lastErr())
		}
	})
	t.Run("not an ElicitResult", func(t *testing.T) {
		call := c.send(callAsk())
		id := c.expectElicit(call)
		c.send(respond(id, `{"action":"maybe"}`))
		if got := resultText(t, first(c.expect(call))); got != "failed" || !errors.Is(v.lastErr(), errElicitAnswer) {
			t.Errorf("answer %s, err %v", got, v.lastErr())
		}
	})
	t.Run("another pubkey and unknown ids are ignored", func(t *testing.T) {
		intruder := newClient(t, relay, s.PublicKey())
		call := c.send(callAsk())
		id := c.expectElicit(call)
		logged := strings.Count(logs.String(), "no elicitation of this client waits for it")
		intruder.send(respond(id, `{"action":"accept","content":{"confirm":true}}`))
		c.send(respond(`"`+strings.Repeat("ab", 32)+`"`, `{"action":"accept","content":{"confirm":true}}`))
		c.send(respond(`1`, `{"action":"accept","content":{"confirm":true}}`))
		waitCount(t, logs, "no elicitation of this client waits for it", logged+2)
		waitLog(t, logs, "nostr response dropped: not ours")
		c.send(respond(id, `{"action":"cancel"}`))
		if got := resultText(t, first(c.expect(call))); got != `{"action":"cancel"}` {
			t.Errorf("answer %s", got)
		}
		// Answered: the same answer again is not taken.
		c.send(respond(id, `{"action":"accept","content":{"confirm":true}}`))
		waitCount(t, logs, "no elicitation of this client waits for it", logged+3)
	})
	t.Run("timeout", func(t *testing.T) {
		call := c.send(callAsk())
		c.expectElicit(call)
		if got := resultText(t, first(c.expect(call))); got != "failed" || !errors.Is(v.lastErr(), errElicitTimeout) {
			t.Errorf("answer %s, err %v", got, v.lastErr())
		}
		if n := s.elicits.pending(); n != 0 {
			t.Errorf("%d elicitations still pending", n)
		}
	})
	t.Run("encrypted call, encrypted elicitation", func(t *testing.T) {
		inner := c.event(callAsk())
		c.publish(wrapFor(t, *inner, s.PublicKey()))
		ev, wrapped := c.next()
		var r reply
		json.Unmarshal([]byte(ev.Content), &r)
		if !wrapped || ev.PubKey != s.PublicKey() || r.Method != methodElicit || ev.Tags.FindWithValue("e", inner.ID) == nil ||
			ev.Tags.FindWithValue("p", c.pk) == nil {
			t.Fatalf("elicitation wrapped %v: %v", wrapped, ev)
		}
		ans := c.event(respond(string(r.ID), `{"action":"accept","content":{"confirm":false}}`))
		c.publish(wrapFor(t, *ans, s.PublicKey()))
		ev, wrapped = c.next()
		json.Unmarshal([]byte(ev.Content), &r)
		if !wrapped || ev.Tags.FindWithValue("e", inner.ID) == nil {
			t.Fatalf("answer wrapped %v: %v", wrapped, ev)
		}
		if got := resultText(t, r); got != `{"action":"accept","content":{"confirm":false}}` {
			t.Errorf("answer %s", got)
		}
	})
	t.Run("stale answer is dropped", func(t *testing.T) {
		call := c.send(callAsk())
		id := c.expectElicit(call)
		// From the future: relays filter the past out by the server's since.
		old := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now() + 3600, Content: respond(id, `{"action":"accept"}`),
			Tags: nostr.Tags{{"p", s.PublicKey()}}}
		old.Sign(c.sk)
		c.publish(old)
		waitLog(t, logs, ErrStale.Error())
		c.send(respond(id, `{"action":"decline"}`))
		if got := resultText(t, first(c.expect(call))); got != `{"action":"decline"}` {
			t.Errorf("answer %s", got)
		}
	})
	if n := s.elicits.pending(); n != 0 {
		t.Errorf("%d elicitations still pending", n)
	}
}

func first(r reply, _ *nostr.Event) reply { return r }

// A client that did not declare the elicitation capability, and a DVMCP
// client, are never asked: the upstream is declined, or has no Elicit.
func TestElicitationNotAsked(t *testing.T) {
	relay := testkit.Relay(t)
	v := &elicitVendor{}
	s := startServer(t, relay, v, nil)
	c := newClient(t, relay, s.PublicKey())
	// No initialize at all, then one without the capability.
	for _, init := range []string{"", initNoElicit} {
		if init != "" {
			c.ask(t, init)
		}
		call := c.send(callAsk())
		if got := resultText(t, first(c.expect(call))); got != `{"action":"decline"}` {
			t.Errorf("answer %s", got)
		}
	}
	// Declared, then an initialize without it again.
	c.ask(t, initElicit)
	call := c.send(callAsk())
	c.send(respond(c.expectElicit(call), `{"action":"decline"}`))
	c.expect(call)
	c.ask(t, strings.Replace(initNoElicit, `"id":0`, `"id":1`, 1)) // a new event
	call2 := c.send(callAsk())
	for {
		r, _ := c.expect(call2)
		if r.Method == "" {
			if got := resultText(t, r); got != `{"action":"decline"}` {
				t.Errorf("answer %s", got)
			}
			break
		}
		t.Fatalf("asked again: %+v", r)
	}
	// A DVMCP rev1 call gets no Elicit.
	c.send(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"ask"}}`, nostr.Tag{"method", "tools/call"})
	for {
		ev, _ := c.next()
		if ev.Kind == KindDVMCPResponse {
			break
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.nils != 1 {
		t.Errorf("%d calls without an Elicit, want 1", v.nils)
	}
}

func TestElicitationsBounded(t *testing.T) {
	var e elicitations
	for i := range maxElicitsPerClient {
		if _, err := e.add(string(rune('a'+i)), "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.add("z", "alice"); !errors.Is(err, errElicitLimit) {
		t.Fatalf("add beyond the client's bound: %v", err)
	}
	if e.take("a", "bob") != nil || e.pending() != maxElicitsPerClient {
		t.Fatal("bob took alice's elicitation")
	}
	if e.take("a", "alice") == nil || e.take("a", "alice") != nil {
		t.Fatal("take is not once")
	}
	if _, err := e.add("z", "alice"); err != nil {
		t.Fatalf("add after a take: %v", err)
	}
	for i := e.pending(); i < maxElicits; i++ {
		if _, err := e.add(string(rune(1000+i)), string(rune(5000+i/maxElicitsPerClient))); err != nil {
			t.Fatal(i, err)
		}
	}
	if _, err := e.add("last", "carol"); !errors.Is(err, errElicitLimit) {
		t.Fatalf("add beyond the overall bound: %v", err)
	}
}

func TestElicitResult(t *testing.T) {
	for _, tc := range []struct {
		result, err, want string
		fails             error
	}{
		{`{"action":"accept","content":{"a":1}}`, "", `{"action":"accept","content":{"a":1}}`, nil},
		{`{"action":"accept"}`, "", `{"action":"accept"}`, nil},
		{`{"action":"accept","content":null}`, "", `{"action":"accept"}`, nil},
		{`{"action":"cancel","content":{"a":1}}`, "", `{"action":"cancel"}`, nil},
		{`{"action":"accept","content":[1]}`, "", "", errElicitAnswer},
		{`{"action":""}`, "", "", errElicitAnswer},
		{`[]`, "", "", errElicitAnswer},
		{``, "", "", errElicitAnswer},
		{``, `{"code":1,"message":"x"}`, "", errElicitRefused},
		{`{"action":"accept"}`, `{"code":1,"message":"x"}`, "", errElicitRefused},
	} {
		got, err := elicitResult(message{Result: json.RawMessage(tc.result), Error: json.RawMessage(tc.err)})
		if !errors.Is(err, tc.fails) || string(got) != tc.want {
			t.Errorf("%s %s: %s %v", tc.result, tc.err, got, err)
		}
	}
}

// The elicitation round trip without a relay (handle called directly, as
// Run does, publications recorded): race-detector clean, unlike go-nostr's
// Relay.
func TestElicitationRecorded(t *testing.T) {
	v := &elicitVendor{}
	s, out := recorder(t, func(c *Config) { c.Vendor = v; c.MaxContentBytes = 0; c.ElicitTimeout = time.Minute })
	var mu sync.Mutex
	s.publish = func(_ context.Context, ev nostr.Event) error {
		mu.Lock()
		defer mu.Unlock()
		*out = append(*out, ev)
		return nil
	}
	published := func(n int) []nostr.Event {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second) // a deadlock guard
		for {
			mu.Lock()
			evs := slices.Clone(*out)
			mu.Unlock()
			if len(evs) >= n {
				return evs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d events published, want %d", len(evs), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	sk := nostr.GeneratePrivateKey()
	event := func(content string) *nostr.Event {
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: content, Tags: nostr.Tags{{"p", s.PublicKey()}}}
		ev.Sign(sk)
		return ev
	}
	ctx := context.Background()
	s.handle(ctx, event(initElicit))
	const calls = 3 // at once, answered in reverse order
	var wg sync.WaitGroup
	reqs := make([]*nostr.Event, calls)
	for i := range calls {
		reqs[i] = event(callAsk())
		wg.Add(1)
		go func() { defer wg.Done(); s.handle(ctx, reqs[i]) }()
	}
	asks := map[string]string{} // call event id -> elicitation id
	for _, ev := range published(1 + calls)[1:] {
		var r reply
		json.Unmarshal([]byte(ev.Content), &r)
		if r.Method != methodElicit {
			t.Fatalf("not an elicitation: %s", ev.Content)
		}
		asks[ev.Tags.Find("e")[1]] = string(r.ID)
	}
	for i := calls - 1; i >= 0; i-- {
		s.handle(ctx, event(respond(asks[reqs[i].ID], fmt.Sprintf(`{"action":"accept","content":{"n":%d}}`, i))))
	}
	wg.Wait()
	for _, ev := range published(1 + 2*calls)[1+calls:] {
		var r reply
		json.Unmarshal([]byte(ev.Content), &r)
		for i, req := range reqs {
			if ev.Tags.FindWithValue("e", req.ID) != nil {
				if got := resultText(t, r); got != fmt.Sprintf(`{"action":"accept","content":{"n":%d}}`, i) {
					t.Errorf("call %d answered %s", i, got)
				}
			}
		}
	}
	if n := s.elicits.pending(); n != 0 {
		t.Errorf("%d elicitations pending", n)
	}
}
