package nwc

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/nbd-wtf/go-nostr"
)

// URI is a parsed nostr+walletconnect:// connection string (NIP-47): the
// wallet service's public key, the relays it listens on, and the secret
// this client signs and encrypts with. The secret is a bearer credential
// of the wallet (whoever holds it may use every permission the connection
// was granted): String never shows it, and neither does any error of
// this package.
type URI struct {
	Wallet string   // the wallet service's public key, hex
	Relays []string // ws:// or wss:// URLs, at least one
	Secret string   // the client's secret key, hex
	LUD16  string   // the wallet's lightning address, if given
}

// ErrBadURI: the connection string is not a valid NWC URI. The error never
// quotes it.
var ErrBadURI = errors.New("nwc: not a nostr+walletconnect:// URI")

// ParseURI parses a connection string. Surrounding white space (a file's
// trailing newline) is ignored.
func ParseURI(s string) (URI, error) {
	s = strings.TrimSpace(s)
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || (scheme != "nostr+walletconnect" && scheme != "nostrwalletconnect") {
		return URI{}, fmt.Errorf("%w: it must start with nostr+walletconnect://", ErrBadURI)
	}
	// url.Parse would put the pubkey in Host, which is fine, but a
	// query-less or oddly cased URI is easier to check by hand.
	pub, query, _ := strings.Cut(rest, "?")
	pub = strings.TrimSuffix(strings.TrimPrefix(pub, "//"), "/")
	if !isHexKey(pub) {
		return URI{}, fmt.Errorf("%w: the wallet's public key is not 64 hex digits", ErrBadURI)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return URI{}, fmt.Errorf("%w: its query does not parse", ErrBadURI)
	}
	u := URI{Wallet: strings.ToLower(pub), Secret: strings.ToLower(q.Get("secret")), LUD16: q.Get("lud16")}
	if !isHexKey(u.Secret) {
		return URI{}, fmt.Errorf("%w: secret= is missing or not 64 hex digits", ErrBadURI)
	}
	if _, err := nostr.GetPublicKey(u.Secret); err != nil {
		return URI{}, fmt.Errorf("%w: secret= is not a valid key", ErrBadURI)
	}
	for _, r := range q["relay"] {
		ru, err := url.Parse(r)
		if err != nil || (ru.Scheme != "ws" && ru.Scheme != "wss") || ru.Host == "" {
			return URI{}, fmt.Errorf("%w: relay= %q is not a ws:// or wss:// URL", ErrBadURI, r)
		}
		u.Relays = append(u.Relays, r)
	}
	if len(u.Relays) == 0 {
		return URI{}, fmt.Errorf("%w: it names no relay=", ErrBadURI)
	}
	return u, nil
}

// String is the URI without its secret, for logs and doctor.
func (u URI) String() string {
	q := url.Values{"relay": u.Relays}
	if u.LUD16 != "" {
		q.Set("lud16", u.LUD16)
	}
	return "nostr+walletconnect://" + u.Wallet + "?" + q.Encode() + "&secret=(hidden)"
}

// Encode is the full connection string, secret included: for the test
// stack and tests that hand it on, never for logs.
func (u URI) Encode() string {
	q := url.Values{"relay": u.Relays, "secret": {u.Secret}}
	if u.LUD16 != "" {
		q.Set("lud16", u.LUD16)
	}
	return "nostr+walletconnect://" + u.Wallet + "?" + q.Encode()
}

// ClientPubkey is the public key of the connection's secret: the key the
// wallet knows this connection by.
func (u URI) ClientPubkey() string {
	pk, _ := nostr.GetPublicKey(u.Secret)
	return pk
}

func isHexKey(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
