package ctxvm

import (
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip13"
)

// work is the NIP-13 proof of work of a request event (the signed request
// inside a gift wrap, or a NIP-59 rumor, whose id is checked to be its
// hash): the leading zero bits of its id, counted only up to the target
// its nonce tag commits to, and none without a committed target or when
// the target is above what the id shows (a lucky id does not count beyond
// what the client set out to do).
func work(ev *nostr.Event) int {
	if len(ev.ID) != 64 {
		return 0
	}
	return max(nip13.CommittedDifficulty(ev), 0)
}
