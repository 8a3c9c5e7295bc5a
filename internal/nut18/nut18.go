// Package nut18 encodes and decodes Cashu NUT-18 payment requests: the
// "creqA" strings ("creq" + version "A" + base64url(CBOR(request))) a
// receiver hands a wallet so that it can build a matching token. capvend
// sends one in the X-Cashu header of an HTTP 402 (NUT-24).
//
// It is a leaf of Cashu wire format, with no dependency on capvend's
// other packages: the MCP HTTP front (adapters/mcpfront) writes requests,
// and adapters may not import billing or the ledger, where the rest of
// the Cashu code lives (billing/cashu, on gonuts, which has no NUT-18 in
// v0.4.2). Tests and fuzzing use the decoder; real wallets (cashu-ts)
// decode what Encode writes.
package nut18

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/fxamacker/cbor/v2"
)

// Prefix starts every encoded request of version A.
const Prefix = "creqA"

// MaxEncodedLen bounds an encoded request Decode accepts: far above any
// real one (a few mints and a transport fit in 1 KiB).
const MaxEncodedLen = 16 << 10

// ErrMalformed is wrapped by every error of Decode and Encode.
var ErrMalformed = errors.New("nut18: malformed payment request")

// Request is a NUT-18 payment request. Every member is optional on the
// wire; empty ones are left out when encoded and lists decode as nil when
// empty, so that a decoded request encodes back to an equal one.
type Request struct {
	ID          string      `cbor:"i,omitempty"` // payment id, to be echoed in a payment payload
	Amount      uint64      `cbor:"a,omitempty"` // in Unit; 0: the sender chooses
	Unit        string      `cbor:"u,omitempty"` // "sat", ...; required with Amount
	SingleUse   bool        `cbor:"s,omitempty"` // the request is paid once
	Mints       []string    `cbor:"m,omitempty"` // mints whose tokens are accepted; none: any
	Description string      `cbor:"d,omitempty"` // shown by the sending wallet
	Transports  []Transport `cbor:"t,omitempty"` // none: in-band, e.g. NUT-24's X-Cashu header
	NUT10       *NUT10      `cbor:"nut10,omitempty"`
}

// Transport is how the payment is sent: a type ("nostr", "post"), its
// target (an nprofile, a URL) and optional tags.
type Transport struct {
	Type   string     `cbor:"t"`
	Target string     `cbor:"a"`
	Tags   [][]string `cbor:"g,omitempty"`
}

// NUT10 is a spending condition the payment's proofs must carry (kind
// "P2PK" or "HTLC", its data and tags).
type NUT10 struct {
	Kind string     `cbor:"k"`
	Data string     `cbor:"d"`
	Tags [][]string `cbor:"t,omitempty"`
}

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	// Deterministic: the same request always encodes to the same bytes.
	// Empty lists are [] rather than null, which decoders of other
	// languages choke on.
	opts := cbor.CoreDetEncOptions()
	opts.NilContainers = cbor.NilContainerAsEmpty
	if encMode, err = opts.EncMode(); err != nil {
		panic(err)
	}
	// An untrusted request is small and flat: bound what the decoder
	// allocates, refuse duplicate keys (two amounts), indefinite lengths
	// and tags, which no encoder of requests writes.
	decMode, err = cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		MaxNestedLevels:  8,
		MaxArrayElements: 256,
		MaxMapPairs:      64,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// Encode returns r as "creqA" + unpadded base64url of its CBOR map. An
// amount without a unit is an error (NUT-18: the unit must be set with
// the amount), as is an empty mint URL or transport type.
func Encode(r Request) (string, error) {
	if err := r.check(); err != nil {
		return "", err
	}
	b, err := encMode.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return Prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// Decode parses an encoded request. The base64 may be url-safe (as
// NUT-18 says) or standard (as cashu-ts 4.8.0 writes it), padded or not.
// Unknown members are ignored (later versions of the NUT add some).
// Errors wrap ErrMalformed. It does not panic on any input.
func Decode(s string) (Request, error) {
	s = strings.TrimSpace(s)
	if len(s) > MaxEncodedLen {
		return Request{}, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxEncodedLen)
	}
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return Request{}, fmt.Errorf("%w: does not start with %q", ErrMalformed, Prefix)
	}
	rest = strings.TrimRight(rest, "=")
	if strings.ContainsAny(rest, "+/") {
		rest = strings.NewReplacer("+", "-", "/", "_").Replace(rest)
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return Request{}, fmt.Errorf("%w: base64: %v", ErrMalformed, err)
	}
	var r Request
	if err := decMode.Unmarshal(b, &r); err != nil {
		return Request{}, fmt.Errorf("%w: cbor: %v", ErrMalformed, err)
	}
	r.normalize()
	if err := r.check(); err != nil {
		return Request{}, err
	}
	return r, nil
}

func (r *Request) check() error {
	if r.Amount > 0 && r.Unit == "" {
		return fmt.Errorf("%w: an amount without a unit", ErrMalformed)
	}
	for _, m := range r.Mints {
		if m == "" {
			return fmt.Errorf("%w: an empty mint URL", ErrMalformed)
		}
	}
	for _, t := range r.Transports {
		if t.Type == "" {
			return fmt.Errorf("%w: a transport without a type", ErrMalformed)
		}
	}
	if r.NUT10 != nil && r.NUT10.Kind == "" {
		return fmt.Errorf("%w: a NUT-10 condition without a kind", ErrMalformed)
	}
	return nil
}

// normalize makes empty lists nil, as Encode leaves them out.
func (r *Request) normalize() {
	if len(r.Mints) == 0 {
		r.Mints = nil
	}
	if len(r.Transports) == 0 {
		r.Transports = nil
	}
	for i := range r.Transports {
		r.Transports[i].Tags = normalTags(r.Transports[i].Tags)
	}
	if r.NUT10 != nil {
		r.NUT10.Tags = normalTags(r.NUT10.Tags)
	}
}

func normalTags(tags [][]string) [][]string {
	if len(tags) == 0 {
		return nil
	}
	for i, t := range tags {
		if len(t) == 0 {
			tags[i] = nil
		}
	}
	return tags
}
