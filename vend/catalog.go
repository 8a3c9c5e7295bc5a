package vend

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/capvend/capvend/pricing"
)

// Catalog is what the fronts serve of the upstreams' prompts and
// resources outside CallItem: the lists, and the gets and reads of free
// ones (a priced one is sold through CallTool). The fronts' own Catalog
// interfaces (mcpfront.Catalog, ctxvm.Catalog) have these methods.
type Catalog interface {
	Prompts() []Prompt
	Resources() []Resource
	ResourceTemplates() []ResourceTemplate
	GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error)
	ReadResource(ctx context.Context, uri string) (json.RawMessage, error)
}

// Offered returns c as v offers it, the one place the fronts' free
// prompts and resources pass: its lists without the items the price book
// does not offer (see UnpricedPolicy; a resource template is kept when a
// rule may apply to a URI it matches), and its gets and reads refused, as
// an *InvalidParamsError, for an item not offered and for a resource URI
// not in normal form (see normalURI). Items no upstream lists are left
// to c. With a price book that refuses nothing, the lists are c's own.
func (v *Vendor) Offered(c Catalog) Catalog { return offeredCatalog{v: v, c: c} }

type offeredCatalog struct {
	v *Vendor
	c Catalog
}

// policy is the price book's UnpricedPolicy when it refuses anything.
func (o offeredCatalog) policy() (UnpricedPolicy, bool) {
	up, ok := o.v.book().(UnpricedPolicy)
	return up, ok && up.RefusesUnpriced()
}

func (o offeredCatalog) Prompts() []Prompt {
	ps := o.c.Prompts()
	if _, ok := o.policy(); !ok {
		return ps
	}
	out := make([]Prompt, 0, len(ps))
	for _, p := range ps {
		if o.offers(ItemPrompt, p.Name) {
			out = append(out, p)
		}
	}
	return out
}

func (o offeredCatalog) Resources() []Resource {
	rs := o.c.Resources()
	if _, ok := o.policy(); !ok {
		return rs
	}
	out := make([]Resource, 0, len(rs))
	for _, r := range rs {
		if o.offers(ItemResource, r.URI) {
			out = append(out, r)
		}
	}
	return out
}

func (o offeredCatalog) ResourceTemplates() []ResourceTemplate {
	ts := o.c.ResourceTemplates()
	up, ok := o.policy()
	items, isItems := o.v.cfg.Tools.(ItemSource)
	if !ok || !isItems {
		return ts
	}
	out := make([]ResourceTemplate, 0, len(ts))
	for _, t := range ts {
		it, listed := items.ResourceItem(t.URITemplate)
		if !listed || up.Unpriced(it.Server) != pricing.UnpricedRefuse || up.MayMatch(it.Server, t.URITemplate) {
			out = append(out, t)
		}
	}
	return out
}

// offers reports whether a listed item is offered: not refused as not
// for sale (an item v does not know is left to the Catalog).
func (o offeredCatalog) offers(kind ItemKind, name string) bool {
	_, err := o.v.lookup(kind, name)
	return err == nil || errors.Is(err, errNotListed)
}

// refusal is why a get or read of the item is refused, nil if it is not.
func (o offeredCatalog) refusal(kind ItemKind, name string) error {
	_, err := o.v.lookup(kind, name)
	var ip *InvalidParamsError
	switch {
	case err == nil, errors.Is(err, errNotListed):
		return nil
	case errors.As(err, &ip):
		return ip
	}
	return &InvalidParamsError{Tool: name, Reason: "unknown " + string(kind) + " (not for sale): " + name}
}

func (o offeredCatalog) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	if err := o.refusal(ItemPrompt, name); err != nil {
		return nil, err
	}
	return o.c.GetPrompt(ctx, name, args)
}

func (o offeredCatalog) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	if err := o.refusal(ItemResource, uri); err != nil {
		return nil, err
	}
	return o.c.ReadResource(ctx, uri)
}
