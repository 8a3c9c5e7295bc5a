package vend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/capvend/capvend/pricing"
)

// storedItem returns what running call sends upstream: the item its
// recorded name leads to now, its recorded arguments, and the Binding of
// the two (which StartExecution checks against the call). Errors:
// errNoArguments, errItemGone, or a ledger error.
func (v *Vendor) storedItem(ctx context.Context, call *Call) (Item, json.RawMessage, Binding, error) {
	name, args, _, err := v.cfg.Ledger.CallArguments(ctx, call.ID)
	if errors.Is(err, ErrNotFound) {
		return Item{}, nil, Binding{}, fmt.Errorf("call %d: %w", call.ID, errNoArguments)
	}
	if err != nil {
		return Item{}, nil, Binding{}, err
	}
	t, ok := v.item(call.Kind.Or(), name)
	if !ok {
		return Item{}, nil, Binding{}, fmt.Errorf("call %d: %s %q: %w", call.ID, call.Kind.Or(), name, errItemGone)
	}
	if t.Kind == ItemResource && t.UpstreamName != call.Name && (call.Name == t.Name || slices.Contains(t.Templates, call.Name)) {
		// Still a key this URI may be priced under: the book changed
		// since the quote, not what is read.
		t.UpstreamName = call.Name
	}
	bind, err := bindingOf(&t, args)
	return t, args, bind, err
}

// bindingOf is what a call of t with args sends upstream.
func bindingOf(t *Item, args json.RawMessage) (Binding, error) {
	hash, err := CanonicalHash(method(t, args))
	if err != nil {
		return Binding{}, err
	}
	return Binding{Kind: t.Kind.Or(), Server: t.Server, Name: t.UpstreamName, ArgsHash: hash}, nil
}

// Tools returns the upstreams' tools with the prices clients see (the
// lowest price of a varying one).
func (v *Vendor) Tools() []Item {
	ts := v.cfg.Tools.Tools()
	book := v.book()
	out := make([]Item, 0, len(ts))
	for _, t := range ts {
		if !v.offered(&t) || !v.forSale(&t) {
			continue
		}
		lo, _ := book.Listed(t.Server, t.UpstreamName)
		t.Price = lo
		out = append(out, t)
	}
	if _, ok := v.creditLedger(); ok {
		t := v.topUpTool()
		t.Price, _ = v.listed(&t, "")
		out = append(out, t)
	}
	return out
}

// listed is the price book's Listed price of t under key, or a top-up's
// bounds (1 sat to Credit.MaxTopUp).
func (v *Vendor) listed(t *Item, key string) (lo, hi Msat) {
	if isTopUp(t) {
		return MsatPerSat, v.cfg.Credit.MaxTopUp
	}
	return v.book().Listed(t.Server, key)
}

func (v *Vendor) tool(name string) (Item, bool) {
	if _, ok := v.creditLedger(); ok && name == TopUpTool {
		return v.topUpTool(), true
	}
	for _, t := range v.cfg.Tools.Tools() {
		if t.Name == name {
			return t, v.offered(&t) && v.forSale(&t)
		}
	}
	return Item{}, false
}

// UnpricedPolicy is an optional ability of a PriceBook (pricing.Book has
// it): what an item without a rule of its own is. A server whose
// Unpriced is pricing.UnpricedRefuse offers only the items its book has
// a rule for (a free rule names an item offered free): the others are
// neither listed nor sold, on every front. Without it, every item is
// offered (an item without a rule is free).
type UnpricedPolicy interface {
	// Unpriced returns what an item of server without a rule is.
	Unpriced(server string) pricing.Unpriced
	// RefusesUnpriced reports whether Unpriced is UnpricedRefuse for
	// any server.
	RefusesUnpriced() bool
	// Has reports whether the book has a rule for key on server.
	Has(server, key string) bool
	// MayMatch reports whether a resource rule of server may apply to a
	// URI that template (a listed URI template) matches.
	MayMatch(server, template string) bool
}

// forSale reports whether the price book offers t (see UnpricedPolicy):
// a resource when a rule applies to any key it may be priced under.
func (v *Vendor) forSale(t *Item) bool {
	up, ok := v.book().(UnpricedPolicy)
	if !ok || up.Unpriced(t.Server) != pricing.UnpricedRefuse {
		return true
	}
	if t.Kind.Or() != ItemResource {
		return up.Has(t.Server, priceKey(t))
	}
	if up.Has(t.Server, itemPriceKey(ItemResource, t.UpstreamName)) || up.Has(t.Server, itemPriceKey(ItemResource, t.Name)) {
		return true
	}
	return slices.ContainsFunc(t.Templates, func(k string) bool { return up.Has(t.Server, itemPriceKey(ItemResource, k)) })
}

// item returns what a request of kind asks for by name: a tool, or a
// prompt or resource (as a Tool, see Tool) if the ToolSource is an
// ItemSource that serves it.
func (v *Vendor) item(kind ItemKind, name string) (Item, bool) {
	t, err := v.lookup(kind, name)
	return t, err == nil
}

// errNotListed: no upstream lists the item asked for (lookup).
var errNotListed = errors.New("not listed")

// lookup is item, saying why not: an error wrapping ErrUnknownTool and
// errNotListed (no upstream lists it) or not (not for sale, see
// UnpricedPolicy), or an *InvalidParamsError (a resource URI not in
// normal form, see normalURI).
func (v *Vendor) lookup(kind ItemKind, name string) (Item, error) {
	if kind.Or() == ItemTool {
		t, ok := v.tool(name)
		if !ok {
			return Item{}, fmt.Errorf("%w: %q", ErrUnknownTool, name)
		}
		return t, nil
	}
	items, ok := v.cfg.Tools.(ItemSource)
	if !ok {
		return Item{}, fmt.Errorf("%w: %w: %s %q", ErrUnknownTool, errNotListed, kind, name)
	}
	var t Item
	switch kind {
	case ItemPrompt:
		t, ok = items.PromptItem(name)
	case ItemResource:
		if t, ok = items.ResourceItem(name); !ok {
			break
		}
		if n := normalURI(name); n != name && t.UpstreamName != name {
			return Item{}, &InvalidParamsError{Tool: name, Reason: "the URI is not in normal form (RFC 3986): read " + n}
		}
		t.InputSchema = nil // a read has no arguments
		v.priceKeys(&t)
		t.UpstreamName = v.resourceKey(&t)
	}
	if !ok {
		return Item{}, fmt.Errorf("%w: %w: %s %q", ErrUnknownTool, errNotListed, kind, name)
	}
	t.Kind, t.Name, t.Idempotent = kind, name, true
	if !v.forSale(&t) {
		return Item{}, fmt.Errorf("%w: %s %q is not for sale", ErrUnknownTool, kind, name)
	}
	return t, nil
}

// priceKeys adds to a resource's Templates the further keys it may be
// priced under: the URI itself, the price book's templates it matches
// (see TemplatePricer), and, when it reads as another URI once folded
// (see foldedURI), that URI and the book's templates matching it.
func (v *Vendor) priceKeys(t *Item) {
	add := func(k string) {
		if k != t.UpstreamName && !slices.Contains(t.Templates, k) {
			t.Templates = append(t.Templates, k)
		}
	}
	tp, _ := v.book().(TemplatePricer)
	uris := []string{t.Name}
	if f := foldedURI(t.Name); f != t.Name {
		uris = append(uris, f)
	}
	for _, uri := range uris {
		add(uri)
		if tp != nil {
			for _, k := range tp.ResourceTemplates(t.Server, uri) {
				add(k)
			}
		}
	}
}

// resourceKey is the key a resource is priced under: of its UpstreamName
// (a listed URI, or the template its ItemSource chose) and its Templates
// (see priceKeys), the most specific the price book prices
// (pricing.CompareSpecificity: the most literal characters, then the
// fewest variables), else UpstreamName (free). A URI's own price so wins
// over its templates', and a listed URI without a price of its own is
// priced by the most specific template it matches.
func (v *Vendor) resourceKey(t *Item) string {
	book := v.book()
	best := ""
	for _, k := range append([]string{t.UpstreamName}, t.Templates...) {
		if _, hi := book.Listed(t.Server, itemPriceKey(ItemResource, k)); hi > 0 && (best == "" || pricing.CompareSpecificity(k, best) < 0) {
			best = k
		}
	}
	if best == "" {
		return t.UpstreamName
	}
	return best
}

// priceKey is the name t's price is looked up by in the price book (and
// its daily free quota counted by): the tool's upstream name, or
// pricing.PromptKey, pricing.ResourceKey of it.
func priceKey(t *Item) string { return itemPriceKey(t.Kind, t.UpstreamName) }

// method is the JSON-RPC method a request for t is, and its params without
// _meta, for CanonicalHash.
func method(t *Item, args json.RawMessage) (string, json.RawMessage) {
	switch t.Kind {
	case ItemPrompt:
		p, _ := json.Marshal(map[string]json.RawMessage{"name": mustJSON(t.Name), "arguments": args})
		return "prompts/get", p
	case ItemResource:
		p, _ := json.Marshal(map[string]json.RawMessage{"uri": mustJSON(t.Name)})
		return "resources/read", p
	}
	p, _ := json.Marshal(map[string]json.RawMessage{"name": mustJSON(t.Name), "arguments": args})
	return "tools/call", p
}

// ItemPrice returns the least and most a request for the item of kind
// named name (a tool name, a prompt name, a resource URI or URI template)
// costs, for lists and announcements; 0, 0 for a free or unknown item.
func (v *Vendor) ItemPrice(kind ItemKind, name string) (lo, hi Msat) {
	t, ok := v.item(kind, name)
	if !ok {
		return 0, 0
	}
	return v.listed(&t, priceKey(&t))
}

// describe says what a call of t with args costs and why, for a client
// asked to pay price: the price book's description ("summarize: 3 KB of
// text × 2 sat/KB + 1 sat = 7 sat"). When the book would price the call
// differently now (it was replaced since the call was quoted), just the
// price the call was recorded with.
func (v *Vendor) describe(t *Item, args json.RawMessage, price Msat) string {
	if q, err := v.book().Quote(t.Server, priceKey(t), args); err == nil && q.Price == price && q.Description != "" {
		return t.Name + ": " + q.Description
	}
	return describe(t, price)
}

// describe is a call's price without its computation, for invoice memos.
func describe(t *Item, price Msat) string {
	return fmt.Sprintf("%s: %s", t.Name, price)
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// promptArgs returns a prompts/get arguments object (JSON) as the string
// map MCP defines it to be; an error if a value is not a string.
func promptArgs(args json.RawMessage) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(args, &raw); err != nil {
		return nil, errors.New("arguments must be a JSON object")
	}
	m := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("argument %q must be a string", k)
		}
		m[k] = s
	}
	return m, nil
}

// isErrorResult reports whether a CallToolResult has isError set.
func isErrorResult(body json.RawMessage) bool {
	var r struct {
		IsError bool `json:"isError"`
	}
	json.Unmarshal(body, &r)
	return r.IsError
}

// ListedPrice returns the least and most a call of t can cost, for tool
// lists and announcements.
func (v *Vendor) ListedPrice(t Item) (lo, hi Msat) {
	return v.listed(&t, t.UpstreamName)
}
