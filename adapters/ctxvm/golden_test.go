package ctxvm

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// goldenEvent is an event as a golden file shows it: the fields that vary
// from run to run (ids, signatures, random wrap keys, created_at, NIP-44
// ciphertext) replaced by names; a gift wrap or seal shows its decrypted
// content as inner.
type goldenEvent struct {
	ID        string       `json:"id,omitempty"`
	Kind      int          `json:"kind"`
	PubKey    string       `json:"pubkey"`
	CreatedAt string       `json:"created_at"`
	Tags      nostr.Tags   `json:"tags"`
	Content   string       `json:"content"`
	Sig       string       `json:"sig,omitempty"`
	Inner     *goldenEvent `json:"inner,omitempty"`
}

type goldenStep struct {
	Request goldenEvent   `json:"request"`
	Answers []goldenEvent `json:"answers"`
}

// normalizer names the hex strings (keys, event ids) of one scenario in
// order of appearance, so the same key or id gets the same name
// everywhere, e tags and contents included.
type normalizer struct {
	t     testing.TB
	names map[string]string
	count map[string]int
	order []string
}

func (n *normalizer) name(hex, kind string) string {
	if v, ok := n.names[hex]; ok {
		return v
	}
	n.count[kind]++
	v := fmt.Sprintf("<%s-%d>", kind, n.count[kind])
	if kind == "server" || kind == "client" {
		v = "<" + kind + ">"
	}
	n.names[hex] = v
	n.order = append(n.order, hex)
	return v
}

func (n *normalizer) replace(s string) string {
	for _, h := range n.order {
		s = strings.ReplaceAll(s, h, n.names[h])
	}
	return s
}

// event normalizes ev; sk opens its gift wrap and seal layers (the
// recipient's key).
func (n *normalizer) event(ev nostr.Event, sk string, request bool) goldenEvent {
	g := goldenEvent{Kind: ev.Kind, CreatedAt: "<created_at>", Content: ev.Content, Sig: ""}
	if ev.Sig != "" {
		g.Sig = "<sig>"
	}
	if ev.Kind == KindGiftWrap || ev.Kind == KindEphemeralGiftWrap {
		n.name(ev.PubKey, "wrap-key")
	}
	switch {
	case request && ev.Kind != KindGiftWrap && ev.Kind != KindEphemeralGiftWrap && ev.Kind != KindSeal:
		g.ID = n.name(ev.ID, "request")
	case ev.ID != "":
		g.ID = "<id>"
	}
	if ev.Kind == KindGiftWrap || ev.Kind == KindEphemeralGiftWrap || ev.Kind == KindSeal {
		ck, err := nip44.GenerateConversationKey(ev.PubKey, sk)
		if err != nil {
			n.t.Fatal(err)
		}
		plain, err := nip44.Decrypt(ev.Content, ck)
		if err != nil {
			n.t.Fatal(err)
		}
		var inner nostr.Event
		if err := json.Unmarshal([]byte(plain), &inner); err != nil {
			n.t.Fatal(err)
		}
		in := n.event(inner, sk, request)
		g.Inner, g.Content = &in, "<nip44>"
	}
	g.PubKey = n.replace(ev.PubKey)
	g.Tags = make(nostr.Tags, len(ev.Tags))
	for i, t := range ev.Tags {
		g.Tags[i] = make(nostr.Tag, len(t))
		for j, v := range t {
			g.Tags[i][j] = n.replace(v)
		}
	}
	if g.Content != "<nip44>" {
		g.Content = n.replace(g.Content)
	}
	return g
}

// TestGolden runs each scenario on a recorder and compares the wire
// events (requests and answers, normalized) with
// testdata/golden/<scenario>.json. Regenerate with
// go test ./adapters/ctxvm -run Golden -update.
func TestGolden(t *testing.T) {
	type step func(r *rec) *nostr.Event
	ctxvmReq := func(content string, tags ...nostr.Tag) step {
		return func(r *rec) *nostr.Event { return r.event(KindMessage, content, tags...) }
	}
	wrappedReq := func(content string, tags ...nostr.Tag) step {
		return func(r *rec) *nostr.Event {
			return wrapFor(r.t, *r.event(KindMessage, content, tags...), r.s.PublicKey())
		}
	}
	jobReq := func(content, cmd string) step {
		return func(r *rec) *nostr.Event {
			return r.event(KindJobRequest, content, nostr.Tag{"c", cmd}, nostr.Tag{"output", "application/json"})
		}
	}
	for _, sc := range []struct {
		name  string
		steps []step
	}{
		{"contextvm-plain", []step{
			ctxvmReq(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`),
			ctxvmReq(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"free","arguments":{"text":"hi"}}}`),
		}},
		{"contextvm-priced", []step{
			ctxvmReq(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"paid","arguments":{"text":"hi"}}}`, nostr.Tag{"pmi", "bitcoin-lightning-bolt11"}),
		}},
		{"contextvm-direct-payment", []step{
			// CEP-8: the token in a direct_payment tag, the change in a
			// change tag (fakeVendor's "direct" plays vend's cashu scheme).
			wrappedReq(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"direct","arguments":{}}}`,
				nostr.Tag{"pmi", PMICashuDirect}, nostr.Tag{"direct_payment", PMICashuDirect, "cashuBgood"}),
			wrappedReq(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"direct","arguments":{}}}`,
				nostr.Tag{"pmi", PMICashuDirect}, nostr.Tag{"direct_payment", PMICashuDirect, "cashuBshort"}),
		}},
		{"dvmcp-rev1", []step{
			ctxvmReq(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, nostr.Tag{"method", "tools/list"}, nostr.Tag{"s", "capvend"}),
			ctxvmReq(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"paid","arguments":{"text":"hi"}}}`, nostr.Tag{"method", "tools/call"}, nostr.Tag{"s", "capvend"}),
		}},
		{"dvmcp-rev1.1", []step{
			ctxvmReq(`{"method":"tools/call","params":{"name":"free","arguments":{"text":"hi"}}}`, nostr.Tag{"method", "tools/call"}, nostr.Tag{"s", "capvend"}),
			ctxvmReq(`{"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"code_review"},"argument":{"name":"language","value":"py"}}}`,
				nostr.Tag{"method", "completion/complete"}, nostr.Tag{"s", "capvend"}),
			ctxvmReq(`{"method":"ping"}`, nostr.Tag{"method", "ping"}, nostr.Tag{"s", "capvend"}),
		}},
		{"nip90", []step{
			jobReq(``, "list-tools"),
			jobReq(`{"name":"paid","parameters":{"text":"hi"}}`, "execute-tool"),
		}},
		{"nip59-rev1", []step{
			func(r *rec) *nostr.Event {
				rumor := rumorOf(r.sk, KindMessage, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"paid","arguments":{"text":"sealed"}}}`,
					nostr.Tags{{"p", r.s.PublicKey()}, {"method", "tools/call"}, {"s", "capvend"}})
				return sealFor(r.t, rumor, r.sk, r.s.PublicKey(), KindGiftWrap)
			},
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			r := newRec(t, nil)
			n := &normalizer{t: t, names: map[string]string{}, count: map[string]int{}}
			n.name(r.s.PublicKey(), "server")
			n.name(r.pk, "client")
			var steps []goldenStep
			for _, st := range sc.steps {
				req := st(r)
				step := goldenStep{Request: n.event(*req, r.s.cfg.SecretKey, true)}
				for _, ev := range r.handle(req) {
					step.Answers = append(step.Answers, n.event(ev, r.sk, false))
				}
				if len(step.Answers) == 0 {
					t.Fatalf("no answer to %v", req)
				}
				steps = append(steps, step)
			}
			checkGolden(t, sc.name, renderGolden(t, steps))
		})
	}
}

// checkGolden compares got with testdata/golden/<name>.json, or writes it
// there with -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name+".json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the wire (run with -update if the change is intended); got:\n%s", path, got)
	}
}

// stringArray matches a JSON array of strings spread over lines.
var stringArray = regexp.MustCompile(`\[(\s*"(?:[^"\\]|\\.)*",?)+\s*\]`)

// renderGolden is steps as indented JSON, <> unescaped, each tag on one line.
func renderGolden(t testing.TB, steps []goldenStep) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(steps); err != nil {
		t.Fatal(err)
	}
	return stringArray.ReplaceAllFunc(buf.Bytes(), func(m []byte) []byte {
		var c bytes.Buffer
		if err := json.Compact(&c, m); err != nil {
			return m
		}
		return c.Bytes()
	})
}
