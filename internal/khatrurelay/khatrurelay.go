// Package khatrurelay makes the in-memory khatru Nostr relays that the
// regtest stack (`capvend testnet relay`) and capvend's tests serve: one
// place that decides how a relay stores events and how it limits the
// websocket messages it takes.
package khatrurelay

import (
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/capvend/capvend/internal/memstore"
)

// Options configure New. The zero value is khatru's relay as it comes:
// no name, and its own message limit (512,000 bytes), not advertised.
type Options struct {
	Name        string // NIP-11 name
	Description string // NIP-11 description
	// MaxMessageLength, when positive, is the largest websocket message
	// the relay reads, advertised in NIP-11 as
	// limitation.max_message_length. A client sending a larger one has its
	// connection closed (websocket close 1009), as public relays do.
	MaxMessageLength int
}

// New returns a relay keeping events in memory (memstore), to serve as
// an http.Handler.
func New(o Options) *khatru.Relay {
	rl := khatru.NewRelay()
	new(memstore.Store).Attach(rl) // not slicestore: see package memstore
	if o.Name != "" {
		rl.Info.Name = o.Name
	}
	if o.Description != "" {
		rl.Info.Description = o.Description
	}
	if o.MaxMessageLength > 0 {
		rl.MaxMessageSize = int64(o.MaxMessageLength)
		if rl.Info.Limitation == nil {
			rl.Info.Limitation = &nip11.RelayLimitationDocument{}
		}
		rl.Info.Limitation.MaxMessageLength = o.MaxMessageLength
	}
	return rl
}
