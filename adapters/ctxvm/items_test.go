package ctxvm

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// itemVendor is a fakeVendor that also sells the prompt greet (3 sats),
// the resource test://readme (1.5 sats) and the template test://item/{id}
// (2 sats).
type itemVendor struct{ *fakeVendor }

var _ ItemPricer = itemVendor{}

func (v itemVendor) ItemPrice(kind vend.ItemKind, name string) (lo, hi vend.Msat) {
	switch {
	case kind == vend.ItemPrompt && name == "greet":
		return 3000, 3000
	case kind == vend.ItemResource && name == "test://readme":
		return 1500, 1500
	case kind == vend.ItemResource && strings.HasPrefix(name, "test://item/"):
		return 2000, 2000
	}
	return 0, 0
}

func (v itemVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	if r.Kind.Or() == vend.ItemTool {
		return v.fakeVendor.CallItem(ctx, r)
	}
	v.mu.Lock()
	v.calls = append(v.calls, r)
	v.mu.Unlock()
	r.Notify(vend.NotifyPaymentRequired, vend.PaymentOption{Amount: 3, PayReq: "lnbcrt30n1fake", PMI: vend.PMILightning, Description: r.Name, TTL: 600})
	r.Notify(vend.NotifyPaymentAccepted, map[string]any{"amount": 3, "pmi": vend.PMILightning})
	if r.Kind == vend.ItemPrompt {
		txt, _ := json.Marshal("sold " + string(r.Arguments))
		return vend.CallResult{Body: json.RawMessage(`{"messages":[{"role":"user","content":{"type":"text","text":` + string(txt) + `}}]}`)}, nil
	}
	return vend.CallResult{Body: json.RawMessage(`{"contents":[{"uri":"` + r.Name + `","text":"sold"}]}`)}, nil
}

func TestPricedPromptsAndResources(t *testing.T) {
	relay := testkit.Relay(t)
	v := itemVendor{&fakeVendor{}}
	s := startServer(t, relay, v, func(cfg *Config) { cfg.Catalog = fakeCatalog{} })
	c := newClient(t, relay, s.PublicKey())

	t.Run("lists", func(t *testing.T) {
		for _, tc := range []struct {
			method, has string
			cap         []string
		}{
			{"prompts/list", `{"_meta":{"capvend/price":{"amount":3,"unit":"sats"}},"arguments"`, []string{"cap", "prompt:greet", "3", "sats"}},
			{"resources/list", `"_meta":{"capvend/price":{"amount":2,"unit":"sats"}}`, []string{"cap", "resource:test://readme", "2", "sats"}},
			{"resources/templates/list", `"_meta":{"capvend/price":{"amount":2,"unit":"sats"}}`, []string{"cap", "resource:test://item/{id}", "2", "sats"}},
		} {
			req := c.send(`{"jsonrpc":"2.0","id":1,"method":"` + tc.method + `"}`)
			r, ev := c.expect(req)
			if r.Error != nil || !strings.Contains(string(r.Result), tc.has) {
				t.Errorf("%s: %s %+v lacks %s", tc.method, r.Result, r.Error, tc.has)
			}
			if !hasTag(ev.Tags, tc.cap...) || len(slices.Collect(ev.Tags.FindAll("cap"))) != 1 {
				t.Errorf("%s: tags %v, want one %v", tc.method, ev.Tags, tc.cap)
			}
		}
	})

	t.Run("prompt", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"greet","arguments":{"who":"bob"},"_meta":{"capvend/cashu":"cashuBxyz"}}}`,
			nostr.Tag{"pmi", vend.PMILightning})
		var methods []string
		for range 2 {
			r, _ := c.expect(req)
			methods = append(methods, r.Method)
		}
		if strings.Join(methods, ",") != vend.NotifyPaymentRequired+","+vend.NotifyPaymentAccepted {
			t.Fatalf("notifications %v", methods)
		}
		r, _ := c.expect(req)
		if r.Error != nil || !strings.Contains(string(r.Result), `sold {\"who\":\"bob\"}`) {
			t.Fatalf("answer %s %+v", r.Result, r.Error)
		}
		got := v.lastCall()
		if got.Kind != vend.ItemPrompt || got.Name != "greet" || got.Client != c.pk || got.RequestID != req.ID ||
			got.CashuToken != "cashuBxyz" || len(got.PMIs) != 1 {
			t.Fatalf("call request %+v", got)
		}
	})

	t.Run("resource", func(t *testing.T) {
		req := c.send(`{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"test://item/42"}}`)
		for range 2 {
			c.expect(req)
		}
		r, _ := c.expect(req)
		if r.Error != nil || !strings.Contains(string(r.Result), `"text":"sold"`) {
			t.Fatalf("answer %s %+v", r.Result, r.Error)
		}
		if got := v.lastCall(); got.Kind != vend.ItemResource || got.Name != "test://item/42" {
			t.Fatalf("call request %+v", got)
		}
	})

	t.Run("free stays free", func(t *testing.T) {
		n := len(v.calls)
		r := c.ask(t, `{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"test://down"}}`)
		if r.Error == nil || r.Error.Code != -32054 || len(v.calls) != n {
			t.Fatalf("free read: %+v, %d vendor calls", r.Error, len(v.calls)-n)
		}
	})
}

// TestAnnouncedItemCaps: the ContextVM announcements of resources (11318),
// templates (11319) and prompts (11320) carry the cap tags and price _meta
// of the priced ones; DVMCP's lists carry the bare-name cap with the price.
func TestAnnouncedItemCaps(t *testing.T) {
	s, err := New(Config{Vendor: itemVendor{&fakeVendor{}}, Catalog: fakeCatalog{}, SecretKey: nostr.GeneratePrivateKey(),
		Relays: []string{"ws://127.0.0.1:1"}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	by := map[int][]announcement{}
	for _, a := range s.announcements() {
		by[a.Kind] = append(by[a.Kind], a)
	}
	for _, tc := range []struct {
		kind int
		cap  []string
		has  string
	}{
		{KindAnnounceResources, []string{"cap", "resource:test://readme", "2", "sats"}, `"capvend/price":{"amount":2,"unit":"sats"}`},
		{KindAnnounceResourceTemplates, []string{"cap", "resource:test://item/{id}", "2", "sats"}, `"capvend/price"`},
		{KindAnnouncePrompts, []string{"cap", "prompt:greet", "3", "sats"}, `"capvend/price":{"amount":3,"unit":"sats"}`},
	} {
		a := by[tc.kind][0]
		if !hasTag(a.tags, tc.cap...) || len(slices.Collect(a.tags.FindAll("cap"))) != 1 || !strings.Contains(a.content, tc.has) {
			t.Errorf("%d: tags %v content %s, want %v and %s", tc.kind, a.tags, a.content, tc.cap, tc.has)
		}
	}
	var dv nostr.Tags
	for _, a := range by[KindDVMCPAnnouncePrompts] {
		dv = append(dv, a.tags...)
	}
	if !hasTag(dv, "cap", "greet", "3", "sats") || !hasTag(dv, "cap", "down") {
		t.Errorf("DVMCP prompts tags %v", dv)
	}
}
