package cashu

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/elnosh/gonuts/cashu"
)

// fakeProofs returns structurally valid (never mint-signed) proofs.
func fakeProofs(t testing.TB, amounts ...uint64) cashu.Proofs {
	t.Helper()
	ps := make(cashu.Proofs, len(amounts))
	for i, a := range amounts {
		s := make([]byte, 32)
		rand.Read(s)
		c := make([]byte, 33)
		rand.Read(c)
		c[0] = 2
		ps[i] = cashu.Proof{Amount: a, Id: "009a1f293253e41e", Secret: hex.EncodeToString(s), C: hex.EncodeToString(c)}
	}
	return ps
}

func serialize(t testing.TB, v4 bool, mint string, ps cashu.Proofs) string {
	t.Helper()
	var s string
	var err error
	if v4 {
		var tok cashu.TokenV4
		if tok, err = cashu.NewTokenV4(ps, mint, cashu.Sat, false); err == nil {
			s, err = tok.Serialize()
		}
	} else {
		var tok cashu.TokenV3
		if tok, err = cashu.NewTokenV3(ps, mint, cashu.Sat, false); err == nil {
			s, err = tok.Serialize()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParseToken(t *testing.T) {
	ps := fakeProofs(t, 1, 4, 16)
	for _, v4 := range []bool{false, true} {
		s := serialize(t, v4, "http://mint.example", ps)
		tok, err := ParseToken(s)
		if err != nil {
			t.Fatalf("v4=%v: %v", v4, err)
		}
		if tok.Amount != 21 || tok.Mint != "http://mint.example" || tok.Unit != "sat" || len(tok.Proofs) != 3 {
			t.Fatalf("v4=%v: parsed %+v", v4, tok)
		}
		if _, err := ParseToken("cashu:" + s); err != nil {
			t.Fatalf("with URI prefix: %v", err)
		}
	}
	// The ref does not depend on encoding or proof order.
	a, _ := ParseToken(serialize(t, false, "http://m", ps))
	rev := cashu.Proofs{ps[2], ps[0], ps[1]}
	b, _ := ParseToken(serialize(t, true, "http://m", rev))
	if a.Ref() != b.Ref() || len(a.Ref()) != 64 {
		t.Fatalf("refs differ: %s %s", a.Ref(), b.Ref())
	}

	v4usd := func() string {
		tok, _ := cashu.NewTokenV4(fakeProofs(t, 2), "http://m", cashu.Sat, false)
		tok.Unit = "usd"
		s, _ := tok.Serialize()
		return s
	}()
	usd, err := ParseToken(v4usd)
	if err != nil || usd.Unit != "usd" {
		t.Fatalf("usd token: %+v %v", usd, err)
	}

	dup := fakeProofs(t, 2)
	dup = append(dup, dup[0])
	notPow2 := fakeProofs(t, 3)
	badC := fakeProofs(t, 2)
	badC[0].C = "zz"
	locked := fakeProofs(t, 2)
	locked[0].Secret = `["P2PK",{"nonce":"00","data":"02aa"}]`
	twoMints := cashu.TokenV3{Token: []cashu.TokenV3Proof{{Mint: "http://a", Proofs: fakeProofs(t, 1)}, {Mint: "http://b", Proofs: fakeProofs(t, 1)}}, Unit: "sat"}
	twoMintsStr, _ := twoMints.Serialize()
	empty := cashu.TokenV3{Unit: "sat"}
	emptyStr, _ := empty.Serialize()
	for name, c := range map[string]struct {
		in   string
		want error
	}{
		"empty":       {"", ErrMalformedToken},
		"short":       {"cashu", ErrMalformedToken},
		"prefix only": {"cashuA", ErrMalformedToken},
		"not cashu":   {"lnbc1000n1...", ErrMalformedToken},
		"bad base64":  {"cashuB!!!!", ErrMalformedToken},
		"bad cbor":    {"cashuB" + strings.Repeat("A", 40), ErrMalformedToken},
		"bad json":    {"cashuAeyJ0b2tlbiI6", ErrMalformedToken},
		"huge":        {"cashuA" + strings.Repeat("A", maxTokenLen), ErrMalformedToken},
		"no proofs":   {emptyStr, ErrMalformedToken},
		"duplicate":   {serialize(t, false, "http://m", dup), ErrMalformedToken},
		"not pow2":    {serialize(t, false, "http://m", notPow2), ErrMalformedToken},
		"bad C":       {serialize(t, false, "http://m", badC), ErrMalformedToken},
		"two mints":   {twoMintsStr, ErrMalformedToken},
		"locked":      {serialize(t, false, "http://m", locked), ErrLockedToken},
		"no mint":     {serialize(t, false, "", fakeProofs(t, 1)), ErrMalformedToken},
	} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			_, err := ParseToken(c.in)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

func TestNormalizeMintURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:3338":    "http://127.0.0.1:3338",
		"HTTP://Mint.Example/":     "http://mint.example",
		"https://m.example/cashu/": "https://m.example/cashu",
	} {
		got, err := NormalizeMintURL(in)
		if err != nil || got != want {
			t.Errorf("%q: got %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "mint.example", "ftp://m", "http://", "http://m/?x=1", "http://u:p@m"} {
		if _, err := NormalizeMintURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzParseToken: the token decoding path never panics, and a token that
// parses round-trips: serialized again it parses to the same mint, amount
// and ref.
func FuzzParseToken(f *testing.F) {
	ps := fakeProofs(f, 1, 2, 8)
	f.Add(serialize(f, false, "http://127.0.0.1:3338", ps))
	f.Add(serialize(f, true, "http://127.0.0.1:3338", ps))
	f.Add("cashuA")
	f.Add("cashuB")
	f.Add("cashuAW10=")
	f.Add("cashuBo2F0gaJhaUgAmh8pMlPkHmFwgaNhYQFhc2VzZWNyZXRhY1ghAgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAYW1taHR0cDovL21hdXNhdA")
	f.Add(`cashuAeyJ0b2tlbiI6W3sibWludCI6Imh0dHA6Ly9tIiwicHJvb2ZzIjpbXX1dfQ`)
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) && !errors.Is(err, ErrLockedToken) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if tok.Amount == 0 || len(tok.Proofs) == 0 || tok.Mint == "" {
			t.Fatalf("accepted an empty token: %+v", tok)
		}
		again, err := tok.Serialize()
		if err != nil {
			t.Fatalf("re-serialize: %v", err)
		}
		tok2, err := ParseToken(again)
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if tok2.Mint != tok.Mint || tok2.Amount != tok.Amount || tok2.Ref() != tok.Ref() {
			t.Fatalf("round trip changed the token: %+v vs %+v", tok, tok2)
		}
	})
}
