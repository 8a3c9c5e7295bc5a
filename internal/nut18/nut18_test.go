package nut18_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/nut18"
)

// The example of NUT-18 itself (standard base64 with padding), and two
// requests cashu-ts 4.8.0 encoded (PaymentRequest.toEncodedRequest(),
// standard base64): a transport-less one like capvend's, and one with a
// post transport and a NUT-10 condition.
const (
	specExample  = "creqApWF0gaNhdGVub3N0cmFheKlucHJvZmlsZTFxeTI4d3VtbjhnaGo3dW45ZDNzaGp0bnl2OWtoMnVld2Q5aHN6OW1od2RlbjV0ZTB3ZmprY2N0ZTljdXJ4dmVuOWVlaHFjdHJ2NWhzenJ0aHdkZW41dGUwZGVoaHh0bnZkYWtxcWd5ZGFxeTdjdXJrNDM5eWtwdGt5c3Y3dWRoZGh1NjhzdWNtMjk1YWtxZWZkZWhrZjBkNDk1Y3d1bmw1YWeBgmFuYjE3YWloYjdhOTAxNzZhYQphdWNzYXRhbYF4Imh0dHBzOi8vbm9mZWVzLnRlc3RudXQuY2FzaHUuc3BhY2U="
	cashuTSPlain = "creqApmFpaGNhZmUwMDAxYWEVYXVjc2F0YW2CdWh0dHA6Ly8xMjcuMC4wLjE6MzMzOHgYaHR0cHM6Ly9taW50LmV4YW1wbGUuY29tYWR4GTIxIHNhdHMgdG8gY2FsbCBleF9zaGEyNTZhc/U="
	cashuTSFull  = "creqApmF0gaNhdGRwb3N0YWF3aHR0cHM6Ly9leGFtcGxlLmNvbS9wYXlhZ4GCYW5iMTdhaWhiN2E5MDE3NmFhCmF1Y3NhdGFtgXgiaHR0cHM6Ly9ub2ZlZXMudGVzdG51dC5jYXNodS5zcGFjZWVudXQxMKNha2RQMlBLYWRkMDJhYWF0gYJobG9ja3RpbWVqMTcwMDAwMDAwMA=="
)

func TestDecodeKnownEncoders(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     nut18.Request
	}{
		{"NUT-18 example", specExample, nut18.Request{ID: "b7a90176", Amount: 10, Unit: "sat",
			Mints: []string{"https://nofees.testnut.cashu.space"},
			Transports: []nut18.Transport{{Type: "nostr",
				Target: "nprofile1qy28wumn8ghj7un9d3shjtnyv9kh2uewd9hsz9mhwden5te0wfjkccte9curxven9eehqctrv5hszrthwden5te0dehhxtnvdakqqgydaqy7curk439ykptkysv7udhdhu68sucm295akqefdehkf0d495cwunl5",
				Tags:   [][]string{{"n", "17"}}}}}},
		{"cashu-ts, in-band", cashuTSPlain, nut18.Request{ID: "cafe0001", Amount: 21, Unit: "sat", SingleUse: true,
			Mints: []string{"http://127.0.0.1:3338", "https://mint.example.com"}, Description: "21 sats to call ex_sha256"}},
		{"cashu-ts, transport and NUT-10", cashuTSFull, nut18.Request{ID: "b7a90176", Amount: 10, Unit: "sat",
			Mints:      []string{"https://nofees.testnut.cashu.space"},
			Transports: []nut18.Transport{{Type: "post", Target: "https://example.com/pay", Tags: [][]string{{"n", "17"}}}},
			NUT10:      &nut18.NUT10{Kind: "P2PK", Data: "02aa", Tags: [][]string{{"locktime", "1700000000"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nut18.Decode(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, tc.want)
			}
			roundTrip(t, got)
		})
	}
}

// TestEncodeInBand: the request capvend sends in X-Cashu is url-safe
// unpadded base64 (NUT-18), carries every member it was given and no
// transport, and decodes back to itself.
func TestEncodeInBand(t *testing.T) {
	r := nut18.Request{ID: "cafe0001", Amount: 21, Unit: "sat", SingleUse: true,
		Mints: []string{"http://127.0.0.1:3338", "https://mint.example.com"}, Description: "21 sats to call ex_sha256"}
	s, err := nut18.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s, "creqA") || strings.ContainsAny(s, "+/=") {
		t.Fatalf("not creqA + unpadded base64url: %s", s)
	}
	// The same CBOR as cashu-ts writes for the same request: only the
	// key order (deterministic here) and the base64 alphabet may differ.
	ts, _ := nut18.Decode(cashuTSPlain)
	if !reflect.DeepEqual(ts, r) {
		t.Fatalf("cashu-ts's request decodes to %+v, want %+v", ts, r)
	}
	roundTrip(t, r)
}

func TestDecodeRefuses(t *testing.T) {
	ok, err := nut18.Encode(nut18.Request{Amount: 1, Unit: "sat"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"no prefix", strings.TrimPrefix(ok, "creqA")},
		{"version B", "creqB" + strings.TrimPrefix(ok, "creqA")},
		{"a token", "cashuBo2FteBtodHRwczovL21pbnQuZXhhbXBsZS5jb20"},
		{"not base64", "creqA!!!!"},
		{"not cbor", "creqA" + "_w"},
		{"amount without unit", "creqAoWFhFQ"},                           // {"a": 21}
		{"negative amount", "creqAomFhIGF1Y3NhdA"},                       // {"a": -1, "u": "sat"}
		{"duplicate key", "creqAomFhAWFhAg"},                             // {"a": 1, "a": 2}
		{"too long", "creqA" + strings.Repeat("A", nut18.MaxEncodedLen)}, // bounded before decoding
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r, err := nut18.Decode(tc.in); !errors.Is(err, nut18.ErrMalformed) {
				t.Fatalf("Decode(%q) = %+v, %v; want ErrMalformed", tc.in, r, err)
			}
		})
	}
	if _, err := nut18.Encode(nut18.Request{Amount: 5}); !errors.Is(err, nut18.ErrMalformed) {
		t.Fatalf("an amount without a unit encoded: %v", err)
	}
}

func roundTrip(t testing.TB, r nut18.Request) {
	t.Helper()
	s, err := nut18.Encode(r)
	if err != nil {
		t.Fatalf("encode %+v: %v", r, err)
	}
	back, err := nut18.Decode(s)
	if err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("round trip\n%+v\nbecame\n%+v", r, back)
	}
	again, _ := nut18.Encode(back)
	if again != s {
		t.Fatalf("encoding is not deterministic: %s then %s", s, again)
	}
}

// FuzzDecode: Decode never panics, and what it accepts round-trips.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{specExample, cashuTSPlain, cashuTSFull, "creqA", "creqAoA", "creqAoWFhFQ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := nut18.Decode(s)
		if err != nil {
			return
		}
		roundTrip(t, r)
	})
}
