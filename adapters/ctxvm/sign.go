package ctxvm

import (
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"strings"
	"sync"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	secp256k1 "github.com/decred/dcrd/dcrec/secp256k1/v4"
	"github.com/nbd-wtf/go-nostr"
)

// Signing and checking events is most of the front's CPU. go-nostr's
// Event.Sign parses the secret key and derives the pubkey on every call
// (and so does btcec's schnorr.Sign: bip340Key),
// and CheckID plus CheckSignature serialize and hash the event twice and
// parse the author's pubkey (a square root) every time. Here the server's
// key is parsed once, an event is hashed once, and the pubkeys of clients
// whose events verified are kept.

// maxCachedKeys bounds the cache of parsed client pubkeys; when full it is
// cleared.
const maxCachedKeys = 10_000

// keyCache holds parsed pubkeys by hex.
type keyCache struct {
	mu sync.Mutex
	m  map[string]*btcec.PublicKey
}

func (c *keyCache) get(pk string) *btcec.PublicKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[pk]
}

func (c *keyCache) put(pk string, key *btcec.PublicKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedKeys {
		c.m = make(map[string]*btcec.PublicKey)
	}
	c.m[pk] = key
}

// verify checks an event's id (lowercase hex of the hash of its
// serialization, as NIP-01 and go-nostr's CheckID), that its pubkey is
// lowercase hex (NIP-01), and its BIP-340 signature by that pubkey. It
// returns nil or ErrBadEvent.
func (s *Server) verify(ev *nostr.Event) error {
	if len(ev.ID) != 64 || len(ev.PubKey) != 64 || len(ev.Sig) != 128 || !lowerHex(ev.PubKey) {
		return ErrBadEvent
	}
	h := sha256.Sum256(ev.Serialize())
	if hex.EncodeToString(h[:]) != ev.ID {
		return ErrBadEvent
	}
	var sigBytes [64]byte
	if _, err := hex.Decode(sigBytes[:], []byte(ev.Sig)); err != nil {
		return ErrBadEvent
	}
	sig, err := schnorr.ParseSignature(sigBytes[:])
	if err != nil {
		return ErrBadEvent
	}
	key := s.keys.get(ev.PubKey)
	cached := key != nil
	if !cached {
		var pkBytes [32]byte
		if _, err := hex.Decode(pkBytes[:], []byte(ev.PubKey)); err != nil {
			return ErrBadEvent
		}
		if key, err = schnorr.ParsePubKey(pkBytes[:]); err != nil {
			return ErrBadEvent
		}
	}
	if !sig.Verify(h[:], key) {
		return ErrBadEvent
	}
	// Gift wraps are signed by one-time keys: only clients' keys recur.
	if !cached && ev.Kind == KindMessage {
		s.keys.put(ev.PubKey, key)
	}
	return nil
}

// lowerHex reports whether s is lowercase hex. The pubkey string is the
// client's identity (limits, bindings, credit, the key an upstream is
// told): hex decoding takes either case, and go-nostr's checks pass an
// event whose signer wrote its key in capitals, which would make one
// key many clients.
func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// sign sets ev's pubkey, id and signature with the server's key.
func (s *Server) sign(ev *nostr.Event) error {
	if ev.Tags == nil {
		ev.Tags = nostr.Tags{}
	}
	ev.PubKey = s.pk
	h := sha256.Sum256(ev.Serialize())
	sig := s.signer.sign(&h)
	ev.ID = hex.EncodeToString(h[:])
	ev.Sig = hex.EncodeToString(sig[:])
	return nil
}

// bip340Key is a secret key made ready for BIP-340 signing once:
// schnorr.Sign derives the key's point on every call (BIP-340 steps 4-5,
// a scalar multiplication: half its cost), which does not change.
type bip340Key struct {
	d      btcec.ModNScalar // the secret, negated when its point's y is odd (step 5)
	dBytes [32]byte         // d, the RFC 6979 nonce's key
	px     [32]byte         // the x-only public key
}

func newBIP340Key(priv *btcec.PrivateKey) *bip340Key {
	k := &bip340Key{d: priv.Key}
	pub := priv.PubKey().SerializeCompressed()
	if pub[0] == secp256k1.PubKeyFormatCompressedOdd {
		k.d.Negate()
	}
	k.d.PutBytes(&k.dBytes)
	copy(k.px[:], pub[1:])
	return k
}

// rfc6979ExtraDataV0 is SHA-256("BIP-340"), the extra data schnorr.Sign
// feeds RFC 6979 for its nonces (unexported there).
var rfc6979ExtraDataV0 = sha256.Sum256([]byte("BIP-340"))

// sign returns the signature of hash that schnorr.Sign(priv, hash,
// schnorr.FastSign()) returns (the same deterministic nonce, steps
// 6-13): byte for byte, so the key is the only change (sign_test.go).
func (k *bip340Key) sign(hash *[32]byte) [64]byte {
	for iteration := uint32(0); ; iteration++ {
		nonce := btcec.NonceRFC6979(k.dBytes[:], hash[:], rfc6979ExtraDataV0[:], nil, iteration)
		var r btcec.JacobianPoint
		btcec.ScalarBaseMultNonConst(nonce, &r)
		r.ToAffine()
		if r.Y.IsOdd() {
			nonce.Negate()
		}
		rx := r.X.Bytes()
		commitment := chainhash.TaggedHash(chainhash.TagBIP0340Challenge, rx[:], k.px[:], hash[:])
		var e btcec.ModNScalar
		if overflow := e.SetBytes((*[32]byte)(commitment)); overflow != 0 {
			nonce.Zero()
			continue // as schnorr.Sign: the next nonce
		}
		sv := new(btcec.ModNScalar).Mul2(&e, &k.d).Add(nonce)
		nonce.Zero()
		var sig [64]byte
		copy(sig[:32], rx[:])
		sv.PutBytesUnchecked(sig[32:])
		return sig
	}
}

// trustRelays is a go-nostr relay option that skips its check of every
// event's signature: the server checks each one itself (parse), and
// checking twice was a third of its CPU.
type trustRelays struct{}

func (trustRelays) ApplyRelayOption(r *nostr.Relay) { r.AssumeValid = true }

// CloseRelay closes r. go-nostr v0.52.3's Relay.close cancels the
// connection's context, then reads r.Connection, which the relay's writer
// goroutine sets to nil when it sees that context end: when the writer
// wins, close dereferences nil (it crashed a test run at shutdown). The
// websocket is closed either way (its read context ended), so that panic
// is recovered; any other is not.
func CloseRelay(r *nostr.Relay) {
	defer func() {
		if p := recover(); p != nil {
			if e, ok := p.(runtime.Error); !ok || !strings.Contains(e.Error(), "nil pointer") {
				panic(p)
			}
		}
	}()
	r.Close()
}

// closeRelays closes every relay of pool (its relays are not tied to
// its context).
func closeRelays(pool *nostr.SimplePool) {
	pool.Relays.Range(func(_ string, r *nostr.Relay) bool {
		if r != nil {
			CloseRelay(r)
		}
		return true
	})
}
