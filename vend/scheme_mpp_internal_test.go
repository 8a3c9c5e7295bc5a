package vend

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"
)

// FuzzParseMPP: an Authorization: Payment token never panics the parser,
// and one that parses names the payment hash of its own preimage. The
// seed is a credential of a challenge minted here, which round-trips.
func FuzzParseMPP(f *testing.F) {
	key := make([]byte, 32)
	pre := make([]byte, 32)
	pre[0] = 7
	sum := sha256.Sum256(pre)
	req := base64.RawURLEncoding.EncodeToString(jcs(mppRequest{Amount: "21", Currency: "sat",
		MethodDetails: mppMethodDetails{Invoice: "lnbcrt1", PaymentHash: hex.EncodeToString(sum[:])}}))
	ch := MPPChallenge{Realm: MPPRealm, Method: MPPMethod, Intent: MPPIntent, Request: req,
		Expires: time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}
	ch.ID = mppID(key, ch)
	b, _ := json.Marshal(map[string]any{"challenge": ch, "payload": map[string]string{"preimage": hex.EncodeToString(pre)}})
	seed := base64.RawURLEncoding.EncodeToString(b)
	if h, p, err := parseMPP(key, seed, time.Now()); err != nil || h != hex.EncodeToString(sum[:]) || p != hex.EncodeToString(pre) {
		f.Fatalf("the minted credential: %s %s %v", h, p, err)
	}
	f.Add(seed)
	f.Add("e30")
	f.Fuzz(func(t *testing.T, tok string) {
		h, p, err := parseMPP(key, tok, time.Now())
		if err != nil {
			return
		}
		raw, _ := hex.DecodeString(p)
		s := sha256.Sum256(raw)
		if hex.EncodeToString(s[:]) != h {
			t.Fatalf("accepted a preimage of another hash: %s %s", p, h)
		}
	})
}
