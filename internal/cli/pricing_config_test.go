package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capvend/capvend/pricing"
)

func TestExampleConfigPrices(t *testing.T) {
	cfg, err := parseConfig(filepath.Join(t.TempDir(), "capvend.yaml"), exampleConfig, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.PriceBook()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tool, args string
		price      pricing.Msat
		idempotent bool
		free       int
		cap        string
	}{
		{"forecast", `{}`, 21_000, true, 0, "21"},
		{"alert_subscribe", `{}`, 50_500, false, 0, "51"},
		{"history", `{"days": 7}`, 7000, true, 0, "2-100"},
		{"history", `{}`, 2000, true, 0, "2-100"},
		{"summarize", `{"text": "` + strings.Repeat("x", 3000) + `"}`, 5000, true, 0, "3-50"},
		{"batch_lookup", `{"ids": [1, 2, 3]}`, 1500, true, 0, "0-100"},
		{"current", `{}`, 1000, true, 5, "1"},
		{"unlisted", `{}`, 0, true, 0, "0"},
	} {
		q, err := b.Quote("weather", tc.tool, json.RawMessage(tc.args))
		lo, hi := b.Listed("weather", tc.tool)
		if err != nil || q.Price != tc.price || q.Idempotent != tc.idempotent || q.FreePerDay != tc.free || pricing.CapAmount(lo, hi) != tc.cap {
			t.Errorf("%s %s: %+v %v, listed %q", tc.tool, tc.args, q, err, pricing.CapAmount(lo, hi))
		}
	}
}

func TestExampleConfigPricesPromptsAndResources(t *testing.T) {
	cfg, err := parseConfig(filepath.Join(t.TempDir(), "capvend.yaml"), exampleConfig, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.PriceBook()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key   string
		price pricing.Msat
		free  int
	}{
		{pricing.PromptKey("daily_briefing"), 3_000, 0},
		{pricing.ResourceKey("weather://stations"), 1_500, 0},
		{pricing.ResourceKey("weather://radar/{region}"), 2_000, 10},
		{pricing.PromptKey("forecast"), 0, 0}, // the tool's price is not the prompt's
		{"daily_briefing", 0, 0},              // nor the prompt's the tool's
	} {
		q, err := b.Quote("weather", tc.key, json.RawMessage(`{}`))
		if err != nil || q.Price != tc.price || q.FreePerDay != tc.free || !q.Idempotent {
			t.Errorf("%s: %+v %v", tc.key, q, err)
		}
	}
}

func TestItemConfigErrorsNameTheField(t *testing.T) {
	conf := func(section, name, item string) string {
		return "cashu:\n  mints: [http://m]\nupstreams:\n  - name: a\n    command: x\n    " + section + ":\n      " + name + ": " + item + "\n"
	}
	for _, tc := range []struct {
		name, section, item string
		want                []string
	}{
		{"prompt per kb", "prompts", "{per_kb: {arg: text, sats: 1}, max_sats: 9}", []string{"upstreams[0].prompts.p.per_kb", "per-argument prices are for tools only"}},
		{"resource per unit", "resources", "{per_unit: {arg: n, sats: 1}, max_sats: 9}", []string{"upstreams[0].resources.p.per_unit", "for tools only"}},
		{"prompt max", "prompts", "{price_sats: 1, max_sats: 9}", []string{"upstreams[0].prompts.p.max_sats", "for tools"}},
		{"resource min", "resources", "{min_msat: 9}", []string{"upstreams[0].resources.p.min_sats", "for tools"}},
		{"prompt not idempotent", "prompts", "{price_sats: 1, not_idempotent: true}", []string{"upstreams[0].prompts.p.not_idempotent", "idempotent"}},
		{"prompt both amounts", "prompts", "{price_sats: 1, price_msat: 5}", []string{"upstreams[0].prompts.p.price_sats", "not both"}},
		{"resource negative", "resources", "{price_sats: -1}", []string{"upstreams[0].resources.p.price_sats", "negative"}},
		{"quota on a free prompt", "prompts", "{free_per_day: 3}", []string{"upstreams[0].prompts.p.free_per_day", "needs a price"}},
		{"unknown key", "prompts", "{price_sat: 1}", []string{`unknown field "price_sat" in a tool`}},
		{"tool named like a prompt", "tools", "{price_sats: 1}", []string{"upstreams[0].tools.prompt:p", "cannot start with prompt:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "p"
			if tc.section == "tools" {
				name = `"prompt:p"`
			}
			_, err := parseConfig("capvend.yaml", []byte(conf(tc.section, name, tc.item)), func(string) string { return "" })
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestItemPriceNeedsABackend(t *testing.T) {
	y := "upstreams:\n  - name: a\n    command: x\n    prompts:\n      p: {price_sats: 1}\n"
	_, err := parseConfig("capvend.yaml", []byte(y), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "no payment backend") {
		t.Fatalf("%v", err)
	}
}

func TestToolConfigErrorsNameTheField(t *testing.T) {
	conf := func(tool string) string {
		return "cashu:\n  mints: [http://m]\nupstreams:\n  - name: a\n    command: x\n    tools:\n      t: " + tool + "\n"
	}
	for _, tc := range []struct {
		name, tool string
		want       []string
	}{
		{"per without max", "{per_kb: {arg: text, sats: 1}}", []string{"upstreams[0].tools.t.max_sats", "required with per_kb"}},
		{"two per", "{per_kb: {arg: text, sats: 1}, per_item: {arg: ids, sats: 1}, max_sats: 9}", []string{"upstreams[0].tools.t.per_item", "at most one of per_unit, per_kb, per_item"}},
		{"per without arg", "{per_unit: {sats: 1}, max_sats: 9}", []string{"upstreams[0].tools.t.per_unit.arg", "required"}},
		{"per without price", "{per_unit: {arg: n}, max_sats: 9}", []string{"upstreams[0].tools.t.per_unit.sats", "positive price of one unit"}},
		{"per with both", "{per_unit: {arg: n, sats: 1, msat: 5}, max_sats: 9}", []string{"upstreams[0].tools.t.per_unit.sats", "not both"}},
		{"per negative", "{per_item: {arg: n, msat: -5}, max_sats: 9}", []string{"upstreams[0].tools.t.per_item.sats", "negative"}},
		{"per unknown key", "{per_kb: {argument: text, sats: 1}, max_sats: 9}", []string{`unknown field "argument" in a per-argument price`, "arg, msat, sats"}},
		{"two maxes", "{price_sats: 1, max_sats: 9, max_msat: 9000}", []string{"upstreams[0].tools.t.max_sats", "max_sats or max_msat, not both"}},
		{"negative min", "{price_sats: 1, min_msat: -1}", []string{"upstreams[0].tools.t.min_sats", "negative"}},
		{"min above max", "{per_kb: {arg: text, sats: 1}, min_sats: 10, max_sats: 9}", []string{"upstreams[0].tools.t", "min 10 sat is above max 9 sat"}},
		{"price above max", "{price_sats: 10, max_sats: 9}", []string{"upstreams[0].tools.t", "above max"}},
		{"huge max", "{price_sats: 1, max_sats: 2100000000000001}", []string{"upstreams[0].tools.t.max_sats", "21 million"}},
		{"negative quota", "{price_sats: 1, free_per_day: -1}", []string{"upstreams[0].tools.t.free_per_day", "0 or more"}},
		{"quota on a free tool", "{free_per_day: 3}", []string{"upstreams[0].tools.t.free_per_day", "needs a price"}},
		{"unknown tool key", "{price_sat: 1}", []string{`unknown field "price_sat" in a tool`, "per_kb", "free_per_day"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig("capvend.yaml", []byte(conf(tc.tool)), func(string) string { return "" })
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestToolConfigAccepted(t *testing.T) {
	for _, tool := range []string{
		"{price_msat: 1500}",
		"{per_item: {arg: ids, msat: 500}, max_msat: 100000}",
		"{price_sats: 2, per_kb: {arg: text, sats: 1}, min_sats: 3, max_sats: 50}",
		"{per_unit: {arg: n, sats: 1}, max_sats: 5, not_idempotent: true, free_per_day: 2}",
		"{min_sats: 3}",
		"{}",
	} {
		y := "cashu:\n  mints: [http://m]\nupstreams:\n  - name: a\n    command: x\n    tools:\n      t: " + tool + "\n"
		cfg, err := parseConfig("capvend.yaml", []byte(y), func(string) string { return "" })
		if err != nil {
			t.Errorf("%s: %v", tool, err)
			continue
		}
		if _, err := cfg.PriceBook(); err != nil {
			t.Errorf("%s: PriceBook: %v", tool, err)
		}
	}
}

func TestPerArgumentPriceNeedsABackend(t *testing.T) {
	y := "upstreams:\n  - name: a\n    command: x\n    tools:\n      t: {per_item: {arg: ids, msat: 1}, max_sats: 1}\n"
	_, err := parseConfig("capvend.yaml", []byte(y), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "no payment backend") {
		t.Fatalf("%v", err)
	}
}
