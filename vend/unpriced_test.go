package vend_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// itemCatalog lists fakeItems's prompts and resources, as the upstreams'
// catalog does for the fronts.
type itemCatalog struct{ *fakeItems }

func (c itemCatalog) Prompts() []vend.Prompt {
	return []vend.Prompt{{Name: "demo_summarize"}, {Name: "demo_broken"}, {Name: "demo_freeprompt"}}
}

func (c itemCatalog) Resources() []vend.Resource {
	return []vend.Resource{{URI: "docs://guide"}, {URI: "docs://pages/intro"}, {URI: "docs://pages/special"}, {URI: "notes://today"}}
}

func (c itemCatalog) ResourceTemplates() []vend.ResourceTemplate {
	return []vend.ResourceTemplate{{URITemplate: "docs://pages/{id}"}}
}

// refusingHarness sells fakeItems with pricing.UnpricedRefuse: only the
// items with a rule are offered, those with a free rule free.
func refusingHarness(t *testing.T, unpriced pricing.Unpriced) (*harness, *fakeItems) {
	items := &fakeItems{fakeTools: &fakeTools{}}
	book, err := pricing.NewBook(map[string]map[string]pricing.Rule{"demo": {
		"echo":                              {Price: 21_000},
		"free":                              {},
		pricing.PromptKey("summarize"):      {Price: 3_000},
		pricing.PromptKey("freeprompt"):     {},
		pricing.ResourceKey("docs://guide"): {Price: 1_500},
		pricing.ResourceKey("docs://pages/intro"): {},
	}}, pricing.WithUnpriced(map[string]pricing.Unpriced{"demo": unpriced}))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, false, func(c *vend.Config) {
		c.Tools = items
		c.Prices = book
	})
	return h, items
}

// With pricing.UnpricedRefuse an item without a rule is neither listed
// nor sold, on any path: the tool list, a call, the fronts' catalog of
// prompts and resources, a get or read of one.
func TestUnpricedItemsRefused(t *testing.T) {
	h, items := refusingHarness(t, pricing.UnpricedRefuse)
	ctx := context.Background()
	var tools []string
	for _, tl := range h.v.Tools() {
		tools = append(tools, tl.Name)
	}
	if want := []string{"demo_echo", "demo_free"}; !slices.Equal(tools, want) {
		t.Errorf("tools listed %q, want %q", tools, want)
	}
	if _, err := h.v.CallItem(h.ctx, req("c1", "demo_fail", `{"text":"x"}`, nil)); !errors.Is(err, vend.ErrUnknownTool) {
		t.Errorf("calling demo_fail (no rule): %v, want ErrUnknownTool", err)
	}
	if _, ok, _ := h.v.CallFree(h.ctx, req("c2", "demo_fail", `{"text":"x"}`, nil)); ok {
		t.Error("CallFree served demo_fail (no rule)")
	}
	if res, err := h.v.CallItem(h.ctx, req("c3", "demo_free", `{"text":"x"}`, nil)); err != nil || res.IsError {
		t.Errorf("demo_free (a free rule): %s %v", res.Body, err)
	}
	if n := h.tools.count("fail"); n != 0 {
		t.Errorf("demo_fail ran %d times", n)
	}
	if _, err := h.v.CallItem(h.ctx, promptReq("p1", "demo_broken", `{}`, nil)); !errors.Is(err, vend.ErrUnknownTool) {
		t.Errorf("prompts/get demo_broken (no rule): %v, want ErrUnknownTool", err)
	}

	cat := h.v.Offered(itemCatalog{items})
	var prompts, resources, templates []string
	for _, p := range cat.Prompts() {
		prompts = append(prompts, p.Name)
	}
	for _, r := range cat.Resources() {
		resources = append(resources, r.URI)
	}
	for _, r := range cat.ResourceTemplates() {
		templates = append(templates, r.URITemplate)
	}
	if want := []string{"demo_summarize", "demo_freeprompt"}; !slices.Equal(prompts, want) {
		t.Errorf("prompts listed %q, want %q", prompts, want)
	}
	if want := []string{"docs://guide", "docs://pages/intro"}; !slices.Equal(resources, want) {
		t.Errorf("resources listed %q, want %q", resources, want)
	}
	// docs://pages/intro, which has a rule, is read through it.
	if want := []string{"docs://pages/{id}"}; !slices.Equal(templates, want) {
		t.Errorf("templates listed %q, want %q", templates, want)
	}
	var ip *vend.InvalidParamsError
	if _, err := cat.GetPrompt(ctx, "demo_broken", nil); !errors.As(err, &ip) {
		t.Errorf("catalog get of demo_broken (no rule): %v, want invalid params", err)
	}
	for _, uri := range []string{"docs://pages/special", "docs://pages/other", "notes://today"} {
		if _, err := cat.ReadResource(ctx, uri); !errors.As(err, &ip) {
			t.Errorf("catalog read of %s (no rule): %v, want invalid params", uri, err)
		}
	}
	if items.prompts.Load() != 0 || items.reads.Load() != 0 {
		t.Fatalf("%d prompts rendered, %d resources read", items.prompts.Load(), items.reads.Load())
	}
	if _, err := cat.ReadResource(ctx, "docs://pages/intro"); err != nil {
		t.Errorf("catalog read of docs://pages/intro (a free rule): %v", err)
	}
	if _, err := cat.GetPrompt(ctx, "demo_freeprompt", nil); err != nil {
		t.Errorf("catalog get of demo_freeprompt (a free rule): %v", err)
	}
	if lo, hi := h.v.ItemPrice(vend.ItemResource, "docs://guide"); lo != 1_500 || hi != 1_500 {
		t.Errorf("docs://guide priced %d-%d msat", lo, hi)
	}
}

// With pricing.UnpricedFree (the default) every item is offered, those
// without a rule free: the lists are the upstreams'.
func TestUnpricedItemsFree(t *testing.T) {
	h, items := refusingHarness(t, pricing.UnpricedFree)
	if n := len(h.v.Tools()); n != 3 {
		t.Errorf("%d tools listed, want 3", n)
	}
	cat := h.v.Offered(itemCatalog{items})
	if len(cat.Prompts()) != 3 || len(cat.Resources()) != 4 || len(cat.ResourceTemplates()) != 1 {
		t.Errorf("catalog lists %v %v %v", cat.Prompts(), cat.Resources(), cat.ResourceTemplates())
	}
	if res, err := h.v.CallItem(h.ctx, req("c1", "demo_fail", `{"text":"x"}`, nil)); err != nil || !res.IsError {
		t.Errorf("demo_fail (no rule, free): %s %v", res.Body, err)
	}
	if _, err := cat.ReadResource(context.Background(), "notes://today"); err != nil {
		t.Errorf("read notes://today (no rule, free): %v", err)
	}
}
