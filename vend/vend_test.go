package vend_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/capvend/capvend/vend"
)

func TestMsatFormatting(t *testing.T) {
	for _, tc := range []struct {
		m    vend.Msat
		want string
	}{
		{0, "0.000"}, {1, "0.001"}, {21_000, "21.000"}, {21_500, "21.500"}, {-1, "-0.001"},
		{-21_001, "-21.001"}, {math.MaxInt64, "9223372036854775.807"}, {math.MinInt64, "-9223372036854775.808"},
	} {
		if got := string(tc.m.AppendSats(nil)); got != tc.want {
			t.Errorf("%d: %q, want %q", int64(tc.m), got, tc.want)
		}
	}
	if vend.Msat(21_001).SatsCeil() != 22 || vend.Msat(21_000).SatsCeil() != 21 || vend.Msat(21_999).Sats() != 21 {
		t.Fatal("rounding")
	}
	if _, err := vend.FromSats(-1); err == nil {
		t.Fatal("negative accepted")
	}
	if _, err := vend.FromSats(math.MaxInt64 / 999); err == nil {
		t.Fatal("overflow accepted")
	}
	if m, err := vend.FromSats(21); err != nil || m != 21_000 {
		t.Fatal(m, err)
	}
}

func TestCallStateMachine(t *testing.T) {
	path := []vend.CallState{vend.CallQuoted, vend.CallAwaitingPayment, vend.CallPaid, vend.CallExecuting, vend.CallFailed, vend.CallRefunded}
	for i := 0; i+1 < len(path); i++ {
		if !path[i].CanTransition(path[i+1]) {
			t.Errorf("%s -> %s refused", path[i], path[i+1])
		}
	}
	for _, bad := range [][2]vend.CallState{
		{vend.CallQuoted, vend.CallPaid}, {vend.CallAwaitingPayment, vend.CallExecuting},
		{vend.CallDelivered, vend.CallRefunded}, {vend.CallExpired, vend.CallPaid}, {vend.CallPaid, vend.CallDelivered},
		{vend.CallExecuting, vend.CallExecuting},
	} {
		if bad[0].CanTransition(bad[1]) {
			t.Errorf("%s -> %s allowed", bad[0], bad[1])
		}
	}
	for _, s := range vend.CallStates() {
		if !s.Valid() {
			t.Errorf("%s invalid", s)
		}
		final := s == vend.CallDelivered || s == vend.CallRefunded || s == vend.CallExpired || s == vend.CallCanceled
		if s.Final() != final {
			t.Errorf("%s final=%v", s, s.Final())
		}
	}
	if vend.PaymentSettled.CanTransition(vend.PaymentCanceled) || !vend.PaymentAccepted.CanTransition(vend.PaymentCanceled) {
		t.Fatal("payment transitions")
	}
}

func TestCanonicalHash(t *testing.T) {
	h := func(method, params string) string {
		t.Helper()
		s, err := vend.CanonicalHash(method, json.RawMessage(params))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := h("tools/call", `{"name":"echo","arguments":{"text":"hi","n":2}}`)
	for _, same := range []string{
		`{"arguments":{"n":2,"text":"hi"},"name":"echo"}`,
		` { "name" : "echo", "arguments" : { "text" : "hi", "n" : 2.0 } } `,
		`{"name":"echo","arguments":{"text":"hi","n":2},"_meta":{"progressToken":7,"cashu":"cashuB..."}}`,
		`{"name":"echo","arguments":{"text":"hi","n":2e0}}`,
	} {
		if got := h("tools/call", same); got != base {
			t.Errorf("%s hashes differently", same)
		}
	}
	for _, differ := range []string{
		`{"name":"echo","arguments":{"text":"hi","n":3}}`,
		`{"name":"echo","arguments":{"text":"hi ","n":2}}`,
		`{"name":"echo","arguments":{"text":"hi","n":2,"_meta":{}}}`, // only the top-level _meta is dropped
		`{"name":"echo2","arguments":{"text":"hi","n":2}}`,
	} {
		if got := h("tools/call", differ); got == base {
			t.Errorf("%s hashes the same", differ)
		}
	}
	if h("prompts/get", `{"name":"echo","arguments":{"text":"hi","n":2}}`) == base {
		t.Error("method not hashed")
	}
	if len(base) != 64 || h("ping", "") == "" {
		t.Error("hash form")
	}
	for _, bad := range []string{`{`, `{"a":1} {"b":2}`, `{"a":01}`} {
		if _, err := vend.CanonicalHash("x", json.RawMessage(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func FuzzCanonicalHash(f *testing.F) {
	for _, s := range []string{`{"name":"echo","arguments":{"a":[1,2,{"b":null}]}}`, `[]`, `"x"`, `1e400`, `{"_meta":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, params string) {
		h1, err := vend.CanonicalHash("tools/call", json.RawMessage(params))
		if err != nil {
			return
		}
		// Re-encoding the parsed value (numbers kept verbatim) must
		// hash the same.
		dec := json.NewDecoder(strings.NewReader(params))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return
		}
		b, _ := json.MarshalIndent(v, " ", "  ")
		h2, err := vend.CanonicalHash("tools/call", b)
		if err != nil || h1 != h2 {
			t.Fatalf("%q -> %s, re-encoded %s -> %s (%v)", params, h1, b, h2, err)
		}
	})
}

// FuzzParseArgs: the strict arguments parser never panics; what it
// accepts it re-encodes to a fixed point that hashes as the input did.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}]}`, `{"a":1,"A":2}`, `{"a":1.50e3,"s":"<\u00e9>"}`, `null`, ``, `{"a":{"a":{"a":{}}}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		out, err := vend.ParseArgsForTest(json.RawMessage(args))
		if err != nil {
			return
		}
		again, err := vend.ParseArgsForTest(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("%q -> %s -> %s %v", args, out, again, err)
		}
		if strings.TrimSpace(args) == "" || strings.TrimSpace(args) == "null" {
			return
		}
		h1, err1 := vend.CanonicalHash("tools/call", json.RawMessage(`{"arguments":`+args+`}`))
		h2, err2 := vend.CanonicalHash("tools/call", json.RawMessage(`{"arguments":`+string(out)+`}`))
		if (err1 == nil) != (err2 == nil) || h1 != h2 {
			t.Fatalf("%q hashes %s %v, its encoding %s %s %v", args, h1, err1, out, h2, err2)
		}
	})
}
