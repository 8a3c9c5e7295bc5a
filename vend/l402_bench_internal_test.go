package vend

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"
)

// BenchmarkVerifyMacaroon: what checking an L402 credential costs without
// the ledger (signature, caveats, preimage): no network, no disk.
func BenchmarkVerifyMacaroon(b *testing.B) {
	key := make([]byte, 32)
	pre := make([]byte, 32)
	rand.Read(key)
	rand.Read(pre)
	hash := sha256.Sum256(pre)
	call := "tool " + hex.EncodeToString(hash[:]) + " ex_sha256"
	mac, err := mintL402(key, hash[:], 7, time.Now().Add(time.Hour), call)
	if err != nil {
		b.Fatal(err)
	}
	r := &CallRequest{Macaroon: mac, PaymentProof: hex.EncodeToString(pre)}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := verifyMacaroon(key, r, call, now); err != nil {
			b.Fatal(err)
		}
	}
}
