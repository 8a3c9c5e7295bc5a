package pricing_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/capvend/capvend/pricing"
)

func per(arg string, sats, msat int64) *pricing.PerEntry {
	return &pricing.PerEntry{Arg: arg, Sats: sats, Msat: msat}
}

// The messages are the configuration's: capvend prints them as they are,
// so each is checked to the letter.
func TestPricesCheckNamesTheKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prices pricing.Prices
		want   string
	}{
		{"per without max", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerKB: per("text", 1, 0)}}},
			"up.tools.t.max_sats: required with per_kb: the most one call may cost (or set max_msat)"},
		{"two per", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerKB: per("text", 1, 0), PerItem: per("ids", 1, 0), MaxSats: 9}}},
			"up.tools.t.per_item: set at most one of per_unit, per_kb, per_item (per_kb is set)"},
		{"per without arg", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerUnit: per("", 1, 0), MaxSats: 9}}},
			"up.tools.t.per_unit.arg: required: the name of the argument to count"},
		{"per without price", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerUnit: per("n", 0, 0), MaxSats: 9}}},
			"up.tools.t.per_unit.sats: required: the positive price of one unit (or set msat)"},
		{"per negative", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerItem: per("n", 0, -5), MaxSats: 9}}},
			"up.tools.t.per_item.sats: cannot be negative (nor per_item.msat)"},
		{"two maxes", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PriceSats: 1, MaxSats: 9, MaxMsat: 9000}}},
			"up.tools.t.max_sats: set max_sats or max_msat, not both"},
		{"huge price", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PriceMsat: 2_100_000_000_000_000_001}}},
			"up.tools.t.price_sats: price is more than 21 million bitcoin"},
		{"min above max", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerKB: per("text", 1, 0), MinSats: 10, MaxSats: 9}}},
			"up.tools.t: min 10 sat is above max 9 sat"},
		{"negative quota", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PriceSats: 1, FreePerDay: -1}}},
			"up.tools.t.free_per_day: must be 0 or more, got -1"},
		{"quota on a free tool", pricing.Prices{Tools: map[string]pricing.Entry{"t": {FreePerDay: 3}}},
			"up.tools.t.free_per_day: needs a price: without one the tool is free anyway"},
		{"total without quota", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PriceSats: 1, FreePerDayTotal: 3}}},
			"up.tools.t.free_per_day_total: needs free_per_day: it bounds those free calls across all clients"},
		{"tool named like a prompt", pricing.Prices{Tools: map[string]pricing.Entry{"prompt:p": {PriceSats: 1}}},
			"up.tools.prompt:p: a tool name cannot start with prompt: or resource: (price prompts and resources under up.prompts, up.resources)"},
		{"prompt per kb", pricing.Prices{Prompts: map[string]pricing.Entry{"p": {PerKB: per("text", 1, 0), MaxSats: 9}}},
			"up.prompts.p.per_kb: per-argument prices are for tools only: set price_sats or price_msat"},
		{"resource min", pricing.Prices{Resources: map[string]pricing.Entry{"r://x": {MinMsat: 9}}},
			"up.resources.r://x.min_sats: min is for tools with a per-argument price: set price_sats or price_msat"},
		{"prompt max", pricing.Prices{Prompts: map[string]pricing.Entry{"p": {PriceSats: 1, MaxSats: 9}}},
			"up.prompts.p.max_sats: max is for tools with a per-argument price: set price_sats or price_msat"},
		{"prompt not idempotent", pricing.Prices{Prompts: map[string]pricing.Entry{"p": {PriceSats: 1, NotIdempotent: true}}},
			"up.prompts.p.not_idempotent: prompt gets and resource reads are always treated as idempotent"},
		{"empty resource name", pricing.Prices{Resources: map[string]pricing.Entry{"": {PriceSats: 1}}},
			"up.resources.: the resource name must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := tc.prices.Check("up")
			if len(errs) != 1 || errs[0].Error() != tc.want {
				t.Errorf("Check: %q\nwant: %q", errs, tc.want)
			}
			if _, err := tc.prices.Rules(); err == nil && !strings.Contains(tc.want, " name ") {
				t.Error("Rules accepted an entry Check refuses")
			}
		})
	}
}

func TestPricesCheckReportsInOrder(t *testing.T) {
	p := pricing.Prices{
		Tools:     map[string]pricing.Entry{"b": {PriceSats: -1}, "a": {PriceSats: -1}},
		Prompts:   map[string]pricing.Entry{"p": {MinSats: 1}},
		Resources: map[string]pricing.Entry{"r": {PriceSats: 1, PriceMsat: 1}},
	}
	errs, priced := p.Check("u")
	var fields []string
	for _, err := range errs {
		f, _, _ := strings.Cut(err.Error(), ": ")
		fields = append(fields, f)
	}
	if got, want := strings.Join(fields, " "), "u.tools.a.price_sats u.tools.b.price_sats u.prompts.p.min_sats u.resources.r.price_sats"; got != want || priced {
		t.Errorf("fields %q (want %q), priced %v", got, want, priced)
	}
}

func TestPricesCheckSaysWhetherAnythingIsPriced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prices pricing.Prices
		priced bool
	}{
		{"none", pricing.Prices{}, false},
		{"free entries", pricing.Prices{Tools: map[string]pricing.Entry{"t": {}}, Prompts: map[string]pricing.Entry{"p": {}}}, false},
		{"tool price", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PriceMsat: 1}}}, true},
		{"tool minimum", pricing.Prices{Tools: map[string]pricing.Entry{"t": {MinSats: 3}}}, true},
		{"tool per argument", pricing.Prices{Tools: map[string]pricing.Entry{"t": {PerItem: per("ids", 0, 500), MaxMsat: 100_000}}}, true},
		{"resource price", pricing.Prices{Resources: map[string]pricing.Entry{"r://{x}": {PriceSats: 2, FreePerDay: 10}}}, true},
	} {
		errs, priced := tc.prices.Check("u")
		if len(errs) > 0 || priced != tc.priced {
			t.Errorf("%s: %v, priced %v (want %v)", tc.name, errs, priced, tc.priced)
		}
	}
}

func TestPricesRules(t *testing.T) {
	rules, err := pricing.Prices{
		Tools: map[string]pricing.Entry{
			"search":  {PriceSats: 2, PerKB: per("text", 1, 0), MinSats: 3, MaxSats: 50},
			"mutate":  {PriceMsat: 1500, NotIdempotent: true, FreePerDay: 2, FreePerDayTotal: 100},
			"nothing": {},
		},
		Prompts:   map[string]pricing.Entry{"brief": {PriceSats: 3}},
		Resources: map[string]pricing.Entry{"r://{x}": {PriceMsat: 2000, FreePerDay: 10}},
	}.Rules()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]pricing.Rule{
		"search":                       {Price: 2000, Per: &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 1000}, Min: 3000, Max: 50_000},
		"mutate":                       {Price: 1500, NotIdempotent: true, FreePerDay: 2, FreePerDayTotal: 100},
		"nothing":                      {},
		pricing.PromptKey("brief"):     {Price: 3000},
		pricing.ResourceKey("r://{x}"): {Price: 2000, FreePerDay: 10},
	}
	if len(rules) != len(want) {
		t.Errorf("%d rules, want %d: %+v", len(rules), len(want), rules)
	}
	for k, w := range want {
		g, ok := rules[k]
		if !ok || g.Price != w.Price || g.Min != w.Min || g.Max != w.Max || g.FreePerDay != w.FreePerDay ||
			g.FreePerDayTotal != w.FreePerDayTotal || g.NotIdempotent != w.NotIdempotent || (g.Per == nil) != (w.Per == nil) || g.Per != nil && *g.Per != *w.Per {
			t.Errorf("%s: %+v, want %+v", k, g, w)
		}
	}
}

func TestPricesRulesNameTheEntry(t *testing.T) {
	_, err := pricing.Prices{Prompts: map[string]pricing.Entry{"p": {PerUnit: per("n", 1, 0)}}}.Rules()
	var fe *pricing.FieldError
	if err == nil || err.Error() != "prompts.p: per_unit: per-argument prices are for tools only: set price_sats or price_msat" ||
		!errors.As(err, &fe) || fe.Key != "per_unit" {
		t.Errorf("%v (field error %+v)", err, fe)
	}
}

func TestEntryMsat(t *testing.T) {
	for _, tc := range []struct {
		e    pricing.Entry
		want int64
	}{{pricing.Entry{PriceSats: 21}, 21_000}, {pricing.Entry{PriceMsat: 50_500}, 50_500}, {pricing.Entry{}, 0}} {
		if got := tc.e.Msat(); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc.e, got, tc.want)
		}
	}
}

func TestUnpricedValid(t *testing.T) {
	for u, want := range map[pricing.Unpriced]bool{"free": true, "refuse": true, "": false, "Free": false, "deny": false} {
		if u.Valid() != want {
			t.Errorf("%q: %v", u, !want)
		}
	}
}
