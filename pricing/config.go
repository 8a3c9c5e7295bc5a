package pricing

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Prices is one server's price entries as a configuration states them:
// its tools', prompts' and resources' (by URI or URI template) entries by
// name. Rules turns them into a Book's rules, Check reports what is wrong
// with them. Errors name an entry by its configuration keys ("tools",
// "prompts", "resources", then the name and the entry's key at fault),
// so that a configuration can report them as they are.
type Prices struct {
	Tools, Prompts, Resources map[string]Entry
}

// Entry prices one tool, prompt or resource. Every amount is given in
// sats or in msat (not both): a call costs price + count × per-argument
// price, clamped to [min, max]. A per-argument price (at most one of
// PerUnit, PerKB, PerItem) requires a max, so every tool has a bounded
// listed price. Prompts and resources take only a flat price and the free
// quota.
type Entry struct {
	PriceSats, PriceMsat    int64     // the price per call (the base price with a per-argument price)
	PerUnit, PerKB, PerItem *PerEntry // the per-argument price, of the Kind PerUnit, PerKB, PerItem
	MinSats, MinMsat        int64     // the least a call costs
	MaxSats, MaxMsat        int64     // the most a call costs
	FreePerDay              int       // Rule.FreePerDay
	FreePerDayTotal         int       // Rule.FreePerDayTotal
	NotIdempotent           bool      // Rule.NotIdempotent
}

// PerEntry is a per-argument price: Sats or Msat for each unit of the
// argument Arg.
type PerEntry struct {
	Arg        string
	Sats, Msat int64
}

// FieldError is a bad entry setting: Key, the configuration key relative
// to the entry (e.g. "per_kb.arg"), and what is allowed there.
type FieldError struct{ Key, Msg string }

func (e *FieldError) Error() string { return e.Key + ": " + e.Msg }

// maxSats is 21 million bitcoin: no configured amount may exceed it.
const maxSats = 21_000_000 * 100_000_000

// Msat returns the entry's price per call in millisatoshis (the base price
// of a per-argument price; 0: free unless a per-argument price or a
// minimum is set). It is only meaningful for an entry Check accepts.
func (e Entry) Msat() int64 {
	if e.PriceMsat != 0 {
		return e.PriceMsat
	}
	return e.PriceSats * 1000
}

// Rules converts p to rules by a Book's key: the tool's name, PromptKey,
// ResourceKey. It fails on a bad entry (one Check reports), naming it
// ("tools.NAME: ..."), wrapping a *FieldError when one key is at fault;
// names it leaves to Check.
func (p Prices) Rules() (map[string]Rule, error) {
	m := map[string]Rule{}
	for name, e := range p.Tools {
		r, err := e.toolRule()
		if err != nil {
			return nil, fmt.Errorf("tools.%s: %w", name, err)
		}
		m[name] = r
	}
	for _, s := range p.items() {
		for name, e := range s.entries {
			r, err := e.itemRule()
			if err != nil {
				return nil, fmt.Errorf("%s.%s: %w", s.field, name, err)
			}
			m[s.key(name)] = r
		}
	}
	return m, nil
}

// Check reports every bad entry of p, one error each, in the order of the
// sections and names: "AT.tools.NAME.KEY: what is allowed there" (AT is
// where p stands in the configuration, e.g. "upstreams[0]"). It also says
// whether anything in p has a price.
func (p Prices) Check(at string) (errs []error, priced bool) {
	bad := func(field, msg string) { errs = append(errs, fmt.Errorf("%s: %s", field, msg)) }
	// badRule reports err, naming the key at fault.
	badRule := func(field string, err error) {
		var fe *FieldError
		if errors.As(err, &fe) {
			bad(field+"."+fe.Key, fe.Msg)
			return
		}
		bad(field, err.Error())
	}
	for _, name := range slices.Sorted(maps.Keys(p.Tools)) {
		tf := fmt.Sprintf("%s.tools.%s", at, name)
		r, err := p.Tools[name].toolRule()
		if err != nil {
			badRule(tf, err)
			continue
		}
		if strings.HasPrefix(name, promptPrefix) || strings.HasPrefix(name, resourcePrefix) {
			bad(tf, fmt.Sprintf("a tool name cannot start with prompt: or resource: (price prompts and resources under %s.prompts, %s.resources)", at, at))
		}
		if r.Price > 0 || r.Per != nil || r.Min > 0 {
			priced = true
		}
	}
	for _, s := range p.items() {
		for _, name := range slices.Sorted(maps.Keys(s.entries)) {
			tf := fmt.Sprintf("%s.%s.%s", at, s.field, name)
			if name == "" {
				bad(tf, fmt.Sprintf("the %s name must not be empty", strings.TrimSuffix(s.field, "s")))
				continue
			}
			r, err := s.entries[name].itemRule()
			if err != nil {
				badRule(tf, err)
				continue
			}
			if r.Price > 0 {
				priced = true
			}
		}
	}
	return errs, priced
}

// itemSection is p's prompts or resources: their key in the
// configuration, the book key of a name, and their entries.
type itemSection struct {
	field   string
	key     func(string) string
	entries map[string]Entry
}

// items are p's prompts and resources.
func (p Prices) items() []itemSection {
	return []itemSection{{"prompts", PromptKey, p.Prompts}, {"resources", ResourceKey, p.Resources}}
}

// amount converts an amount given in sats (key+"sats") or msat
// (key+"msat").
func amount(key string, sats, msat int64) (Msat, error) {
	switch {
	case sats < 0 || msat < 0:
		return 0, &FieldError{key + "sats", fmt.Sprintf("cannot be negative (nor %smsat)", key)}
	case sats != 0 && msat != 0:
		return 0, &FieldError{key + "sats", fmt.Sprintf("set %ssats or %smsat, not both", key, key)}
	case sats > maxSats || msat > maxSats*1000:
		return 0, &FieldError{key + "sats", "price is more than 21 million bitcoin"}
	case msat != 0:
		return Msat(msat), nil
	}
	return Msat(sats * 1000), nil
}

// per returns the entry's per-argument price and its key; an error if
// more than one is set.
func (e Entry) per() (p *PerEntry, key string, kind Kind, err error) {
	for _, c := range []struct {
		p    *PerEntry
		key  string
		kind Kind
	}{{e.PerUnit, "per_unit", PerUnit}, {e.PerKB, "per_kb", PerKB}, {e.PerItem, "per_item", PerItem}} {
		if c.p == nil {
			continue
		}
		if p != nil {
			return nil, "", "", &FieldError{c.key, fmt.Sprintf("set at most one of per_unit, per_kb, per_item (%s is set)", key)}
		}
		p, key, kind = c.p, c.key, c.kind
	}
	return p, key, kind, nil
}

// toolRule converts e to a tool's price rule and validates it. A
// *FieldError names the key at fault; other errors concern the entry as a
// whole.
func (e Entry) toolRule() (Rule, error) {
	var r Rule
	var err error
	if r.Price, err = amount("price_", e.PriceSats, e.PriceMsat); err != nil {
		return r, err
	}
	if r.Min, err = amount("min_", e.MinSats, e.MinMsat); err != nil {
		return r, err
	}
	if r.Max, err = amount("max_", e.MaxSats, e.MaxMsat); err != nil {
		return r, err
	}
	p, key, kind, err := e.per()
	if err != nil {
		return r, err
	}
	if p != nil {
		if p.Arg == "" {
			return r, &FieldError{key + ".arg", "required: the name of the argument to count"}
		}
		price, err := amount(key+".", p.Sats, p.Msat)
		switch {
		case err != nil:
			return r, err
		case price <= 0:
			return r, &FieldError{key + ".sats", "required: the positive price of one unit (or set msat)"}
		case r.Max == 0:
			return r, &FieldError{"max_sats", fmt.Sprintf("required with %s: the most one call may cost (or set max_msat)", key)}
		}
		r.Per = &Per{Kind: kind, Arg: p.Arg, Price: price}
	}
	switch {
	case e.FreePerDay < 0:
		return r, &FieldError{"free_per_day", fmt.Sprintf("must be 0 or more, got %d", e.FreePerDay)}
	case e.FreePerDay > 0 && r.Price == 0 && r.Per == nil && r.Min == 0:
		return r, &FieldError{"free_per_day", "needs a price: without one the tool is free anyway"}
	}
	switch {
	case e.FreePerDayTotal < 0:
		return r, &FieldError{"free_per_day_total", fmt.Sprintf("must be 0 or more, got %d", e.FreePerDayTotal)}
	case e.FreePerDayTotal > 0 && e.FreePerDay == 0:
		return r, &FieldError{"free_per_day_total", "needs free_per_day: it bounds those free calls across all clients"}
	}
	r.FreePerDay = e.FreePerDay
	r.FreePerDayTotal = e.FreePerDayTotal
	r.NotIdempotent = e.NotIdempotent
	return r, r.Validate()
}

// itemRule converts the entry of a prompt or resource: a flat price and
// free_per_day only.
func (e Entry) itemRule() (Rule, error) {
	if p, key, _, err := e.per(); err != nil || p != nil {
		if err == nil {
			err = &FieldError{key, "per-argument prices are for tools only: set price_sats or price_msat"}
		}
		return Rule{}, err
	}
	switch {
	case e.MinSats != 0 || e.MinMsat != 0:
		return Rule{}, &FieldError{"min_sats", "min is for tools with a per-argument price: set price_sats or price_msat"}
	case e.MaxSats != 0 || e.MaxMsat != 0:
		return Rule{}, &FieldError{"max_sats", "max is for tools with a per-argument price: set price_sats or price_msat"}
	case e.NotIdempotent:
		return Rule{}, &FieldError{"not_idempotent", "prompt gets and resource reads are always treated as idempotent"}
	}
	return e.toolRule()
}

// Valid reports whether u is one of UnpricedFree and UnpricedRefuse.
func (u Unpriced) Valid() bool { return u == UnpricedFree || u == UnpricedRefuse }
