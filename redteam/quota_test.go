package redteam

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Issue 11, "Identity for quotas and limits cannot be minted for free":
// fresh HTTP sessions from one address, and fresh Nostr keys, do not get
// more free calls than the per-address and the global caps.

// TestQuotaIdentityHTTPSessions opens fresh sessions from one address,
// each asking word_count (free_per_day 1) once: sessions cost nothing to
// make, so together they get the address's one free call, not one each.
func TestQuotaIdentityHTTPSessions(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{})
	c := newHTTPClient(t, sh)
	free := 0
	for i := range 5 {
		sess := c.initialize()
		m, err := c.tryRPC(sess, 1, "tools/call", callParams("word_count", map[string]any{"text": fmt.Sprintf("session %d", i)}, explicit()), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Error == nil && strings.Contains(resultText(m.Result), "words") {
			free++
		}
	}
	if free > 1 {
		t.Fatalf("5 fresh sessions from one address got %d free calls with free_per_day 1, want at most 1", free)
	}
}

// TestQuotaIdentityNostrKeys sends word_count from fresh Nostr keys under
// a global cap free_per_day_total 2: at most 2 are free in all.
func TestQuotaIdentityNostrKeys(t *testing.T) {
	t.Parallel()
	p := issuePrices()
	p.tools["word_count"] = price{sats: 1, freePerDay: 1, freeTotal: 2}
	sh := startShop(t, shopOpts{nostr: true, prices: &p})
	free := 0
	for i := range 5 {
		c := dialNostr(t, sh)
		if i == 0 {
			c.waitReady()
		}
		id := c.send(ctxvmPlain, 1, "tools/call", callParams("word_count", map[string]any{"text": fmt.Sprintf("key %d", i)}, explicit()), explicitTag())
		if m := c.untilResponse(id, nil); m.Error == nil && strings.Contains(resultText(m.Result), "words") {
			free++
		}
	}
	if free > 2 {
		t.Fatalf("5 fresh keys got %d free calls with free_per_day_total 2", free)
	}
}

// TestNostrProofOfWork configures nostr.pow_difficulty: a request for a
// free call or an unpaid quote without that much NIP-13 work is refused
// (an error answer, or none) and runs nothing; with it, it is served.
func TestNostrProofOfWork(t *testing.T) {
	t.Parallel()
	const bits = 12
	sh := startShop(t, shopOpts{nostr: true, nostrExtra: fmt.Sprintf("  pow_difficulty: %d\n", bits)})
	c := dialNostr(t, sh)
	pinged := false
	// The server subscribes after it starts: ping until it answers.
	deadline := time.Now().Add(2 * time.Minute) // a hang guard
	for time.Now().Before(deadline) {
		ev := c.buildPoW(ctxvmPlain, bits, "ready", "ping", nil)
		if c.tryPublish(ev) == nil {
			if _, ok := c.next(ev.ID, 2*time.Second); ok {
				pinged = true
				break
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !pinged {
		t.Fatal("the Nostr front did not answer a ping with proof of work within 2 minutes")
	}
	for _, call := range []map[string]any{
		callParams("word_count", map[string]any{"text": "free without work"}, nil),
		callParams("sha256", map[string]any{"text": "quote without work"}, nil),
	} {
		id := c.send(ctxvmPlain, 1, "tools/call", call)
		if m, ok := c.next(id, 10*time.Second); ok && m.Error == nil {
			t.Errorf("%s without proof of work: answered %v, want refused", call["name"], m)
		}
	}
	ev := c.buildPoW(ctxvmPlain, bits, 2, "tools/call", callParams("word_count", map[string]any{"text": "free with work"}, nil))
	c.publish(ctxvmPlain, ev)
	if m := c.untilResponse(ev.ID, nil); m.Error != nil || !strings.Contains(resultText(m.Result), "words") {
		t.Fatalf("word_count with proof of work: %v", m)
	}
}
