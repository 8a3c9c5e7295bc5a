package pricing_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/capvend/capvend/pricing"
)

func book(t testing.TB, rules map[string]pricing.Rule) *pricing.Book {
	t.Helper()
	b, err := pricing.NewBook(map[string]map[string]pricing.Rule{"s": rules})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFlatBook(t *testing.T) {
	b, err := pricing.NewBook(map[string]map[string]pricing.Rule{
		"weather": {"forecast": {Price: 21_000}, "subscribe": {Price: 50_500, NotIdempotent: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		server, tool string
		price        pricing.Msat
		idempotent   bool
		desc         string
	}{
		{"weather", "forecast", 21_000, true, "21 sat per call"},
		{"weather", "subscribe", 50_500, false, "50.5 sat per call"},
		{"weather", "free_tool", 0, true, "free"},
		{"other", "forecast", 0, true, "free"},
	} {
		q, err := b.Quote(tc.server, tc.tool, json.RawMessage(`{"x": 1}`))
		if err != nil || q.Price != tc.price || q.Idempotent != tc.idempotent || q.Description != tc.desc {
			t.Errorf("%s/%s: %+v %v", tc.server, tc.tool, q, err)
		}
	}
	if lo, hi := b.Listed("weather", "subscribe"); pricing.CapAmount(lo, hi) != "51" {
		t.Errorf("cap amount %q", pricing.CapAmount(lo, hi))
	}
	if pricing.CapAmount(10_000, 50_000) != "10-50" {
		t.Error("range")
	}
	if pricing.CapAmount(500, 1000) != "1" {
		t.Error("a range within one sat is one amount")
	}
}

func TestQuote(t *testing.T) {
	kb := &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 2000}
	items := &pricing.Per{Kind: pricing.PerItem, Arg: "ids", Price: 500}
	units := &pricing.Per{Kind: pricing.PerUnit, Arg: "days", Price: 1000}
	b := book(t, map[string]pricing.Rule{
		"summarize": {Price: 1000, Per: kb, Max: 50_000},
		"minmax":    {Price: 2000, Per: &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 1000}, Min: 3000, Max: 50_000},
		"batch":     {Per: items, Max: 100_000},
		"forecast":  {Per: units, Max: 10_000},
		"unbounded": {Per: units},
		"quota":     {Price: 1000, FreePerDay: 5, FreePerDayTotal: 50},
		"minonly":   {Min: 4000},
	})
	text := func(n int) string { return `{"text": "` + strings.Repeat("a", n) + `"}` }
	for _, tc := range []struct {
		name, tool, args string
		price            pricing.Msat
		desc             string // substring
	}{
		{"3 KB", "summarize", text(3 * 1024), 7000, "3 KB of text × 2 sat/KB + 1 sat = 7 sat"},
		{"partial KB rounds up", "summarize", text(1025), 5000, "2 KB of text"},
		{"one byte is a KB", "summarize", text(1), 3000, "1 KB"},
		{"empty string", "summarize", text(0), 1000, "0 KB"},
		{"UTF-8 bytes count", "summarize", `{"text": "` + strings.Repeat("é", 512) + `"}`, 3000, "1 KB"}, // 1024 bytes
		{"UTF-8 bytes over", "summarize", `{"text": "` + strings.Repeat("é", 513) + `"}`, 5000, "2 KB"},
		{"escaped string is decoded", "summarize", `{"text": "` + strings.Repeat(`\u00e9`, 513) + `"}`, 5000, "2 KB"},
		{"capped at max", "summarize", text(100 * 1024), 50_000, "= 201 sat, capped at 50 sat"},
		{"missing argument", "summarize", `{}`, 1000, "0 KB"},
		{"null argument", "summarize", `{"text": null}`, 1000, "0 KB"},
		{"no arguments", "summarize", ``, 1000, "0 KB"},
		{"raised to min", "minmax", `{}`, 3000, "= 2 sat, raised to the minimum 3 sat"},
		{"above min", "minmax", text(2048), 4000, "= 4 sat"},
		{"items", "batch", `{"ids": [1, 2, 3]}`, 1500, "3 items of ids × 0.5 sat/item = 1.5 sat"},
		{"one item", "batch", `{"ids": [[1, 2]]}`, 500, "1 item of ids"},
		{"no items", "batch", `{"ids": []}`, 0, "0 items"},
		{"items capped", "batch", `{"ids": [` + strings.Repeat("0,", 300) + `0]}`, 100_000, "capped at 100 sat"},
		{"units", "forecast", `{"days": 3}`, 3000, "3 units of days × 1 sat/unit = 3 sat"},
		{"fraction rounds up", "forecast", `{"days": 2.5}`, 3000, "3 units"},
		{"tiny fraction rounds up", "forecast", `{"days": 0.0001}`, 1000, "1 unit "},
		{"exponent", "forecast", `{"days": 2e0}`, 2000, "2 units"},
		{"negative exponent", "forecast", `{"days": 25E-1}`, 3000, "3 units"},
		{"whole with fraction zeros", "forecast", `{"days": 4.000}`, 4000, "4 units"},
		{"zero", "forecast", `{"days": 0}`, 0, "0 units"},
		{"minus zero", "forecast", `{"days": -0.0}`, 0, "0 units"},
		{"huge is capped", "forecast", `{"days": 1e400}`, 10_000, "capped at 10 sat"},
		{"huge integer is capped", "forecast", `{"days": 123456789012345678901234567890}`, 10_000, "capped"},
		{"unbounded saturates", "unbounded", `{"days": 1e30}`, pricing.MaxPrice, "over 18446744073709551615 units of days × 1 sat/unit = 2100000000000000 sat"},
		{"quota is reported, price stays", "quota", `{}`, 1000, "1 sat per call"},
		{"flat minimum", "minonly", `{}`, 4000, "4 sat per call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := b.Quote("s", tc.tool, json.RawMessage(tc.args))
			if err != nil {
				t.Fatal(err)
			}
			if q.Price != tc.price || !strings.Contains(q.Description, tc.desc) {
				t.Errorf("got %d msat %q, want %d msat and %q", q.Price, q.Description, tc.price, tc.desc)
			}
		})
	}
	if q, _ := b.Quote("s", "quota", nil); q.FreePerDay != 5 || q.FreePerDayTotal != 50 {
		t.Errorf("free per day %d", q.FreePerDay)
	}
}

func TestQuoteBadArguments(t *testing.T) {
	b := book(t, map[string]pricing.Rule{
		"kb":    {Per: &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 1}, Max: 10},
		"item":  {Per: &pricing.Per{Kind: pricing.PerItem, Arg: "ids", Price: 1}, Max: 10},
		"unit":  {Per: &pricing.Per{Kind: pricing.PerUnit, Arg: "n", Price: 1}, Max: 10},
		"flat":  {Price: 1},
		"other": {},
	})
	for _, tc := range []struct{ name, tool, args, want string }{
		{"number for text", "kb", `{"text": 5}`, "text must be a string"},
		{"object for text", "kb", `{"text": {"a": 1}}`, "text must be a string"},
		{"string for items", "item", `{"ids": "1,2"}`, "ids must be an array"},
		{"object for items", "item", `{"ids": {"0": 1}}`, "ids must be an array"},
		{"string for units", "unit", `{"n": "3"}`, "n must be a number"},
		{"bool for units", "unit", `{"n": true}`, "n must be a number"},
		{"negative units", "unit", `{"n": -1}`, "n must not be negative"},
		{"negative fraction", "unit", `{"n": -0.5}`, "n must not be negative"},
		{"negative tiny", "unit", `{"n": -1e-300}`, "n must not be negative"},
		{"not an object", "unit", `[1]`, "must be a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Quote("s", tc.tool, json.RawMessage(tc.args))
			if !errors.Is(err, pricing.ErrBadArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrBadArgument with %q", err, tc.want)
			}
		})
	}
	// Flat and free prices do not read the arguments at all.
	for _, tool := range []string{"flat", "other", "unknown"} {
		if _, err := b.Quote("s", tool, json.RawMessage(`[1]`)); err != nil {
			t.Errorf("%s: %v", tool, err)
		}
	}
}

func TestListed(t *testing.T) {
	per := &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 1000}
	b := book(t, map[string]pricing.Rule{
		"flat":      {Price: 21_000},
		"range":     {Price: 2000, Per: per, Min: 3000, Max: 50_000},
		"nobase":    {Per: per, Max: 100_000},
		"unbounded": {Price: 1000, Per: per},
		"minonly":   {Min: 4000},
	})
	for _, tc := range []struct {
		tool   string
		lo, hi pricing.Msat
		cap    string
	}{
		{"flat", 21_000, 21_000, "21"},
		{"range", 3000, 50_000, "3-50"},
		{"nobase", 0, 100_000, "0-100"},
		{"unbounded", 1000, pricing.MaxPrice, "1-2100000000000000"},
		{"minonly", 4000, 4000, "4"},
		{"unknown", 0, 0, "0"},
	} {
		lo, hi := b.Listed("s", tc.tool)
		if lo != tc.lo || hi != tc.hi || pricing.CapAmount(lo, hi) != tc.cap {
			t.Errorf("%s: %d-%d %q", tc.tool, lo, hi, pricing.CapAmount(lo, hi))
		}
	}
}

func TestRuleValidate(t *testing.T) {
	per := func(k pricing.Kind, arg string, p pricing.Msat) *pricing.Per {
		return &pricing.Per{Kind: k, Arg: arg, Price: p}
	}
	for _, tc := range []struct {
		name string
		r    pricing.Rule
		want string // "" valid
	}{
		{"free", pricing.Rule{}, ""},
		{"flat", pricing.Rule{Price: 1}, ""},
		{"per", pricing.Rule{Price: 1, Per: per(pricing.PerKB, "t", 1), Min: 1, Max: 5}, ""},
		{"negative price", pricing.Rule{Price: -1}, "price is negative"},
		{"negative min", pricing.Rule{Min: -1}, "min is negative"},
		{"negative max", pricing.Rule{Max: -1}, "max is negative"},
		{"huge", pricing.Rule{Price: pricing.MaxPrice + 1}, "21 million"},
		{"min above max", pricing.Rule{Min: 5, Max: 4}, "min 0.005 sat is above max"},
		{"price above max", pricing.Rule{Price: 5, Max: 4}, "above max"},
		{"bad kind", pricing.Rule{Per: per("byte", "t", 1)}, `unknown per-argument kind "byte"`},
		{"no arg", pricing.Rule{Per: per(pricing.PerItem, "", 1)}, "argument's name"},
		{"zero per", pricing.Rule{Per: per(pricing.PerItem, "t", 0)}, "must be positive"},
		{"negative per", pricing.Rule{Per: per(pricing.PerItem, "t", -5)}, "must be positive"},
		{"negative quota", pricing.Rule{Price: 1, FreePerDay: -1}, "negative"},
		{"quota on free tool", pricing.Rule{FreePerDay: 3}, "free anyway"},
		{"negative total quota", pricing.Rule{Price: 1, FreePerDay: 1, FreePerDayTotal: -1}, "negative"},
		{"total quota without a per-client one", pricing.Rule{Price: 1, FreePerDayTotal: 100}, "without free calls per client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
			_, berr := pricing.NewBook(map[string]map[string]pricing.Rule{"srv": {"tl": tc.r}})
			if (berr == nil) != (err == nil) || berr != nil && !strings.Contains(berr.Error(), "srv/tl") {
				t.Errorf("NewBook: %v", berr)
			}
		})
	}
}

func TestBookDoesNotShareRules(t *testing.T) {
	per := &pricing.Per{Kind: pricing.PerItem, Arg: "ids", Price: 1000}
	b := book(t, map[string]pricing.Rule{"t": {Per: per, Max: 100_000}})
	per.Price = 50_000
	if q, _ := b.Quote("s", "t", json.RawMessage(`{"ids": [1]}`)); q.Price != 1000 {
		t.Errorf("a changed Per changed the book: %d", q.Price)
	}
}

func TestResourceTemplates(t *testing.T) {
	b, err := pricing.NewBook(map[string]map[string]pricing.Rule{
		"ex": {
			pricing.ResourceKey("example://{name}"):       pricing.Rule{Price: 2_000},
			pricing.ResourceKey("example://readme"):       pricing.Rule{Price: 1_000}, // a URI, not a template
			pricing.ResourceKey("example://docs/{+path}"): pricing.Rule{Price: 3_000},
			pricing.ResourceKey("other://{x}"):            pricing.Rule{Price: 1_000},
			"example://{name}":                            pricing.Rule{Price: 9_000}, // a tool's key: not a resource
			pricing.PromptKey("{name}"):                   pricing.Rule{Price: 9_000},
		},
		"else": {pricing.ResourceKey("example://{id}"): pricing.Rule{Price: 1_000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		server, uri string
		want        []string
	}{
		{"ex", "example://readme", []string{"example://{name}"}},
		{"ex", "example://docs/a/b", []string{"example://docs/{+path}"}},
		{"ex", "other://1", []string{"other://{x}"}},
		{"ex", "nothing://1", nil},
		{"else", "example://readme", []string{"example://{id}"}},
		{"none", "example://readme", nil},
	} {
		if got := b.ResourceTemplates(tc.server, tc.uri); !slices.Equal(got, tc.want) {
			t.Errorf("ResourceTemplates(%s, %s) = %q, want %q", tc.server, tc.uri, got, tc.want)
		}
	}
}

// TestCaseVariantOfPricedArgumentIsRefused (issue 26, hole 3): a key that
// folds onto the priced argument's name the way Go's encoding/json folds
// (ASCII case, the Kelvin sign, the long s) is refused, never quoted the
// base price while an upstream reads it as the priced argument.
func TestCaseVariantOfPricedArgumentIsRefused(t *testing.T) {
	b, err := pricing.NewBook(map[string]map[string]pricing.Rule{"s": {
		"text": {Price: 2000, Per: &pricing.Per{Kind: pricing.PerKB, Arg: "text", Price: 1000}, Max: 1_000_000},
		"keys": {Price: 2000, Per: &pricing.Per{Kind: pricing.PerItem, Arg: "keys", Price: 1000}, Max: 1_000_000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 40*1024)
	for _, tc := range []struct {
		tool, args string
		refused    bool
	}{
		{"text", `{"TEXT":"` + big + `"}`, true},
		{"text", `{"Text":"` + big + `"}`, true},
		{"text", `{"text":"a","tExt":"` + big + `"}`, true},
		{"text", "{\"\u212aeys\":1,\"texts\":\"" + big + "\"}", false}, // no fold onto text
		{"keys", "{\"\u212aeys\":[1,2,3]}", true},                      // the Kelvin sign folds to k
		{"keys", `{"KEYS":[1,2,3]}`, true},
	} {
		_, err := b.Quote("s", tc.tool, json.RawMessage(tc.args))
		if tc.refused != errors.Is(err, pricing.ErrBadArgument) {
			t.Errorf("%s %.40s: %v", tc.tool, tc.args, err)
		}
	}
	long, err := pricing.NewBook(map[string]map[string]pricing.Rule{"s": {
		"t": {Price: 2000, Per: &pricing.Per{Kind: pricing.PerKB, Arg: "stext", Price: 1000}, Max: 1_000_000}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Quote("s", "t", json.RawMessage("{\"\u017ftext\":\""+big+"\"}")); !errors.Is(err, pricing.ErrBadArgument) {
		t.Errorf("the long s: %v", err)
	}
	q, err := b.Quote("s", "text", json.RawMessage(`{"text":"`+big+`","other":"x"}`))
	if err != nil || q.Price != 42000 {
		t.Errorf("the exact name: %+v %v", q, err)
	}
}
