package cli

import (
	"fmt"

	"github.com/capvend/capvend/pricing"
)

// unpriced is what u's items without a price are under cfg.
func (c *Config) unpriced(u UpstreamConfig) pricing.Unpriced {
	if u.Unpriced != "" {
		return pricing.Unpriced(u.Unpriced)
	}
	return pricing.Unpriced(c.Pricing.Unpriced)
}

// Msat returns the tool's price per call in millisatoshis (the base price
// of a per-argument price; 0: free unless a per-argument price or a
// minimum is set). It is only meaningful once Validate accepted the
// configuration.
func (t ToolConfig) Msat() int64 { return t.entry().Msat() }

// entry is t for package pricing.
func (t ToolConfig) entry() pricing.Entry {
	return pricing.Entry{
		PriceSats: t.PriceSats, PriceMsat: t.PriceMsat,
		PerUnit: t.PerUnit.entry(), PerKB: t.PerKB.entry(), PerItem: t.PerItem.entry(),
		MinSats: t.MinSats, MinMsat: t.MinMsat, MaxSats: t.MaxSats, MaxMsat: t.MaxMsat,
		FreePerDay: t.FreePerDay, FreePerDayTotal: t.FreePerDayTotal, NotIdempotent: t.NotIdempotent,
	}
}

// entry is p for package pricing (nil: none).
func (p *PerConfig) entry() *pricing.PerEntry {
	if p == nil {
		return nil
	}
	return &pricing.PerEntry{Arg: p.Arg, Sats: p.Sats, Msat: p.Msat}
}

// prices are u's tools', prompts' and resources' prices for package
// pricing.
func (u UpstreamConfig) prices() pricing.Prices {
	entries := func(m map[string]ToolConfig) map[string]pricing.Entry {
		out := make(map[string]pricing.Entry, len(m))
		for name, t := range m {
			out[name] = t.entry()
		}
		return out
	}
	return pricing.Prices{Tools: entries(u.Tools), Prompts: entries(u.Prompts), Resources: entries(u.Resources)}
}

// PriceBook builds the price book of the upstreams' tools, prompts and
// resources (the latter under pricing.PromptKey and ResourceKey), with
// what their unpriced items are. It fails, naming the item, only on a
// configuration Validate refuses.
func (c *Config) PriceBook() (*pricing.Book, error) {
	rules, err := c.priceRules()
	if err != nil {
		return nil, err
	}
	return pricing.NewBook(rules, pricing.WithUnpriced(c.unpricedBy()))
}

// unpricedBy is what each upstream's items without a price are.
func (c *Config) unpricedBy() map[string]pricing.Unpriced {
	m := make(map[string]pricing.Unpriced, len(c.Upstreams))
	for _, u := range c.Upstreams {
		m[u.Name] = c.unpriced(u)
	}
	return m
}

// priceRules are the price rules of every upstream, by upstream name and
// tool (or item key).
func (c *Config) priceRules() (map[string]map[string]pricing.Rule, error) {
	rules := map[string]map[string]pricing.Rule{}
	for i, u := range c.Upstreams {
		m, err := u.prices().Rules()
		if err != nil {
			return nil, fmt.Errorf("upstreams[%d].%w", i, err)
		}
		rules[u.Name] = m
	}
	return rules, nil
}
