package ctxvm

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// bigVendor is fakeVendor with "big" {"kib"}: a text of kib KiB with
// every JSON escape and multi-byte characters (paid: payment_required
// and payment_accepted first), and "size" {"text"}: the text's length
// and SHA-256.
type bigVendor struct{ fakeVendor }

const bigBlock = "big \"q\" \\ <a&b>\t\n é€😀\u2028 0123456789abcdefghijklmnopqrstuvw\n" // 64 bytes

func bigText(kib int) string { return strings.Repeat(bigBlock, kib*16) }

func (b *bigVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	var args struct {
		KiB  int    `json:"kib"`
		Text string `json:"text"`
	}
	json.Unmarshal(r.Arguments, &args)
	switch r.Name {
	case "big":
		b.mu.Lock()
		b.calls = append(b.calls, r)
		b.mu.Unlock()
		r.Notify(vend.NotifyPaymentRequired, vend.PaymentOption{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, TTL: 600})
		r.Notify(vend.NotifyPaymentAccepted, map[string]any{"amount": 21, "pmi": vend.PMILightning})
		body, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": bigText(args.KiB)}}})
		return vend.CallResult{Body: body}, nil
	case "size":
		b.mu.Lock()
		b.calls = append(b.calls, r)
		b.mu.Unlock()
		r.Notify(vend.NotifyPaymentRequired, vend.PaymentOption{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, TTL: 600})
		sum := sha256.Sum256([]byte(args.Text))
		return vend.CallResult{Body: json.RawMessage(fmt.Sprintf(`{"content":[{"type":"text","text":"%d %x"}]}`, len(args.Text), sum))}, nil
	}
	return b.fakeVendor.CallItem(ctx, r)
}

// oversizedClient dials relay as a CEP-22 client of server.
func oversizedClient(t *testing.T, relay, server string) *ctxvmclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a deadlock guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, relay, server, ctxvmclient.Options{Oversized: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// bigCall calls big {kib} and returns its text, the notifications before
// it and how its answer came.
func bigCall(t *testing.T, c *ctxvmclient.Client, kib, wrap int, meta map[string]any) (string, []string, ctxvmclient.Received) {
	var tags nostr.Tags
	if wrap == KindEphemeralGiftWrap {
		tags = nostr.Tags{{tagEphemeral}} // answers in 21059 too
	}
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a deadlock guard
	defer cancel()
	params := map[string]any{"name": "big", "arguments": map[string]any{"kib": kib}}
	if meta != nil {
		params["_meta"] = meta
	}
	var notes []string
	m, rec, err := c.Request(ctx, "tools/call", params, ctxvmclient.Request{Wrap: wrap, Tags: tags, OnNote: func(m ctxvmclient.Message) error {
		notes = append(notes, m.Method)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Error != nil {
		t.Fatalf("big %d KiB: %v", kib, m.Error)
	}
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(m.Result, &res); err != nil || len(res.Content) != 1 {
		t.Fatalf("big %d KiB: result %.200s: %v", kib, m.Result, err)
	}
	return res.Content[0].Text, notes, rec
}

// TestOversizedAnswers: through a relay that takes no message over 64 KiB
// (and says so), answers of 1 MiB (plaintext, and in 21059 and 1059 gift
// wraps) and 4 MiB reach a CEP-22 client whole and byte-exact, as frames
// after the payment notifications; the relay never had to close our
// connection.
func TestOversizedAnswers(t *testing.T) {
	relay := testkit.LimitedRelay(t, 64<<10)
	logs := &syncbuf.Buffer{}
	s := startServer(t, relay, &bigVendor{}, func(c *Config) { c.Logger = debugLog(logs) })
	c := oversizedClient(t, relay, s.PublicKey())
	for _, tc := range []struct {
		kib, wrap int
	}{{1024, 0}, {1024, KindEphemeralGiftWrap}, {1024, KindGiftWrap}, {4096, 0}} {
		t.Run(fmt.Sprintf("%d KiB wrap %d", tc.kib, tc.wrap), func(t *testing.T) {
			text, notes, rec := bigCall(t, c, tc.kib, tc.wrap, nil)
			if text != bigText(tc.kib) {
				t.Fatalf("got %d bytes, not the %d KiB sent", len(text), tc.kib)
			}
			if rec.Frames < 3 || rec.Wrapped != tc.wrap {
				t.Fatalf("came in %d frames, wrapped %d", rec.Frames, rec.Wrapped)
			}
			t.Logf("%d KiB (wrap %d) in %d frames", tc.kib, tc.wrap, rec.Frames)
			if strings.Join(notes, ",") != vend.NotifyPaymentRequired+","+vend.NotifyPaymentAccepted {
				t.Fatalf("notifications %v", notes)
			}
		})
	}
	if strings.Contains(logs.String(), "subscription ended") {
		t.Fatalf("the relay closed a connection:\n%s", logs.String())
	}
	if st := s.PublishStats(); st.TransfersOut != 4 || st.Undelivered != 0 || st.Relays[0].Failed[ReasonConnection] != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func debugLog(w *syncbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestOversizedRequests: requests that come as frames, plaintext and
// gift wrapped, with chunks from progress 2 and from 3 (the stock client
// leaves 2 to an accept it does not wait for), more than the stock
// receiver's 21, in order and out of order, are served as one call: its
// RequestID and e tags are the end frame's, its pmi tags the start
// frame's, Public only when the frames came in plaintext.
func TestOversizedRequests(t *testing.T) {
	relay := testkit.Relay(t)
	v := &bigVendor{}
	s := startServer(t, relay, v, nil)
	c := oversizedClient(t, relay, s.PublicKey())
	text := strings.Repeat("é0123456789\"", 25_000) // 350 kB
	sum := sha256.Sum256([]byte(text))
	want := fmt.Sprintf("%d %x", len(text), sum)
	shuffled := func(n int) []int {
		// Out of order within a window of 40: shuffled blocks.
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		for i := 0; i < n; i += 20 {
			b := order[i:min(i+20, n)]
			rand.Shuffle(len(b), func(x, y int) { b[x], b[y] = b[y], b[x] })
		}
		return order
	}
	for _, tc := range []struct {
		name  string
		wrap  int
		split ctxvmclient.Split
	}{
		{"plaintext", 0, ctxvmclient.Split{}},
		{"plaintext, small chunks from 3", 0, ctxvmclient.Split{ChunkBytes: 8000, Handshake: true}},
		{"plaintext, out of order", 0, ctxvmclient.Split{ChunkBytes: 8000, Order: shuffled}},
		{"gift wrapped", KindEphemeralGiftWrap, ctxvmclient.Split{}},
		{"gift wrapped, from 3, out of order", KindGiftWrap, ctxvmclient.Split{ChunkBytes: 8000, Handshake: true, Order: shuffled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a deadlock guard
			defer cancel()
			split := tc.split
			var notes []ctxvmclient.Message
			m, rec, err := c.Request(ctx, "tools/call", map[string]any{"name": "size", "arguments": map[string]any{"text": text}},
				ctxvmclient.Request{Wrap: tc.wrap, Split: &split, Tags: nostr.Tags{{"pmi", vend.PMILightning}},
					OnNote: func(m ctxvmclient.Message) error { notes = append(notes, m); return nil }})
			if err != nil {
				t.Fatal(err)
			}
			if m.Error != nil || !strings.Contains(string(m.Result), want) {
				t.Fatalf("answer %s %v, want %s", m.Result, m.Error, want)
			}
			if len(notes) != 1 || notes[0].Method != vend.NotifyPaymentRequired {
				t.Fatalf("notifications %+v", notes)
			}
			got := v.lastCall()
			endID := rec.Event.Tags.Find("e")[1]
			if got.RequestID != endID || got.Client != c.PublicKey || got.Public != (tc.wrap == 0) ||
				strings.Join(got.PMIs, ",") != vend.PMILightning || len(got.ProgressToken) == 0 {
				t.Fatalf("call request %+v (end frame %s)", got, endID)
			}
		})
	}
	if n, b := s.recv.Load(); n != 0 || b != 0 {
		t.Fatalf("%d transfers holding %d bytes after they all completed", n, b)
	}
	if st := s.PublishStats(); st.TransfersIn != 5 || st.TransfersInFailed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestOversizedRequestFails: a split request whose frames do not add up
// gets a JSON-RPC error answer to its end frame (the stock client's
// request waits on it), not silence: a digest that does not match at
// once, a chunk that never comes once EndWait passed; a request over
// MaxRequestBytes is refused at its start. None reaches the Vendor.
func TestOversizedRequestFails(t *testing.T) {
	relay := testkit.Relay(t)
	v := &bigVendor{}
	logs := &syncbuf.Buffer{}
	s := startServer(t, relay, v, func(c *Config) { c.MaxRequestBytes, c.Logger = 200_000, debugLog(logs) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	c := oversizedClient(t, relay, s.PublicKey())
	id := 0
	body := func(n int) string {
		id++
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
			"params": map[string]any{"name": "size", "arguments": map[string]any{"text": strings.Repeat("x", n)}, "_meta": map[string]any{"progressToken": id}}})
		return string(b)
	}
	send := func(t *testing.T, frames []oversized.Frame) ctxvmclient.Message {
		t.Helper()
		var end *nostr.Event
		var evs []*nostr.Event
		for _, f := range frames {
			ev, err := c.Event(KindMessage, f.Content())
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
			end = ev
		}
		p := c.Expect(end.ID)
		defer p.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a deadlock guard
		defer cancel()
		for _, ev := range evs {
			if err := c.Publish(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		m, _, err := p.Answer(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	build := func(msg string) []oversized.Frame {
		chunks, err := oversized.Cut(msg, oversized.Limits{Message: 10_000}, func(d string) (oversized.Size, error) { return oversized.Size{Message: len(d)}, nil })
		if err != nil {
			t.Fatal(err)
		}
		return oversized.Build(msg, json.RawMessage(fmt.Sprint(id)), chunks, 2)
	}
	t.Run("digest", func(t *testing.T) {
		fs := build(body(50_000))
		fs[0].CVM.Digest = oversized.Digest([]byte("something else"))
		m := send(t, fs)
		if m.Error == nil || m.Error.Code != rpcerr.CodeInvalidRequest || !strings.Contains(m.Error.Message, "digest") {
			t.Fatalf("answer %+v", m)
		}
	})
	t.Run("missing chunk", func(t *testing.T) {
		fs := build(body(50_000))
		m := send(t, append(fs[:2:2], fs[3:]...))
		if m.Error == nil || m.Error.Code != rpcerr.CodeInvalidRequest || !strings.Contains(m.Error.Message, "chunks missing") {
			t.Fatalf("answer %+v", m)
		}
	})
	t.Run("too large", func(t *testing.T) {
		m := send(t, build(body(300_000)))
		if m.Error == nil || !strings.Contains(m.Error.Message, "over the receiver's limits") {
			t.Fatalf("answer %+v", m)
		}
	})
	if calls := len(v.calls); calls != 0 {
		t.Fatalf("%d calls reached the vendor", calls)
	}
	if st := s.PublishStats(); st.TransfersInFailed != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestUndeliverableAnswer: an answer too large for the relays to a client
// that cannot take frames (no progressToken) gets a small JSON-RPC error
// instead, at once: the relay advertises its limit, so the answer is not
// even sent to it. Counted as undelivered; the log says why.
func TestUndeliverableAnswer(t *testing.T) {
	relay := testkit.LimitedRelay(t, 64<<10)
	logs := &syncbuf.Buffer{}
	s := startServer(t, relay, &bigVendor{}, func(c *Config) { c.Logger = debugLog(logs) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a deadlock guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, relay, s.PublicKey(), ctxvmclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Call(ctx, "tools/call", map[string]any{"name": "big", "arguments": map[string]any{"kib": 1024}}, ctxvmclient.Request{})
	var rpc *ctxvmclient.Error
	if !errors.As(err, &rpc) || rpc.Code != rpcerr.CodeUndelivered || !strings.Contains(rpc.Message, "larger than the relays take") {
		t.Fatalf("got %v, want error %d", err, rpcerr.CodeUndelivered)
	}
	if st := s.PublishStats(); st.Undelivered != 1 || st.Relays[0].Failed[ReasonTooLarge] != 1 || st.Relays[0].MaxMessage != 64<<10 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(logs.String(), "over its max_message_length 65536") {
		t.Fatalf("log:\n%s", logs.String())
	}
}

// TestRefusingRelay: a relay that refuses every event of the server
// ("blocked: ..."): its refusals are logged with its reason (at Warn) and
// counted; an answer it refuses still goes by the other relay; an answer
// both refuse (one for its size) is replaced by a small error, which the
// client gets at once (a bound: well within PublishTimeout, no timeout);
// its last failure names its reason, and it is Refusing.
func TestRefusingRelay(t *testing.T) {
	const reason = "blocked: this relay takes no events of this key"
	refuserRelay := testkit.NewRelay()
	var server string
	refuserRelay.RejectEvent = append(refuserRelay.RejectEvent, func(_ context.Context, ev *nostr.Event) (bool, string) {
		return ev.PubKey == server || ev.Kind == KindGiftWrap || ev.Kind == KindEphemeralGiftWrap, reason
	})
	refuser := testkit.ServeRelay(t, refuserRelay)
	limited := testkit.LimitedRelay(t, 64<<10)
	logs := &syncbuf.Buffer{}
	sk := nostr.GeneratePrivateKey()
	server, _ = nostr.GetPublicKey(sk)
	s := startServer(t, limited, &bigVendor{}, func(c *Config) {
		c.SecretKey, c.Relays, c.Logger = sk, []string{refuser, limited}, debugLog(logs)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a deadlock guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, limited, s.PublicKey(), ctxvmclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Call(ctx, "tools/call", map[string]any{"name": "free", "arguments": map[string]any{"text": "hi"}}, ctxvmclient.Request{}); err != nil {
		t.Fatalf("an answer the other relay takes: %v", err)
	}
	start := time.Now()
	// 256 KiB: under khatru's own limit, which the refusing relay keeps
	// (a message over it would close the connection: a failure that may
	// pass, tried again until PublishTimeout).
	_, _, err = c.Call(ctx, "tools/call", map[string]any{"name": "big", "arguments": map[string]any{"kib": 256}}, ctxvmclient.Request{})
	var rpc *ctxvmclient.Error
	if !errors.As(err, &rpc) || rpc.Code != rpcerr.CodeUndelivered {
		t.Fatalf("got %v, want error %d", err, rpcerr.CodeUndelivered)
	}
	if d := time.Since(start); d > DefaultPublishTimeout {
		t.Fatalf("the error came after %s, over PublishTimeout", d)
	}
	st := s.PublishStats()
	ref := st.Relays[0]
	if ref.URL != refuser || ref.Failed[ReasonBlocked] == 0 || ref.LastRefusal != reason || !ref.Refusing || ref.Accepted != 0 {
		t.Fatalf("refusing relay %+v", ref)
	}
	if st.Relays[1].Refusing || st.Relays[1].Accepted == 0 {
		t.Fatalf("the other relay %+v", st.Relays[1])
	}
	if !strings.Contains(logs.String(), "level=WARN msg=\"nostr relay did not take our event\" relay="+refuser+" reason=\""+reason+"\"") {
		t.Fatalf("no warning naming the relay's reason:\n%s", logs.String())
	}
}

// TestPublishRetried: an event no relay took for a reason that may pass
// (rate-limited, no OK in time) is published again after a backoff,
// doubling, within PublishTimeout; one refused for good (invalid) is not;
// an answer that never went out is replaced by an error answer, and its
// replay (the same request event) gets the kept answer.
func TestPublishRetried(t *testing.T) {
	store := &memReplies{m: map[string][]byte{}}
	v := &fakeVendor{}
	s, out := recorder(t, func(c *Config) { c.Replies, c.Vendor = store, v })
	var slept []time.Duration
	s.sleep = func(_ context.Context, d time.Duration) { slept = append(slept, d) }
	record := s.publish
	fails := []string{ReasonRateLimited, ReasonTimeout}
	s.publish = func(ctx context.Context, ev nostr.Event) error {
		if len(fails) > 0 {
			class := fails[0]
			fails = fails[1:]
			return &PublishError{Failures: []RelayFailure{{URL: "ws://r", Class: class, Reason: class + ": try later"}}}
		}
		return record(ctx, ev)
	}
	sk := nostr.GeneratePrivateKey()
	call := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}},
		Content: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free","arguments":{"text":"kept"}}}`}
	call.Sign(sk)
	s.handle(context.Background(), call)
	if len(*out) != 1 || len(slept) != 2 || slept[0] != publishBackoff || slept[1] != 2*publishBackoff {
		t.Fatalf("%d answers after backoffs %v", len(*out), slept)
	}

	// Refused for good, then the error answer goes.
	fails = []string{ReasonInvalid}
	slept = nil
	call2 := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}},
		Content: `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"free","arguments":{"text":"again"}}}`}
	call2.Sign(sk)
	s.handle(context.Background(), call2)
	if len(slept) != 0 || len(*out) != 2 || !strings.Contains((*out)[1].Content, fmt.Sprint(rpcerr.CodeUndelivered)) ||
		(*out)[1].Tags.FindWithValue("e", call2.ID) == nil {
		t.Fatalf("after a refusal for good: slept %v, answers %v", slept, *out)
	}
	// The replay gets the kept answer; the tool ran once.
	s.handle(context.Background(), call2)
	if len(*out) != 3 || !strings.Contains((*out)[2].Content, "free:again") {
		t.Fatalf("replay answered %v", (*out)[2:])
	}
	if n := len(v.calls); n != 2 {
		t.Fatalf("the tool ran %d times, want 2", n)
	}
}
