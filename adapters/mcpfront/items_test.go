package mcpfront

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// itemVendor is a fakeVendor that also sells prompts and resources.
type itemVendor struct{ *fakeVendor }

var _ ItemPricer = itemVendor{}

func (v itemVendor) ItemPrice(kind vend.ItemKind, name string) (lo, hi vend.Msat) {
	p := map[vend.ItemKind]map[string]vend.Msat{
		vend.ItemPrompt:   {"priced": 3000, "gated": 2000},
		vend.ItemResource: {"test://readme": 1500, "test://item/{id}": 2000},
	}[kind][name]
	if kind == vend.ItemResource && strings.HasPrefix(name, "test://item/") {
		p = 2000
	}
	return p, p
}

func (v itemVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	if r.Kind.Or() == vend.ItemTool {
		return v.fakeVendor.CallItem(ctx, r)
	}
	v.mu.Lock()
	rr := r
	rr.Notify = nil
	v.calls = append(v.calls, rr)
	v.mu.Unlock()
	switch {
	case r.Macaroon != nil:
		return vend.CallResult{}, fmt.Errorf("%w: the preimage is not the invoice's", vend.ErrL402Invalid)
	case r.CashuToken != "":
		return vend.CallResult{}, fmt.Errorf("%w: %w", vend.ErrPaymentFailed, vend.ErrForeignMint)
	}
	if r.Name == "gated" || (r.L402 && r.Name == "test://readme") {
		pr := &vend.PaymentRequiredError{Options: []vend.PaymentOption{
			{Amount: 2, PayReq: "lnbcrt20n1fake", PMI: vend.PMILightning, Description: "gated: 2 sat per call", TTL: 600}},
			Amount: 2000, Invoice: "lnbcrt20n1fake", ExpiresAt: fakeExpiry}
		if r.PaymentTokens {
			pr.Token = fakeToken
		}
		if r.L402 {
			pr.Macaroon = []byte("fake macaroon")
		}
		return vend.CallResult{}, pr
	}
	r.Notify(vend.NotifyPaymentRequired, map[string]any{"amount": 3, "pay_req": "lnbcrt30n1fake", "pmi": vend.PMILightning, "description": r.Name, "ttl": 600})
	r.Notify(vend.NotifyPaymentAccepted, map[string]any{"amount": 3, "pmi": vend.PMILightning})
	if r.Kind == vend.ItemPrompt {
		txt, _ := json.Marshal("sold " + r.Name + " " + string(r.Arguments))
		return vend.CallResult{Body: json.RawMessage(`{"messages":[{"role":"user","content":{"type":"text","text":` + string(txt) + `}}]}`)}, nil
	}
	return vend.CallResult{Body: json.RawMessage(`{"contents":[{"uri":"` + r.Name + `","text":"sold"}]}`)}, nil
}

func (v itemVendor) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.calls)
}

func newItemServer(t *testing.T) (*Server, itemVendor) {
	fc := newFakeCatalog()
	fc.prompts = append(fc.prompts, Prompt{Name: "priced", Definition: json.RawMessage(`{"description":"costs 3","_meta":{"k":"v"}}`)},
		Prompt{Name: "gated"})
	s, fv := newServer(t, Config{Catalog: fc})
	iv := itemVendor{fv}
	s.cfg.Vendor = iv
	s.Refresh()
	return s, iv
}

// listed returns the _meta price amounts of a list's entries by key.
func listedPrices(t *testing.T, msg json.RawMessage, member, key string) map[string]any {
	t.Helper()
	var res struct {
		Result map[string][]map[string]any `json:"result"`
	}
	if err := json.Unmarshal(msg, &res); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
	out := map[string]any{}
	for _, e := range res.Result[member] {
		name, _ := e[key].(string)
		meta, _ := e["_meta"].(map[string]any)
		out[name] = meta[MetaPrice]
	}
	return out
}

func TestPricedPromptsAndResourcesOverHTTP(t *testing.T) {
	s, iv := newItemServer(t)
	r := newRawSession(t, startHTTP(t, s))

	msgs, _ := r.post(`{"jsonrpc":"2.0","id":1,"method":"prompts/list"}`)
	got := listedPrices(t, msgs[0], "prompts", "name")
	if p, _ := got["priced"].(map[string]any); p["amount"] != 3.0 || p["unit"] != "sats" {
		t.Errorf("priced prompt listed with %v", got["priced"])
	}
	if got["greet"] != nil {
		t.Errorf("free prompt listed with a price: %v", got["greet"])
	}
	if !strings.Contains(string(msgs[0]), `"k":"v"`) {
		t.Errorf("the upstream's own _meta was lost: %s", msgs[0])
	}
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":2,"method":"resources/list"}`)
	got = listedPrices(t, msgs[0], "resources", "uri")
	if p, _ := got["test://readme"].(map[string]any); p["amount"] != 2.0 {
		t.Errorf("test://readme listed with %v (1.5 sat rounds up to 2)", got["test://readme"])
	}
	if got["test://blob"] != nil {
		t.Errorf("free resource listed with a price")
	}
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":3,"method":"resources/templates/list"}`)
	got = listedPrices(t, msgs[0], "resourceTemplates", "uriTemplate")
	if p, _ := got["test://item/{id}"].(map[string]any); p["amount"] != 2.0 {
		t.Errorf("template listed with %v", got["test://item/{id}"])
	}

	// A priced prompt: payment notifications on the request's stream, then
	// the result; the Vendor got the prompt request.
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":"g1","method":"prompts/get","params":{"name":"priced","arguments":{"who":"bob"},"_meta":{"capvend/pmi":["bitcoin-lightning-bolt11"]}}}`)
	if len(msgs) != 3 || !strings.Contains(string(msgs[0]), vend.NotifyPaymentRequired) ||
		!strings.Contains(string(msgs[1]), vend.NotifyPaymentAccepted) || !strings.Contains(string(msgs[2]), `sold priced {\"who\":\"bob\"}`) {
		t.Fatalf("prompts/get: %s", msgs)
	}
	last := iv.last()
	if last.Kind != vend.ItemPrompt || last.Name != "priced" || last.RequestID != `"g1"` || last.Transport != TransportHTTP ||
		last.Client == "" || len(last.PMIs) != 1 {
		t.Fatalf("vendor request %+v", last)
	}

	// Explicit gating (this raw client did not declare the payments
	// capability): a prompt has no tool result, so JSON-RPC 402 with the
	// tool result's structuredContent, the token to send back in _meta.
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":5,"method":"prompts/get","params":{"name":"gated"}}`)
	var e struct {
		Error struct {
			Code int
			Data struct {
				Invoice string
				Accepts []vend.PaymentOption
				Retry   struct {
					Meta map[string]string `json:"_meta"`
				}
				Text string
			}
		}
	}
	if len(msgs) != 1 || json.Unmarshal(msgs[0], &e) != nil || e.Error.Code != 402 || len(e.Error.Data.Accepts) != 1 ||
		e.Error.Data.Invoice != "lnbcrt20n1fake" || e.Error.Data.Retry.Meta[vend.MetaPaymentToken] != fakeToken ||
		!strings.Contains(e.Error.Data.Text, "lightning:lnbcrt20n1fake") {
		t.Fatalf("gated prompt: %s", msgs)
	}
	golden(t, "http_prompt_payment_required", msgs[0])
	if !iv.last().Explicit || !iv.last().PaymentTokens {
		t.Fatalf("vendor request %+v", iv.last())
	}
	// The token comes back in _meta.
	r.post(`{"jsonrpc":"2.0","id":9,"method":"prompts/get","params":{"name":"gated","_meta":{"capvend/payment":"` + fakeToken + `"}}}`)
	if got := iv.last().PaymentToken; got != fakeToken {
		t.Fatalf("token from _meta: %q", got)
	}

	// A read of a URI matching a priced template.
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"test://item/7"}}`)
	if len(msgs) != 3 || !strings.Contains(string(msgs[2]), `"text":"sold"`) {
		t.Fatalf("resources/read: %s", msgs)
	}
	if last := iv.last(); last.Kind != vend.ItemResource || last.Name != "test://item/7" {
		t.Fatalf("vendor request %+v", last)
	}

	// Free ones never reach the Vendor.
	n := iv.count()
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"greet","arguments":{"who":"x"}}}`)
	if len(msgs) != 1 || !strings.Contains(string(msgs[0]), "hello x") {
		t.Fatalf("free prompt: %s", msgs)
	}
	msgs, _ = r.post(`{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"test://blob"}}`)
	if len(msgs) != 1 || !strings.Contains(string(msgs[0]), "AAEC") {
		t.Fatalf("free resource: %s", msgs)
	}
	if iv.count() != n {
		t.Fatal("a free prompt or resource went through the Vendor")
	}
}

// TestPricedPromptOverStdio: over stdio the payment notifications precede
// the prompt's result on the output, and the request id reaches the Vendor.
func TestPricedPromptOverStdio(t *testing.T) {
	s, iv := newItemServer(t)
	c, stop := startStdio(t, s)
	defer stop()
	n := newNotes()
	c.OnNotification(n.add)
	if _, err := c.Initialize(context.Background(), payingInit()); err != nil {
		t.Fatal(err)
	}
	res, err := c.GetPrompt(context.Background(), mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "priced", Arguments: map[string]string{"who": "x"}}})
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if got := strings.Join(n.payment(), ","); got != vend.NotifyPaymentRequired+","+vend.NotifyPaymentAccepted {
		t.Fatalf("notifications %s", got)
	}
	if last := iv.last(); last.Kind != vend.ItemPrompt || last.Transport != TransportStdio || last.RequestID == "" || last.Explicit {
		t.Fatalf("vendor request %+v", last)
	}
}

// TestHTTP402ForPromptsAndResources: a priced prompts/get or
// resources/read over HTTP that wants 402 answers (Accept naming L402, or
// X-Cashu) is answered like a tools/call: HTTP 402 with the L402
// challenge and the JSON-RPC 402 body for a payment required, 401 for a
// refused L402 credential (a malformed one never reaches the Vendor), 400
// for a refused X-Cashu token. Without them, nothing changes (200).
func TestHTTP402ForPromptsAndResources(t *testing.T) {
	s, iv := newItemServer(t)
	r := newRawSession(t, startHTTP(t, s))
	const accept = "application/json, text/event-stream, application/vnd.l402"
	mac := base64.StdEncoding.EncodeToString([]byte("fake macaroon"))
	pre := strings.Repeat("ab", 32)

	for _, tc := range []struct {
		name, body string
		hdr        []string
		status     int
		want       string
	}{
		{"prompt, no Accept", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"gated"}}`, nil, 200, `"code":402`},
		{"prompt 402", `{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"gated"}}`, []string{"Accept", accept}, 402, `"code":402`},
		{"resource 402", `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"test://readme"}}`, []string{"Accept", accept}, 402, `"code":402`},
		{"prompt refused credential", `{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"gated"}}`,
			[]string{"Authorization", "L402 " + mac + ":" + pre}, 401, "not the invoice's"},
		{"resource malformed credential", `{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"test://readme"}}`,
			[]string{"Authorization", "L402 " + mac}, 401, "malformed L402 credential"},
		{"resource refused X-Cashu", `{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"test://readme"}}`,
			[]string{HeaderCashu, "cashuBfake"}, 400, "does not accept"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := iv.count()
			msgs, resp := r.post(tc.body, tc.hdr...)
			var id struct{ ID json.RawMessage }
			if resp.StatusCode != tc.status || len(msgs) != 1 || !strings.Contains(string(msgs[0]), tc.want) ||
				json.Unmarshal(msgs[0], &id) != nil || !strings.Contains(tc.body, `"id":`+string(id.ID)+`,`) {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, msgs)
			}
			chs := resp.Header.Values("WWW-Authenticate")
			if (tc.status == http.StatusPaymentRequired) != (len(chs) == 3 && strings.HasPrefix(chs[0], `L402 macaroon="`+mac+`"`)) {
				t.Fatalf("challenges %q with status %d", chs, resp.StatusCode)
			}
			if strings.Contains(tc.name, "malformed") && iv.count() != n {
				t.Fatal("a malformed credential reached the Vendor")
			}
		})
	}
}
