package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// fakeItems is a tool source that also serves prompts and resources (a
// vend.ItemSource), counting what it renders and reads.
type fakeItems struct {
	*fakeTools
	prompts, reads atomic.Int32
}

var _ vend.ItemSource = (*fakeItems)(nil)

var summarizeSchema = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)

func (f *fakeItems) PromptItem(name string) (vend.Item, bool) {
	switch name {
	case "demo_summarize", "demo_broken", "demo_freeprompt":
		return vend.Item{Kind: vend.ItemPrompt, Name: name, Server: "demo", UpstreamName: strings.TrimPrefix(name, "demo_"),
			InputSchema: map[bool]json.RawMessage{true: summarizeSchema}[name == "demo_summarize"]}, true
	}
	return vend.Item{}, false
}

func (f *fakeItems) ResourceItem(uri string) (vend.Item, bool) {
	switch {
	case uri == "docs://guide":
		return vend.Item{Kind: vend.ItemResource, Name: uri, Server: "demo", UpstreamName: uri}, true
	case uri == "docs://pages/intro", uri == "docs://pages/special": // listed, and matching the template
		return vend.Item{Kind: vend.ItemResource, Name: uri, Server: "demo", UpstreamName: uri, Templates: []string{"docs://pages/{id}"}}, true
	case uri == "notes://today": // listed; the upstream has no template, the configuration has one
		return vend.Item{Kind: vend.ItemResource, Name: uri, Server: "demo", UpstreamName: uri}, true
	case uri == "docs://pages/{id}" || strings.HasPrefix(uri, "docs://pages/"):
		return vend.Item{Kind: vend.ItemResource, Name: uri, Server: "demo", UpstreamName: "docs://pages/{id}"}, true
	}
	return vend.Item{}, false
}

func (f *fakeItems) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	f.prompts.Add(1)
	if name == "demo_broken" {
		return nil, fmt.Errorf("upstream said no: %w", vend.ErrUpstream)
	}
	txt, _ := json.Marshal("summarize: " + args["text"])
	return json.RawMessage(`{"messages":[{"role":"user","content":{"type":"text","text":` + string(txt) + `}}]}`), nil
}

func (f *fakeItems) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	f.reads.Add(1)
	return json.RawMessage(`{"contents":[{"uri":"` + uri + `","text":"page"}]}`), nil
}

// itemHarness prices the prompts summarize (3 sat) and broken (2 sat), the
// resource docs://guide (1.5 sat) and the template docs://pages/{id} (2
// sat), and a tool that happens to share the prompt's name (99 sat).
func itemHarness(t *testing.T, hold bool) (*harness, *fakeItems) {
	items := &fakeItems{fakeTools: &fakeTools{}}
	h := newHarness(t, hold, func(c *vend.Config) {
		c.Tools = items
		c.Prices = newBook(t, map[string]pricing.Rule{
			"echo":                                   {Price: 21_000},
			"summarize":                              {Price: 99_000}, // a tool's rule: must not price the prompt
			pricing.PromptKey("summarize"):           {Price: 3_000},
			pricing.PromptKey("broken"):              {Price: 2_000},
			pricing.ResourceKey("docs://guide"):      {Price: 1_500},
			pricing.ResourceKey("docs://pages/{id}"): {Price: 2_000},
			// A listed URI with its own price, matching the template.
			pricing.ResourceKey("docs://pages/special"): {Price: 5_000},
			// A template no upstream lists.
			pricing.ResourceKey("notes://{day}"): {Price: 4_000},
		})
	})
	return h, items
}

func promptReq(id, name, args string, n *notes) vend.CallRequest {
	r := req(id, name, args, n)
	r.Kind = vend.ItemPrompt
	return r
}

func readReq(id, uri string, n *notes) vend.CallRequest {
	r := req(id, uri, "", n)
	r.Kind = vend.ItemResource
	return r
}

func TestPricedPromptIsQuotedPaidRunOnceAndReplayed(t *testing.T) {
	h, items := itemHarness(t, false)
	n := &notes{}
	ch := h.callAsync(promptReq("p1", "demo_summarize", `{"text":"hi"}`, n))
	p := h.nextPayment(t)
	if p.Amount != 3_000 {
		t.Fatalf("prompt quoted %d msat, want 3000 (its own price, not the tool's)", p.Amount)
	}
	if items.prompts.Load() != 0 {
		t.Fatal("rendered before payment")
	}
	n.waitFor(t, vend.NotifyPaymentRequired) // paid before that, there is nothing to ask
	h.be.pay(p.Ref)
	o := result(t, ch)
	if o.err != nil || !strings.Contains(string(o.res.Body), "summarize: hi") {
		t.Fatalf("%s %v", o.res.Body, o.err)
	}
	if got := strings.Join(n.methods(), ","); got != vend.NotifyPaymentRequired+","+vend.NotifyPaymentAccepted {
		t.Fatalf("notifications %s", got)
	}
	n2 := &notes{}
	res, err := h.v.CallItem(context.Background(), promptReq("p1", "demo_summarize", `{"text":"hi"}`, n2))
	if err != nil || string(res.Body) != string(o.res.Body) || len(n2.methods()) != 0 || items.prompts.Load() != 1 {
		t.Fatalf("replay: %s %v %v renders=%d", res.Body, err, n2.methods(), items.prompts.Load())
	}
	c, err := h.l.Call(context.Background(), p.CallID)
	if err != nil || c.Kind != vend.ItemPrompt || c.Name != "summarize" || c.State != vend.CallDelivered {
		t.Fatalf("recorded call %+v %v", c, err)
	}
	b, _ := h.l.Balance(context.Background())
	if len(b.Tools) != 1 || b.Tools[0].Account != "income:prompts:demo:summarize" || b.Tools[0].Revenue != 3_000 {
		t.Fatalf("revenue %+v", b.Tools)
	}
	if lo, hi := h.v.ItemPrice(vend.ItemPrompt, "demo_summarize"); lo != 3_000 || hi != 3_000 {
		t.Fatalf("listed %d-%d", lo, hi)
	}
	verify(t, h.l)
}

func TestPromptArgumentsAreCheckedBeforeAQuote(t *testing.T) {
	h, items := itemHarness(t, false)
	for _, args := range []string{`{"text":1}`, `{}`, `[]`} { // not a string; a required argument missing; not an object
		_, err := h.v.CallItem(context.Background(), promptReq("p1"+args, "demo_summarize", args, nil))
		var ip *vend.InvalidParamsError
		if !errors.As(err, &ip) {
			t.Fatalf("%s: err %v, want invalid params", args, err)
		}
	}
	if _, err := h.v.CallItem(context.Background(), promptReq("p2", "demo_nope", `{}`, nil)); !errors.Is(err, vend.ErrUnknownTool) {
		t.Fatalf("unknown prompt: %v", err)
	}
	if b, _ := h.l.Balance(context.Background()); b.Pending.AwaitingCalls != 0 || items.prompts.Load() != 0 {
		t.Fatalf("a refused prompt get was recorded or run: %+v", b.Pending)
	}
}

func TestFreePromptRunsUnrecorded(t *testing.T) {
	h, items := itemHarness(t, false)
	res, err := h.v.CallItem(context.Background(), promptReq("p1", "demo_freeprompt", `{"text":"x"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "summarize: x") || items.prompts.Load() != 1 {
		t.Fatalf("%s %v", res.Body, err)
	}
	if lo, hi := h.v.ItemPrice(vend.ItemPrompt, "demo_freeprompt"); lo != 0 || hi != 0 {
		t.Fatalf("free prompt listed at %d-%d", lo, hi)
	}
}

func TestPricedResourceReadsAndTemplates(t *testing.T) {
	h, items := itemHarness(t, false)
	ch := h.callAsync(readReq("r1", "docs://pages/7", nil))
	p := h.nextPayment(t)
	if p.Amount != 2_000 {
		t.Fatalf("read of a templated URI quoted %d msat, want 2000", p.Amount)
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil || !strings.Contains(string(o.res.Body), "docs://pages/7") {
		t.Fatalf("%s %v", o.res.Body, o.err)
	}
	ch = h.callAsync(readReq("r2", "docs://guide", nil))
	p = h.nextPayment(t)
	if p.Amount != 1_500 {
		t.Fatalf("docs://guide quoted %d msat", p.Amount)
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}
	if items.reads.Load() != 2 {
		t.Fatalf("%d reads", items.reads.Load())
	}
	b, _ := h.l.Balance(context.Background())
	got := map[string]vend.Msat{}
	for _, r := range b.Tools {
		got[r.Account] = r.Revenue
	}
	if got["income:resources:demo:docs---pages--id-"] != 2_000 || got["income:resources:demo:docs---guide"] != 1_500 {
		t.Fatalf("revenue %v", got)
	}
	if lo, _ := h.v.ItemPrice(vend.ItemResource, "docs://pages/{id}"); lo != 2_000 {
		t.Fatalf("template listed at %d", lo)
	}
	verify(t, h.l)
}

func TestFailedPromptIsRefunded(t *testing.T) {
	h, items := itemHarness(t, true)
	ch := h.callAsync(promptReq("p1", "demo_broken", `{}`, nil))
	p := h.nextPayment(t)
	if p.Kind != vend.KindHoldInvoice {
		t.Fatalf("kind %s", p.Kind)
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); !errors.Is(o.err, vend.ErrUpstream) {
		t.Fatalf("%s %v, want upstream error", o.res.Body, o.err)
	}
	if got, _ := h.l.Payment(context.Background(), p.Ref); got.State != vend.PaymentCanceled {
		t.Fatalf("hold invoice is %s after the prompt failed", got.State)
	}
	if c, _ := h.l.Call(context.Background(), p.CallID); c.State != vend.CallRefunded {
		t.Fatalf("call is %s", c.State)
	}
	if items.prompts.Load() != 1 {
		t.Fatalf("%d renders", items.prompts.Load())
	}
	verify(t, h.l)
}

// TestRecoverRedoesAnInterruptedPrompt: a paid prompt get a crash left
// executing is rendered again at start (prompt gets are idempotent), and
// its answer waits for the replay.
func TestRecoverRedoesAnInterruptedPrompt(t *testing.T) {
	ctx := context.Background()
	l, err := openLedger(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "client-1", RequestID: "p1", Server: "demo",
		Kind: vend.ItemPrompt, Name: "summarize", ArgsHash: argsHash(t, "prompts/get", "demo_summarize", `{"text":"again"}`), Price: 3_000, Idempotent: true,
		ExposedName: "demo_summarize", Arguments: []byte(`{"text":"again"}`)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
		Ref: strings.Repeat("c", 64), Bolt11: "lnbcrt1", Amount: 3_000, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 3_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	items := &fakeItems{fakeTools: &fakeTools{}}
	h := harnessOn(t, l, false, func(cfg *vend.Config) {
		cfg.Tools = items
		cfg.Prices = newBook(t, map[string]pricing.Rule{pricing.PromptKey("summarize"): {Price: 3_000}})
	})
	if got := waitState(t, l, c.ID, vend.CallDelivered); got.Executions != 2 {
		t.Fatalf("executions %d", got.Executions)
	}
	res, err := h.v.CallItem(ctx, promptReq("p1", "demo_summarize", `{"text":"again"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "summarize: again") || items.prompts.Load() != 1 {
		t.Fatalf("replay: %s %v renders=%d", res.Body, err, items.prompts.Load())
	}
	verify(t, l)
}

// TestPromptDailyFreeQuota: free_per_day counts a prompt apart from a tool
// of the same name.
func TestPromptDailyFreeQuota(t *testing.T) {
	items := &fakeItems{fakeTools: &fakeTools{}}
	h := newHarness(t, false, func(c *vend.Config) {
		c.Tools = items
		c.Prices = newBook(t, map[string]pricing.Rule{pricing.PromptKey("summarize"): {Price: 3_000, FreePerDay: 1}})
	})
	if _, err := h.v.CallItem(context.Background(), promptReq("p1", "demo_summarize", `{"text":"a"}`, nil)); err != nil {
		t.Fatal(err)
	}
	ch := h.callAsync(promptReq("p2", "demo_summarize", `{"text":"b"}`, nil))
	p := h.nextPayment(t)
	if p.Amount != 3_000 {
		t.Fatalf("second get quoted %d", p.Amount)
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}
	b, _ := h.l.Balance(context.Background())
	if len(b.Free) != 1 || b.Free[0].Tool != pricing.PromptKey("summarize") || b.Free[0].Uses != 1 || items.prompts.Load() != 2 {
		t.Fatalf("free uses %+v, renders %d", b.Free, items.prompts.Load())
	}
	verify(t, h.l)
}

// TestListedResourceMatchingAPricedTemplateIsPriced: a resource an
// upstream lists, whose URI matches a priced URI template, costs the
// template's price (unless it has a price of its own); before, the
// listed URI was looked up alone and read free.
func TestListedResourceMatchingAPricedTemplateIsPriced(t *testing.T) {
	h, items := itemHarness(t, false)
	for _, tc := range []struct {
		uri  string
		want vend.Msat
	}{{"docs://pages/intro", 2_000}, {"docs://pages/special", 5_000}, {"docs://guide", 1_500}} {
		if lo, hi := h.v.ItemPrice(vend.ItemResource, tc.uri); lo != tc.want || hi != tc.want {
			t.Errorf("%s listed at %d-%d msat, want %d", tc.uri, lo, hi, tc.want)
		}
	}
	ch := h.callAsync(readReq("r1", "docs://pages/intro", nil))
	p := h.nextPayment(t)
	if p.Amount != 2_000 || items.reads.Load() != 0 {
		t.Fatalf("quoted %d msat, %d reads before payment", p.Amount, items.reads.Load())
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil || !strings.Contains(string(o.res.Body), "docs://pages/intro") {
		t.Fatalf("%s %v", o.res.Body, o.err)
	}
	if c, _ := h.l.Call(context.Background(), p.CallID); c.Name != "docs://pages/{id}" || c.State != vend.CallDelivered {
		t.Fatalf("recorded %+v", c)
	}
	verify(t, h.l)
}

// TestResourceMatchingAConfiguredTemplateIsPriced: a listed resource whose
// URI matches a URI template that only the configuration names (the
// upstream declares no such template) costs the template's price; before,
// only templates an upstream lists were matched, and it was read free
// (redteam TestPricedURITemplate).
func TestResourceMatchingAConfiguredTemplateIsPriced(t *testing.T) {
	h, items := itemHarness(t, false)
	if lo, hi := h.v.ItemPrice(vend.ItemResource, "notes://today"); lo != 4_000 || hi != 4_000 {
		t.Errorf("notes://today listed at %d-%d msat, want 4000", lo, hi)
	}
	ch := h.callAsync(readReq("r1", "notes://today", nil))
	p := h.nextPayment(t)
	if p.Amount != 4_000 || items.reads.Load() != 0 {
		t.Fatalf("quoted %d msat, %d reads before payment", p.Amount, items.reads.Load())
	}
	h.be.pay(p.Ref)
	if o := result(t, ch); o.err != nil || !strings.Contains(string(o.res.Body), "notes://today") {
		t.Fatalf("%s %v", o.res.Body, o.err)
	}
	if c, _ := h.l.Call(context.Background(), p.CallID); c.Name != "notes://{day}" || c.State != vend.CallDelivered {
		t.Fatalf("recorded %+v", c)
	}
	verify(t, h.l)
}
