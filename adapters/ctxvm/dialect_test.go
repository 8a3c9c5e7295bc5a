package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"
	"github.com/nbd-wtf/go-nostr/nip59"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// rec drives a recorder Server with requests of one client.
type rec struct {
	t      testing.TB
	s      *Server
	v      *fakeVendor
	out    *[]nostr.Event
	seen   int
	sk, pk string
}

func newRec(t testing.TB, mod func(*Config)) *rec {
	v := &fakeVendor{}
	s, out := recorder(t, func(c *Config) {
		c.Vendor = v
		c.MaxContentBytes = 16 << 10
		if mod != nil {
			mod(c)
		}
	})
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	return &rec{t: t, s: s, v: v, out: out, sk: sk, pk: pk}
}

// event returns a request signed by the client, tagged p with the server.
func (r *rec) event(kind int, content string, tags ...nostr.Tag) *nostr.Event {
	ev := &nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Content: content, Tags: append(nostr.Tags{{"p", r.s.PublicKey()}}, tags...)}
	if err := ev.Sign(r.sk); err != nil {
		r.t.Fatal(err)
	}
	return ev
}

// handle serves ev and returns what the server published about it.
func (r *rec) handle(ev *nostr.Event) []nostr.Event {
	r.s.handle(context.Background(), ev)
	got := (*r.out)[r.seen:]
	r.seen = len(*r.out)
	for _, e := range got {
		if ok, _ := e.CheckSignature(); !ok || !e.CheckID() {
			r.t.Fatalf("published a badly signed event %v", e)
		}
	}
	return got
}

// correlated checks that ev answers req: tagged p with the client and e
// with the request.
func correlated(t testing.TB, ev nostr.Event, client, reqID string) {
	t.Helper()
	if ev.Tags.FindWithValue("p", client) == nil || ev.Tags.FindWithValue("e", reqID) == nil {
		t.Errorf("kind %d tags %v lack p %s / e %s", ev.Kind, ev.Tags, client, reqID)
	}
}

func kinds(evs []nostr.Event) []int {
	var k []int
	for _, e := range evs {
		k = append(k, e.Kind)
	}
	return k
}

func TestParseMessage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		tags    nostr.Tags
		want    dialect
		err     error
	}{
		{"contextvm", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nil, dialectContextVM, nil},
		{"contextvm with an s tag", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nostr.Tags{{"s", "srv"}}, dialectContextVM, nil},
		{"rev1", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nostr.Tags{{"method", "ping"}, {"s", "srv"}}, dialectRev1, nil},
		{"rev1.1", `{"method":"ping"}`, nostr.Tags{{"method", "ping"}}, dialectRev11, nil},
		{"rev1.1 without method tag", `{"method":"tools/list","params":{}}`, nil, dialectRev11, nil},
		{"method tag differs", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nostr.Tags{{"method", "tools/call"}}, 0, ErrTagMismatch},
		{"empty method tag", `{"method":"ping"}`, nostr.Tags{{"method"}}, 0, ErrTagMismatch},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, nostr.Tags{{"method", "ping"}}, 0, ErrNotJSONRPC},
		{"array", `[{"method":"ping"}]`, nil, 0, ErrNotJSONRPC},
		{"null", `null`, nil, 0, ErrNotJSONRPC},
		{"string", ` "ping"`, nil, 0, ErrNotJSONRPC},
		{"trailing data", `{"method":"ping"}{}`, nil, 0, ErrNotJSONRPC},
		{"object id", `{"id":{},"method":"ping"}`, nil, 0, ErrNotJSONRPC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, m, err := parseMessage(&nostr.Event{Content: tc.content, Tags: tc.tags})
			if !errors.Is(err, tc.err) || (err == nil && d != tc.want) {
				t.Fatalf("dialect %v err %v, want %v %v", d, err, tc.want, tc.err)
			}
			if err == nil && m.Method == "" {
				t.Errorf("no method: %+v", m)
			}
		})
	}
}

func TestRev1(t *testing.T) {
	r := newRec(t, nil)
	list := r.event(KindMessage, `{"jsonrpc":"2.0","id":"l","method":"tools/list"}`, nostr.Tag{"method", "tools/list"}, nostr.Tag{"s", "srv"})
	got := r.handle(list)
	if len(got) != 1 || got[0].Kind != KindDVMCPResponse {
		t.Fatalf("list answers %v", got)
	}
	correlated(t, got[0], r.pk, list.ID)
	if !strings.HasPrefix(got[0].Content, `{"jsonrpc":"2.0","id":"l","result":{"tools":[`) {
		t.Errorf("list content %s", got[0].Content)
	}
	if !hasTag(got[0].Tags, "cap", "paid", "21", "sats") || got[0].Tags.FindWithValue("cap", "tool:paid") != nil {
		t.Errorf("list cap tags (bare names) %v", got[0].Tags)
	}

	call := r.event(KindMessage, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"paid","arguments":{"text":"hi"}}}`, nostr.Tag{"method", "tools/call"})
	got = r.handle(call)
	if k := kinds(got); len(k) != 3 || k[0] != KindDVMCPNotification || k[1] != KindDVMCPNotification || k[2] != KindDVMCPResponse {
		t.Fatalf("call kinds %v", k)
	}
	for _, e := range got {
		correlated(t, e, r.pk, call.ID)
	}
	req := got[0]
	if req.Content != "" || !hasTag(req.Tags, "status", "payment-required") || !hasTag(req.Tags, "amount", "21", "lnbcrt210n1fake") ||
		!hasTag(req.Tags, "invoice", "lnbcrt210n1fake") {
		t.Errorf("payment-required %v %q", req.Tags, req.Content)
	}
	// Both readers find the bolt11: the spec's at amount[2], the DVMCP
	// packages' in the invoice tag.
	if a := req.Tags.Find("amount"); a[1] != "21" || a[2] != "lnbcrt210n1fake" {
		t.Errorf("spec reader: amount %v", a)
	}
	if inv := req.Tags.Find("invoice"); inv[1] != "lnbcrt210n1fake" {
		t.Errorf("bridge reader: invoice %v", inv)
	}
	if !hasTag(got[1].Tags, "status", "payment-accepted") || got[1].Content != "" {
		t.Errorf("payment-accepted %v", got[1])
	}
	if got[2].Content != `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"paid:hi"}]}}` {
		t.Errorf("answer %s", got[2].Content)
	}
	if c := r.v.lastCall(); c.Transport != TransportDVMCP || c.Client != r.pk || c.RequestID != call.ID || c.Name != "paid" {
		t.Errorf("call request %+v", c)
	}

	rejected := r.event(KindMessage, `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"rejected"}}`, nostr.Tag{"method", "tools/call"})
	got = r.handle(rejected)
	if len(got) != 2 || !hasTag(got[0].Tags, "status", "error") || got[0].Content != "the payment request expired unpaid" ||
		!strings.Contains(got[1].Content, `"error":{"code":-32050,"message":"Payment expired"}`) {
		t.Errorf("rejected payment %v", got)
	}

	prog := r.event(KindMessage, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"progress"}}`, nostr.Tag{"method", "tools/call"})
	got = r.handle(prog)
	if len(got) != 2 || got[0].Kind != KindDVMCPNotification || !hasTag(got[0].Tags, "method", "notifications/progress") ||
		!strings.HasPrefix(got[0].Content, `{"jsonrpc":"2.0","method":"notifications/progress","params":`) {
		t.Errorf("progress %v", got)
	}

	if got := r.handle(r.event(KindMessage, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nostr.Tag{"method", "notifications/initialized"})); len(got) != 0 {
		t.Errorf("notification answered %v", got)
	}

	// initialize answers carry the server id DVMCP clients put in s tags.
	init := r.handle(r.event(KindMessage, `{"jsonrpc":"2.0","id":10,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}`, nostr.Tag{"method", "initialize"}))
	if len(init) != 1 || init[0].Kind != KindDVMCPResponse || !hasTag(init[0].Tags, "d", ServerID(r.s.PublicKey())) {
		t.Errorf("initialize answer %v", init)
	}
}

func TestRev11(t *testing.T) {
	r := newRec(t, nil)
	for _, tc := range []struct {
		name, content, want string
	}{
		{"call", `{"method":"tools/call","params":{"name":"free","arguments":{"text":"x"}}}`, `{"content":[{"type":"text","text":"free:x"}]}`},
		{"ping", `{"method":"ping"}`, `{}`},
		{"completion", `{"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":"x"}}}`, `{"completion":{"values":[]}}`},
		{"completion without argument", `{"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"}}}`, `{"error":{"code":-32602,"message":"Invalid params"}}`},
		{"unknown tool", `{"method":"tools/call","params":{"name":"nope"}}`, `{"error":{"code":-32602,"message":"Unknown tool: nope"}}`},
		{"unknown method", `{"method":"sampling/createMessage"}`, `{"error":{"code":-32601,"message":"Method not found"}}`},
		{"an id is ignored", `{"id":3,"method":"ping"}`, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var method struct{ Method string }
			json.Unmarshal([]byte(tc.content), &method)
			ev := r.event(KindMessage, tc.content, nostr.Tag{"method", method.Method}, nostr.Tag{"s", "srv"})
			got := r.handle(ev)
			if len(got) != 1 || got[0].Kind != KindDVMCPResponse || got[0].Content != tc.want {
				t.Fatalf("answers %v, want content %s", got, tc.want)
			}
			correlated(t, got[0], r.pk, ev.ID)
		})
	}
	t.Run("priced call notifications", func(t *testing.T) {
		ev := r.event(KindMessage, `{"method":"tools/call","params":{"name":"progress"}}`, nostr.Tag{"method", "tools/call"})
		got := r.handle(ev)
		if len(got) != 2 || got[0].Content != `{"method":"notifications/progress","params":{"message":"waiting for payment","progress":1,"progressToken":null}}` {
			t.Fatalf("answers %v", got)
		}
	})
	t.Run("notifications get no answer", func(t *testing.T) {
		if got := r.handle(r.event(KindMessage, `{"method":"notifications/initialized"}`, nostr.Tag{"method", "notifications/initialized"})); len(got) != 0 {
			t.Fatalf("answered %v", got)
		}
		if got := r.handle(r.event(KindMessage, `{"content":[]}`)); len(got) != 0 { // a response
			t.Fatalf("answered %v", got)
		}
	})
}

// completer is a Catalog that completes.
type completer struct {
	Catalog
	err error
}

func (c completer) Complete(_ context.Context, params json.RawMessage) (json.RawMessage, error) {
	if c.err != nil {
		return nil, c.err
	}
	return json.RawMessage(`{"completion":{"values":["python"],"total":1,"hasMore":false}}`), nil
}

func TestCompletionForwarded(t *testing.T) {
	params := `{"ref":{"type":"ref/prompt","name":"code_review"},"argument":{"name":"language","value":"py"}}`
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, `{"jsonrpc":"2.0","id":1,"result":{"completion":{"values":["python"],"total":1,"hasMore":false}}}`},
		{vend.ErrUpstream, `{"jsonrpc":"2.0","id":1,"error":{"code":-32054,"message":"Upstream server failed"}}`},
		{errors.New("dial tcp 10.0.0.7: refused"), `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"Internal error"}}`},
	} {
		r := newRec(t, func(c *Config) { c.Catalog = completer{err: tc.err} })
		got := r.handle(r.event(KindMessage, `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":`+params+`}`))
		if len(got) != 1 || got[0].Content != tc.want {
			t.Errorf("%v: answers %v", tc.err, got)
		}
	}
}

func TestNIP90(t *testing.T) {
	r := newRec(t, nil)
	list := r.event(KindJobRequest, "", nostr.Tag{"c", "list-tools"}, nostr.Tag{"output", "application/json"})
	got := r.handle(list)
	if len(got) != 1 || got[0].Kind != KindJobResult || !hasTag(got[0].Tags, "c", "list-tools-response") ||
		!strings.HasPrefix(got[0].Content, `{"tools":[{"name":"free"`) || !hasTag(got[0].Tags, "cap", "paid", "21", "sats") {
		t.Fatalf("list-tools answers %v", got)
	}
	correlated(t, got[0], r.pk, list.ID)

	exec := r.event(KindJobRequest, `{"name":"paid","parameters":{"text":"hi"}}`, nostr.Tag{"c", "execute-tool"}, nostr.Tag{"output", "application/json"})
	got = r.handle(exec)
	if k := kinds(got); len(k) != 4 || k[0] != KindJobFeedback || k[1] != KindJobFeedback || k[2] != KindJobFeedback || k[3] != KindJobResult {
		t.Fatalf("execute-tool kinds %v", k)
	}
	for _, e := range got {
		correlated(t, e, r.pk, exec.ID)
	}
	if !hasTag(got[0].Tags, "status", "payment-required") || !hasTag(got[0].Tags, "amount", "21000", "lnbcrt210n1fake") {
		t.Errorf("payment-required %v", got[0].Tags)
	}
	if !hasTag(got[1].Tags, "status", "processing") || !hasTag(got[2].Tags, "status", "success") {
		t.Errorf("feedback %v / %v", got[1].Tags, got[2].Tags)
	}
	if !hasTag(got[3].Tags, "c", "execute-tool-response") || !hasTag(got[3].Tags, "status", "success") ||
		got[3].Content != `{"content":[{"type":"text","text":"paid:hi"}]}` {
		t.Errorf("result %v", got[3])
	}
	if c := r.v.lastCall(); c.Transport != TransportNIP90 || c.Client != r.pk || c.RequestID != exec.ID || string(c.Arguments) != `{"text":"hi"}` {
		t.Errorf("call request %+v", c)
	}

	for _, tc := range []struct {
		name    string
		content string
		cmd     string
		msg     string
	}{
		{"unknown tool", `{"name":"nope","parameters":{}}`, "execute-tool", "Unknown tool: nope"},
		{"no name", `{"parameters":{}}`, "execute-tool", "Invalid params"},
		{"unknown command", ``, "list-resources", "Method not found"},
		{"null job", `null`, "execute-tool", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := r.event(KindJobRequest, tc.content, nostr.Tag{"c", tc.cmd})
			got := r.handle(ev)
			if tc.msg == "" {
				if len(got) != 0 {
					t.Fatalf("answered %v", got)
				}
				return
			}
			if len(got) != 2 || !hasTag(got[0].Tags, "status", "error", tc.msg) || got[1].Kind != KindJobResult ||
				!hasTag(got[1].Tags, "c", tc.cmd+"-response") ||
				got[1].Content != `{"content":[{"text":"`+tc.msg+`","type":"text"}],"isError":true}` {
				t.Fatalf("answers %v", got)
			}
		})
	}
	t.Run("cashu token in _meta", func(t *testing.T) {
		r.handle(r.event(KindJobRequest, `{"name":"free","parameters":{},"_meta":{"capvend/cashu":"cashuBabc"}}`, nostr.Tag{"c", "execute-tool"}))
		if c := r.v.lastCall(); c.CashuToken != "cashuBabc" {
			t.Errorf("call request %+v", c)
		}
	})
	t.Run("stored before the start", func(t *testing.T) {
		r.s.started = nostr.Now() + 10
		defer func() { r.s.started = 0 }()
		if _, err := r.s.parse(list); !errors.Is(err, ErrBeforeStart) {
			t.Errorf("parse: %v", err)
		}
	})
}

// sealFor wraps rumor the NIP-59 way: sealed (kind 13) by sealSK, wrapped
// (kind) by a random key, for recipient. The rumor is sent as is (its id
// included).
func sealFor(t testing.TB, rumor nostr.Event, sealSK, recipient string, kind int) *nostr.Event {
	t.Helper()
	ck, err := nip44.GenerateConversationKey(recipient, sealSK)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := nip44.Encrypt(rumor.String(), ck)
	if err != nil {
		t.Fatal(err)
	}
	seal := nostr.Event{Kind: KindSeal, CreatedAt: nostr.Now() - 3600, Tags: nostr.Tags{}, Content: ct}
	if err := seal.Sign(sealSK); err != nil {
		t.Fatal(err)
	}
	return wrapKind(t, seal, recipient, kind)
}

// rumorOf returns an unsigned request by sk with its id set.
func rumorOf(sk string, kind int, content string, tags nostr.Tags) nostr.Event {
	pk, _ := nostr.GetPublicKey(sk)
	ev := nostr.Event{PubKey: pk, Kind: kind, CreatedAt: nostr.Now(), Content: content, Tags: tags}
	ev.ID = ev.GetID()
	return ev
}

// openNIP59 unwraps an answer with go-nostr's nip59 and checks its layers:
// the seal signed by the server, the rumor by the server with its id.
func openNIP59(t testing.TB, w nostr.Event, sk, server string) nostr.Event {
	t.Helper()
	var seal nostr.Event
	rumor, err := nip59.GiftUnwrap(w, func(pub, ct string) (string, error) {
		ck, err := nip44.GenerateConversationKey(pub, sk)
		if err != nil {
			return "", err
		}
		plain, err := nip44.Decrypt(ct, ck)
		if err == nil && seal.ID == "" {
			json.Unmarshal([]byte(plain), &seal)
		}
		return plain, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if seal.Kind != KindSeal || seal.PubKey != server {
		t.Fatalf("seal kind %d by %s", seal.Kind, seal.PubKey)
	}
	if ok, _ := seal.CheckSignature(); !ok {
		t.Fatal("seal badly signed")
	}
	return rumor
}

func TestNIP59(t *testing.T) {
	r := newRec(t, nil)
	server := r.s.PublicKey()
	tags := nostr.Tags{{"p", server}, {"method", "tools/call"}, {"s", "srv"}}
	content := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"paid","arguments":{"text":"sealed"}}}`

	t.Run("go-nostr gift wrap", func(t *testing.T) {
		rumor := rumorOf(r.sk, KindMessage, content, tags)
		w, err := nip59.GiftWrap(rumor, server,
			func(s string) (string, error) {
				ck, _ := nip44.GenerateConversationKey(server, r.sk)
				return nip44.Encrypt(s, ck)
			},
			func(e *nostr.Event) error { return e.Sign(r.sk) },
			func(w *nostr.Event) { w.CreatedAt = nostr.Now() })
		if err != nil {
			t.Fatal(err)
		}
		got := r.handle(&w)
		if k := kinds(got); len(k) != 3 || k[0] != KindGiftWrap || k[2] != KindGiftWrap {
			t.Fatalf("answer kinds %v", k)
		}
		var inner []nostr.Event
		for _, g := range got {
			if g.PubKey == server || g.Tags.FindWithValue("p", r.pk) == nil {
				t.Errorf("wrap by %s tags %v", g.PubKey, g.Tags)
			}
			rm := openNIP59(t, g, r.sk, server)
			correlated(t, rm, r.pk, rumor.ID)
			inner = append(inner, rm)
		}
		if k := kinds(inner); k[0] != KindDVMCPNotification || k[1] != KindDVMCPNotification || k[2] != KindDVMCPResponse {
			t.Errorf("rumor kinds %v", k)
		}
		if !hasTag(inner[0].Tags, "invoice", "lnbcrt210n1fake") || !strings.Contains(inner[2].Content, "paid:sealed") {
			t.Errorf("rumors %v", inner)
		}
		if c := r.v.lastCall(); c.Client != r.pk || c.RequestID != rumor.ID || c.Transport != TransportDVMCP {
			t.Errorf("call request %+v", c)
		}
	})
	t.Run("kind 14 rumor, ephemeral wrap", func(t *testing.T) {
		tmpl := marshal(map[string]any{"kind": KindMessage, "tags": nostr.Tags{{"p", server}, {"method", "ping"}, {"support_encryption_ephemeral", "true"}},
			"content": `{"method":"ping"}`, "created_at": nostr.Now()})
		rumor := rumorOf(r.sk, KindRumorDM, tmpl, nostr.Tags{{"p", server}})
		got := r.handle(sealFor(t, rumor, r.sk, server, KindEphemeralGiftWrap))
		if len(got) != 1 || got[0].Kind != KindEphemeralGiftWrap {
			t.Fatalf("answers %v", got)
		}
		rm := openNIP59(t, got[0], r.sk, server)
		var ans struct {
			Kind    int        `json:"kind"`
			Tags    nostr.Tags `json:"tags"`
			Content string     `json:"content"`
		}
		if rm.Kind != KindRumorDM || json.Unmarshal([]byte(rm.Content), &ans) != nil || ans.Kind != KindDVMCPResponse || ans.Content != `{}` {
			t.Fatalf("rumor %v", rm)
		}
		correlated(t, nostr.Event{Tags: ans.Tags}, r.pk, rumor.ID)
	})
	other := nostr.GeneratePrivateKey()
	for _, tc := range []struct {
		name string
		w    func() *nostr.Event
		want error
	}{
		{"seal by someone else", func() *nostr.Event {
			return sealFor(t, rumorOf(r.sk, KindMessage, content, tags), other, server, KindGiftWrap)
		}, ErrForgedRumor},
		{"rumor id wrong", func() *nostr.Event {
			rm := rumorOf(r.sk, KindMessage, content, tags)
			rm.Content = `{"jsonrpc":"2.0","id":1,"method":"ping"}`
			return sealFor(t, rm, r.sk, server, KindGiftWrap)
		}, ErrBadEvent},
		{"rumor without id", func() *nostr.Event {
			rm := rumorOf(r.sk, KindMessage, content, tags)
			rm.ID = ""
			return sealFor(t, rm, r.sk, server, KindGiftWrap)
		}, ErrBadEvent},
		{"seal badly signed", func() *nostr.Event {
			w := sealFor(t, rumorOf(r.sk, KindMessage, content, tags), r.sk, server, KindGiftWrap)
			// re-wrap a seal whose signature is of another event
			plain, _ := r.s.decrypt(w.PubKey, w.Content)
			var seal nostr.Event
			json.Unmarshal([]byte(plain), &seal)
			seal.Sig = strings.Repeat("0", 128)
			return wrapFor(t, seal, server)
		}, ErrBadEvent},
		{"rumor stale", func() *nostr.Event {
			rm := rumorOf(r.sk, KindMessage, content, tags)
			rm.CreatedAt -= 3600
			rm.ID = rm.GetID()
			return sealFor(t, rm, r.sk, server, KindGiftWrap)
		}, ErrStale},
		{"rumor for someone else", func() *nostr.Event {
			otherPK, _ := nostr.GetPublicKey(other)
			return sealFor(t, rumorOf(r.sk, KindMessage, content, nostr.Tags{{"p", otherPK}}), r.sk, server, KindGiftWrap)
		}, ErrNotForUs},
		{"rumor of another kind", func() *nostr.Event {
			return sealFor(t, rumorOf(r.sk, 1, content, tags), r.sk, server, KindGiftWrap)
		}, ErrWrongKind},
		{"kind 14 without a template", func() *nostr.Event {
			return sealFor(t, rumorOf(r.sk, KindRumorDM, "hello", tags), r.sk, server, KindGiftWrap)
		}, ErrNotJSONRPC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.w()
			if _, err := r.s.parse(w); !errors.Is(err, tc.want) {
				t.Errorf("parse: %v, want %v", err, tc.want)
			}
			if got := r.handle(w); len(got) != 0 {
				t.Errorf("answered %v", got)
			}
		})
	}
}

func TestEphemeralGiftWrap(t *testing.T) {
	r := newRec(t, nil)
	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	for _, tc := range []struct {
		name   string
		kind   int
		tags   nostr.Tags
		answer int
	}{
		{"21059 from a client taking 21059", KindEphemeralGiftWrap, nostr.Tags{{"support_encryption_ephemeral"}}, KindEphemeralGiftWrap},
		{"21059 from a client that did not say", KindEphemeralGiftWrap, nil, KindGiftWrap},
		{"1059 from a client taking 21059", KindGiftWrap, nostr.Tags{{"support_encryption_ephemeral", "true"}}, KindEphemeralGiftWrap},
		{"1059", KindGiftWrap, nil, KindGiftWrap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner := r.event(KindMessage, ping, tc.tags...)
			w := wrapKind(t, *inner, r.s.PublicKey(), tc.kind)
			got := r.handle(w)
			if len(got) != 1 || got[0].Kind != tc.answer {
				t.Fatalf("answers %v", got)
			}
			plain, err := nip44.Decrypt(got[0].Content, mustCK(t, got[0].PubKey, r.sk))
			if err != nil {
				t.Fatal(err)
			}
			var ans nostr.Event
			json.Unmarshal([]byte(plain), &ans)
			if ok, _ := ans.CheckSignature(); !ok || ans.Kind != KindMessage || ans.Content != `{"jsonrpc":"2.0","id":1,"result":{}}` {
				t.Fatalf("inner answer %v", ans)
			}
			correlated(t, ans, r.pk, inner.ID)
		})
	}
	t.Run("21059 is not dropped as stored", func(t *testing.T) {
		r.s.started = nostr.Now() + 10
		defer func() { r.s.started = 0 }()
		w := wrapKind(t, *r.event(KindMessage, ping), r.s.PublicKey(), KindEphemeralGiftWrap)
		if _, err := r.s.parse(w); err != nil {
			t.Errorf("parse: %v", err)
		}
	})
}

func mustCK(t testing.TB, pub, sk string) [32]byte {
	ck, err := nip44.GenerateConversationKey(pub, sk)
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

// Through a relay: the server subscribes to 5910 job requests and 21059
// ephemeral gift wraps, and DVMCP answers reach a client subscribed to
// their kinds.
func TestDialectsOverRelay(t *testing.T) {
	relay := testkit.Relay(t)
	s := startServer(t, relay, &fakeVendor{}, nil)
	c := newClient(t, relay, s.PublicKey())
	next := func() *nostr.Event {
		t.Helper()
		select {
		case ev := <-c.events:
			return ev
		case <-time.After(30 * time.Second): // a deadlock guard
			t.Fatal("no event from the server")
		}
		return nil
	}

	job := c.event(`{"name":"free","parameters":{"text":"job"}}`, nostr.Tag{"c", "execute-tool"})
	job.Kind = KindJobRequest
	job.Sign(c.sk)
	c.publish(job)
	if ev := next(); ev.Kind != KindJobFeedback || !hasTag(ev.Tags, "status", "success") {
		t.Fatalf("feedback %v", ev)
	}
	if ev := next(); ev.Kind != KindJobResult || ev.Content != `{"content":[{"type":"text","text":"free:job"}]}` {
		t.Fatalf("result %v", ev)
	}

	rev1 := c.send(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, nostr.Tag{"method", "ping"})
	if ev := next(); ev.Kind != KindDVMCPResponse || ev.Tags.FindWithValue("e", rev1.ID) == nil {
		t.Fatalf("rev1 answer %v", ev)
	}

	inner := c.event(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, nostr.Tag{"support_encryption_ephemeral"})
	c.publish(wrapKind(t, *inner, s.PublicKey(), KindEphemeralGiftWrap))
	if ev := next(); ev.Kind != KindEphemeralGiftWrap {
		t.Fatalf("ephemeral answer %v", ev)
	}
}

// A plaintext request to a server requiring encryption is refused in the
// request's own dialect.
func TestEncryptionRequiredDialects(t *testing.T) {
	r := newRec(t, func(c *Config) { c.Encryption = EncryptionRequired })
	got := r.handle(r.event(KindMessage, `{"method":"ping"}`, nostr.Tag{"method", "ping"}))
	if len(got) != 1 || got[0].Kind != KindDVMCPResponse || got[0].Content != `{"error":{"code":-32600,"message":"Encryption required"}}` {
		t.Errorf("rev1.1 %v", got)
	}
	got = r.handle(r.event(KindJobRequest, ``, nostr.Tag{"c", "list-tools"}))
	if len(got) != 2 || !hasTag(got[0].Tags, "status", "error", "Encryption required") || got[1].Kind != KindJobResult {
		t.Errorf("nip90 %v", got)
	}
	if rpcerr.CodeInvalidRequest != -32600 {
		t.Fatal("code changed")
	}
}
