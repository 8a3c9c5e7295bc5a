package pricing_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/capvend/capvend/pricing"
)

// FuzzQuote evaluates arbitrary rules on arbitrary arguments: a rule the
// book accepts never panics, never quotes a negative price, and never one
// outside its listed range (so never above its Max, nor past MaxPrice); a
// refusal is always ErrBadArgument.
func FuzzQuote(f *testing.F) {
	f.Add(int64(1000), uint8(1), int64(2000), int64(0), int64(50_000), `{"text": "hello"}`)
	f.Add(int64(0), uint8(2), int64(500), int64(0), int64(100_000), `{"ids": [1, 2, 3]}`)
	f.Add(int64(0), uint8(3), int64(1000), int64(0), int64(0), `{"n": 2.5}`)
	f.Add(int64(0), uint8(3), int64(1<<62), int64(0), int64(0), `{"n": 1e999999999999}`)
	f.Add(int64(5), uint8(3), int64(7), int64(3), int64(9), `{"n": -0.0e-5}`)
	f.Add(int64(1), uint8(3), int64(1), int64(0), int64(0), `{"n": 18446744073709551615.5}`)
	f.Add(int64(21_000), uint8(0), int64(0), int64(0), int64(0), `null`)
	f.Fuzz(func(t *testing.T, base int64, kind uint8, per, min, max int64, args string) {
		r := pricing.Rule{Price: pricing.Msat(base), Min: pricing.Msat(min), Max: pricing.Msat(max)}
		kinds := []pricing.Kind{pricing.PerKB, pricing.PerItem, pricing.PerUnit}
		if k := int(kind) % 4; k > 0 {
			arg := map[pricing.Kind]string{pricing.PerKB: "text", pricing.PerItem: "ids", pricing.PerUnit: "n"}[kinds[k-1]]
			r.Per = &pricing.Per{Kind: kinds[k-1], Arg: arg, Price: pricing.Msat(per)}
		}
		b, err := pricing.NewBook(map[string]map[string]pricing.Rule{"s": {"t": r}})
		if err != nil {
			if r.Validate() == nil {
				t.Fatalf("NewBook refused a valid rule: %v", err)
			}
			return
		}
		lo, hi := b.Listed("s", "t")
		if lo < 0 || lo > hi || hi > pricing.MaxPrice || (r.Max > 0 && hi > r.Max) {
			t.Fatalf("listed %d-%d for %+v", lo, hi, r)
		}
		_ = pricing.CapAmount(lo, hi)
		q, err := b.Quote("s", "t", json.RawMessage(args))
		if err != nil {
			if !errors.Is(err, pricing.ErrBadArgument) {
				t.Fatalf("error %v is not ErrBadArgument", err)
			}
			return
		}
		if q.Price < 0 || q.Price < lo || q.Price > hi || q.Price < r.Min {
			t.Fatalf("price %d outside %d-%d (min %d) for %+v on %q", q.Price, lo, hi, r.Min, r, args)
		}
		if q.Description == "" || strings.Contains(q.Description, "-") {
			t.Fatalf("description %q", q.Description)
		}
	})
}
