package ctxvm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/nbd-wtf/go-nostr"
)

// TestSignAndVerify: the server's signatures are what go-nostr checks, and
// verify agrees with go-nostr on good and bad events, with a client's key
// cached or not.
func TestSignAndVerify(t *testing.T) {
	s, err := New(Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://x"}})
	if err != nil {
		t.Fatal(err)
	}
	ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: `{"jsonrpc":"2.0","id":1,"result":{}}`}
	if err := s.sign(&ev); err != nil {
		t.Fatal(err)
	}
	if ok, _ := ev.CheckSignature(); !ok || !ev.CheckID() || ev.PubKey != s.PublicKey() || ev.Tags == nil {
		t.Fatalf("server event %v does not verify with go-nostr", ev)
	}

	sk := nostr.GeneratePrivateKey()
	good := func() nostr.Event {
		e := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}}, Content: `{"jsonrpc":"2.0","id":1,"method":"ping"}`}
		e.Sign(sk)
		return e
	}
	other := good()
	other.Sign(nostr.GeneratePrivateKey())
	for round := range 2 { // the second round with the client's key cached
		for _, tc := range []struct {
			name string
			mod  func(*nostr.Event)
			ok   bool
		}{
			{"good", func(*nostr.Event) {}, true},
			{"content changed", func(e *nostr.Event) { e.Content += " " }, false},
			{"tag changed", func(e *nostr.Event) { e.Tags = nostr.Tags{{"p", "x"}} }, false},
			{"id uppercase", func(e *nostr.Event) { e.ID = strings.ToUpper(e.ID) }, false},
			{"id short", func(e *nostr.Event) { e.ID = e.ID[:62] }, false},
			{"sig flipped", func(e *nostr.Event) { e.Sig = flipHex(e.Sig) }, false},
			{"id flipped", func(e *nostr.Event) { e.ID = flipHex(e.ID) }, false},
			{"sig not hex", func(e *nostr.Event) { e.Sig = "zz" + e.Sig[2:] }, false},
			{"sig of another key", func(e *nostr.Event) { e.Sig = other.Sig }, false},
			{"another pubkey", func(e *nostr.Event) { e.PubKey = other.PubKey }, false},
			{"pubkey not on the curve", func(e *nostr.Event) { e.PubKey = strings.Repeat("f", 64) }, false},
			{"pubkey not hex", func(e *nostr.Event) { e.PubKey = "zz" + e.PubKey[2:] }, false},
		} {
			e := good()
			tc.mod(&e)
			err := s.verify(&e)
			theirs, _ := e.CheckSignature()
			theirs = theirs && e.CheckID()
			if (err == nil) != tc.ok || (err == nil) != theirs {
				t.Errorf("round %d, %s: verify %v, go-nostr %v", round, tc.name, err, theirs)
			}
		}
	}
	if s.keys.get(other.PubKey) != nil {
		t.Error("a key cached whose event did not verify")
	}
	if s.keys.get(good().PubKey) == nil {
		t.Error("the client's key is not cached")
	}
}

// flipHex changes the last digit of a hex string to another hex digit.
func flipHex(s string) string {
	last := "0"
	if strings.HasSuffix(s, "0") {
		last = "1"
	}
	return s[:len(s)-1] + last
}

// TestBIP340KeySignsAsSchnorrSign: bip340Key signs byte for byte as
// btcec's schnorr.Sign with FastSign (keys whose point has an odd y and
// an even y alike), and its signatures verify.
func TestBIP340KeySignsAsSchnorrSign(t *testing.T) {
	parities := map[byte]int{}
	for i := range 300 {
		priv, err := btcec.NewPrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		parities[priv.PubKey().SerializeCompressed()[0]]++
		k := newBIP340Key(priv)
		hash := sha256.Sum256([]byte{byte(i), byte(i >> 8)})
		want, err := schnorr.Sign(priv, hash[:], schnorr.FastSign())
		if err != nil {
			t.Fatal(err)
		}
		got := k.sign(&hash)
		if !bytes.Equal(got[:], want.Serialize()) {
			t.Fatalf("key %d: signature %x, schnorr.Sign %x", i, got, want.Serialize())
		}
		sig, err := schnorr.ParseSignature(got[:])
		if err != nil || !sig.Verify(hash[:], priv.PubKey()) {
			t.Fatalf("key %d: signature does not verify (%v)", i, err)
		}
	}
	if len(parities) != 2 {
		t.Fatalf("only one parity of key points tried: %v", parities)
	}
}

// TestVerifyRefusesAPubkeyInCapitals: an event whose signer wrote its
// pubkey in uppercase hex, signed over that spelling, passes go-nostr's
// checks; verify refuses it, so that a key is one client (its limits,
// bindings and the pubkey an upstream is told), never several.
func TestVerifyRefusesAPubkeyInCapitals(t *testing.T) {
	s, err := New(Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://x"}})
	if err != nil {
		t.Fatal(err)
	}
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	b, _ := hex.DecodeString(sk)
	priv, _ := btcec.PrivKeyFromBytes(b)
	for _, spelling := range []string{pk, strings.ToUpper(pk)} {
		e := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", s.PublicKey()}}, Content: `{}`, PubKey: spelling}
		h := sha256.Sum256(e.Serialize())
		sig, err := schnorr.Sign(priv, h[:])
		if err != nil {
			t.Fatal(err)
		}
		e.ID, e.Sig = hex.EncodeToString(h[:]), hex.EncodeToString(sig.Serialize())
		if ok, _ := e.CheckSignature(); !ok || !e.CheckID() {
			t.Fatalf("%s: go-nostr refuses the event", spelling)
		}
		if err := s.verify(&e); (err == nil) != (spelling == pk) {
			t.Errorf("pubkey %s: verify %v", spelling, err)
		}
	}
}
