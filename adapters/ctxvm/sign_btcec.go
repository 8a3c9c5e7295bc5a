//go:build !libsecp256k1

package ctxvm

import (
	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
)

// The pure-Go curve arithmetic (btcec), the default build's. The build
// tag libsecp256k1 swaps it for sign_libsecp256k1.go's.

// pubKey is a client's parsed x-only pubkey.
type pubKey = *btcec.PublicKey

// parsePubKey parses an x-only pubkey (BIP-340), nil if it is not one.
func parsePubKey(b *[32]byte) pubKey {
	key, err := schnorr.ParsePubKey(b[:])
	if err != nil {
		return nil
	}
	return key
}

// verifySchnorr reports whether sig is key's BIP-340 signature of hash.
func verifySchnorr(hash *[32]byte, sig *[64]byte, key pubKey) bool {
	s, err := schnorr.ParseSignature(sig[:])
	return err == nil && s.Verify(hash[:], key)
}

// signer is the server's key, ready to sign.
type signer = bip340Key

func newSigner(priv *btcec.PrivateKey) *signer { return newBIP340Key(priv) }
