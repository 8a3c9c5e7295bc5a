//go:build libsecp256k1

package ctxvm

/*
#cgo LDFLAGS: -lsecp256k1
#include <string.h>
#include <secp256k1.h>
#include <secp256k1_extrakeys.h>
#include <secp256k1_schnorrsig.h>

// capvend_nonce hands libsecp256k1 the nonce computed in Go (data).
static int capvend_nonce(unsigned char *nonce32, const unsigned char *msg, size_t msglen,
		const unsigned char *key32, const unsigned char *xonly_pk32,
		const unsigned char *algo, size_t algolen, void *data) {
	memcpy(nonce32, data, 32);
	return 1;
}

// capvend_sign signs msg32 with kp and the nonce nonce32.
static int capvend_sign(const secp256k1_context *ctx, unsigned char *sig64,
		const unsigned char *msg32, const secp256k1_keypair *kp, unsigned char *nonce32) {
	secp256k1_schnorrsig_extraparams p = SECP256K1_SCHNORRSIG_EXTRAPARAMS_INIT;
	p.noncefp = capvend_nonce;
	p.ndata = nonce32;
	return secp256k1_schnorrsig_sign_custom(ctx, sig64, msg32, 32, kp, &p);
}
*/
import "C"

import (
	"crypto/rand"

	"github.com/btcsuite/btcd/btcec/v2"
)

// The curve arithmetic of Bitcoin Core's libsecp256k1 (Debian's
// libsecp256k1-dev), with the build tag libsecp256k1: verifying is about
// five times cheaper than btcec's. The same tag makes go-nostr sign and
// check with its own bundled copy of the library, whose symbols then
// serve these calls too (one copy of each in the binary).

// secpCtx is the library's context: made once, read-only after, safe
// for concurrent use.
var secpCtx = func() *C.secp256k1_context {
	ctx := C.secp256k1_context_create(C.SECP256K1_CONTEXT_SIGN | C.SECP256K1_CONTEXT_VERIFY)
	if ctx == nil {
		panic("ctxvm: secp256k1_context_create failed")
	}
	var seed [32]byte // blinds signing against side channels
	if _, err := rand.Read(seed[:]); err != nil || C.secp256k1_context_randomize(ctx, (*C.uchar)(&seed[0])) != 1 {
		panic("ctxvm: secp256k1_context_randomize failed")
	}
	return ctx
}()

// pubKey is a client's parsed x-only pubkey.
type pubKey = *C.secp256k1_xonly_pubkey

// parsePubKey parses an x-only pubkey (BIP-340), nil if it is not one.
func parsePubKey(b *[32]byte) pubKey {
	key := new(C.secp256k1_xonly_pubkey)
	if C.secp256k1_xonly_pubkey_parse(secpCtx, key, (*C.uchar)(&b[0])) != 1 {
		return nil
	}
	return key
}

// verifySchnorr reports whether sig is key's BIP-340 signature of hash.
func verifySchnorr(hash *[32]byte, sig *[64]byte, key pubKey) bool {
	return C.secp256k1_schnorrsig_verify(secpCtx, (*C.uchar)(&sig[0]), (*C.uchar)(&hash[0]), 32, key) == 1
}

// signer is the server's key, ready to sign: libsecp256k1's keypair, and
// the bip340Key whose RFC 6979 nonce it signs with, so that signatures
// are byte for byte the pure-Go build's (sign_test.go). (The one
// difference, a challenge hash at or above the group order, where btcec
// takes the next nonce and libsecp256k1 reduces the hash, has odds of
// 2^-128; either signature is valid.)
type signer struct {
	bip340Key
	pair C.secp256k1_keypair
	ok   bool // the keypair was made; else bip340Key signs
}

func newSigner(priv *btcec.PrivateKey) *signer {
	k := &signer{bip340Key: *newBIP340Key(priv)}
	b := priv.Key.Bytes()
	k.ok = C.secp256k1_keypair_create(secpCtx, &k.pair, (*C.uchar)(&b[0])) == 1
	clear(b[:])
	return k
}

// sign returns the BIP-340 signature of hash.
func (k *signer) sign(hash *[32]byte) [64]byte {
	if !k.ok {
		return k.bip340Key.sign(hash)
	}
	nonce := btcec.NonceRFC6979(k.dBytes[:], hash[:], rfc6979ExtraDataV0[:], nil, 0)
	nb := nonce.Bytes()
	nonce.Zero()
	var sig [64]byte
	ok := C.capvend_sign(secpCtx, (*C.uchar)(&sig[0]), (*C.uchar)(&hash[0]), &k.pair, (*C.uchar)(&nb[0])) == 1
	clear(nb[:])
	if !ok {
		return k.bip340Key.sign(hash)
	}
	return sig
}
