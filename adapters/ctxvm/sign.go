package ctxvm

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"runtime"
	"strings"
	"sync"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/nbd-wtf/go-nostr"
)

// Signing and checking events is most of the front's CPU. go-nostr's
// Event.Sign parses the secret key and derives the pubkey on every call,
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
// serialization, as NIP-01 and go-nostr's CheckID) and its BIP-340
// signature by its pubkey. It returns nil or ErrBadEvent.
func (s *Server) verify(ev *nostr.Event) error {
	if len(ev.ID) != 64 || len(ev.PubKey) != 64 || len(ev.Sig) != 128 {
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

// sign sets ev's pubkey, id and signature with the server's key.
func (s *Server) sign(ev *nostr.Event) error {
	if ev.Tags == nil {
		ev.Tags = nostr.Tags{}
	}
	ev.PubKey = s.pk
	h := sha256.Sum256(ev.Serialize())
	sig, err := schnorr.Sign(s.priv, h[:], schnorr.FastSign())
	if err != nil {
		return errors.New("signing failed") // its text would hold the key
	}
	ev.ID = hex.EncodeToString(h[:])
	ev.Sig = hex.EncodeToString(sig.Serialize())
	return nil
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
