package pricing_test

import (
	"testing"

	"github.com/capvend/capvend/pricing"
)

func TestBook(t *testing.T) {
	b := pricing.NewBook(map[string]map[string]pricing.Rule{
		"weather": {"forecast": {Price: 21_000}, "subscribe": {Price: 50_500, NotIdempotent: true}},
	})
	for _, tc := range []struct {
		server, tool string
		price        pricing.Msat
		idempotent   bool
	}{
		{"weather", "forecast", 21_000, true},
		{"weather", "subscribe", 50_500, false},
		{"weather", "free_tool", 0, true},
		{"other", "forecast", 0, true},
	} {
		p, idem, err := b.Price(tc.server, tc.tool, nil)
		if err != nil || p != tc.price || idem != tc.idempotent {
			t.Errorf("%s/%s: %d %v %v", tc.server, tc.tool, p, idem, err)
		}
	}
	if lo, hi := b.Listed("weather", "subscribe"); pricing.CapAmount(lo, hi) != "51" {
		t.Errorf("cap amount %q", pricing.CapAmount(lo, hi))
	}
	if pricing.CapAmount(10_000, 50_000) != "10-50" {
		t.Error("range")
	}
}
