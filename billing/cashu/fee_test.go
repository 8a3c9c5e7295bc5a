package cashu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestInputFeesCountAgainstThePrice: with a mint charging input fees
// (NUT-02 input_fee_ppk), a token must cover price + fee; this is decided
// from the mint's keysets alone, before anything is recorded or swapped.
func TestInputFeesCountAgainstThePrice(t *testing.T) {
	var keysetCalls, other atomic.Int32
	mint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/keysets" {
			keysetCalls.Add(1)
			w.Write([]byte(`{"keysets":[{"id":"009a1f293253e41e","unit":"sat","active":true,"input_fee_ppk":400}]}`))
			return
		}
		other.Add(1)
		http.Error(w, "not in this test", http.StatusTeapot)
	}))
	defer mint.Close()
	ctx := context.Background()
	l, err := ledger.Open(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := New(Config{Mints: []string{mint.URL}, WalletDir: t.TempDir(), AcceptTokens: true}, l)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte("args"))
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "c", RequestID: "1", Server: "s", Name: "t",
		ArgsHash: hex.EncodeToString(h[:]), Price: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	// 8 + 2 = 10 sat in two proofs: fee ceil(800/1000) = 1 sat, so 10
	// does not cover a 10 sat price.
	tok := serialize(t, true, mint.URL, fakeProofs(t, 8, 2))
	_, err = b.AcceptToken(ctx, c.ID, c.Price, tok)
	if !errors.Is(err, ErrTokenUnderpaid) || !errors.Is(err, vend.ErrUnderpaid) {
		t.Fatalf("got %v, want ErrTokenUnderpaid", err)
	}
	if got, _ := l.Call(ctx, c.ID); got.State != vend.CallQuoted {
		t.Fatalf("call is %s: something was recorded", got.State)
	}
	if keysetCalls.Load() != 1 || other.Load() != 0 {
		t.Fatalf("mint calls: %d keysets, %d other", keysetCalls.Load(), other.Load())
	}
	// Keysets are cached.
	fee, err := b.inputFee(ctx, mint.URL, fakeProofs(t, 1, 1, 1))
	if err != nil || fee != 2 || keysetCalls.Load() != 1 {
		t.Fatalf("fee %d %v after %d keyset calls; want 2 (ceil 1200/1000) from the cache", fee, err, keysetCalls.Load())
	}
	// A keyset the mint does not list is refused.
	ps := fakeProofs(t, 1)
	ps[0].Id = "00ffffffffffffff"
	if _, err := b.inputFee(ctx, mint.URL, ps); !errors.Is(err, ErrMintRejected) {
		t.Fatalf("unknown keyset: %v", err)
	}
}
