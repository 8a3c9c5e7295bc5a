package ctxvm

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip13"

	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// A request waiting for its payment holds no MaxInFlight slot: with one
// slot and a call waiting, a new client is still served (the slot used to
// be held for the whole payment TTL, so unpaid quotes starved everyone).
func TestWaitingForPaymentHoldsNoSlot(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{block: make(chan struct{})}
	s := startServer(t, relay, v, func(c *Config) { c.MaxInFlight = 1 })
	spammer := newClient(t, relay, s.PublicKey())
	call := spammer.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"await"}}`)
	if r, _ := spammer.expect(call); r.Method != vend.NotifyPaymentRequired {
		t.Fatalf("first event %+v", r)
	}
	honest := newClient(t, relay, s.PublicKey())
	ping := honest.send(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if r, _ := honest.expect(ping); string(r.Result) != `{}` {
		t.Fatalf("ping answered %+v", r)
	}
	close(v.block)
	if r, _ := spammer.expect(call); r.Error != nil {
		t.Fatalf("the waiting call: %+v", r)
	}
}

// The NIP-13 work of a request (its committed difficulty; the inner
// event's for a gift wrap) reaches the Vendor with the difficulty
// required.
func TestProofOfWorkReachesTheVendor(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{}
	s := startServer(t, relay, v, func(c *Config) { c.PowDifficulty = 8 })
	c := newClient(t, relay, s.PublicKey())
	mined := func(target int) *nostr.Event {
		ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), PubKey: c.pk,
			Content: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free"}}`, Tags: nostr.Tags{{"p", s.PublicKey()}}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tag, err := nip13.DoWork(ctx, ev, target)
		if err != nil {
			t.Fatal(err)
		}
		ev.Tags = append(ev.Tags, tag)
		if err := ev.Sign(c.sk); err != nil {
			t.Fatal(err)
		}
		return &ev
	}
	for _, tc := range []struct {
		name string
		ev   func() *nostr.Event
		send func(*nostr.Event)
		min  int
	}{
		{"plain, mined", func() *nostr.Event { return mined(9) }, c.publish, 9},
		{"wrapped, mined", func() *nostr.Event { return mined(9) }, func(ev *nostr.Event) { c.publish(wrapFor(t, *ev, s.PublicKey())) }, 9},
		{"not mined", func() *nostr.Event {
			return c.event(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free"}}`)
		}, c.publish, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := tc.ev()
			tc.send(ev)
			c.expect(ev)
			got := v.lastCall()
			if got.WorkRequired != 8 || got.Work < tc.min || tc.min == 0 && got.Work != 0 {
				t.Fatalf("work %d (want >= %d), required %d", got.Work, tc.min, got.WorkRequired)
			}
		})
	}
	// A nonce tag committing less than the id shows counts the commitment.
	ev := &nostr.Event{ID: "000000ff" + strings.Repeat("f", 56), Tags: nostr.Tags{{"nonce", "1", "12"}}}
	if w := work(ev); w != 12 {
		t.Fatalf("work %d, want the committed 12", w)
	}
	ev.Tags = nostr.Tags{{"nonce", "1", "30"}} // committed more than done: none
	if w := work(ev); w != 0 {
		t.Fatalf("work %d, want 0", w)
	}
}

// With every MaxInFlight slot taken, a stranger's request is dropped but
// one from a client who paid before still enters (its reserve).
func TestKnownPayerEntersWhenSlotsAreTaken(t *testing.T) {
	relay := testkit.Relay(t)
	logs := &syncbuf.Buffer{}
	v := &fakeVendor{block: make(chan struct{}), payers: map[string]bool{}}
	s := startServer(t, relay, v, func(c *Config) {
		c.MaxInFlight = 1
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	stranger := newClient(t, relay, s.PublicKey())
	customer := newClient(t, relay, s.PublicKey())
	v.mu.Lock()
	v.payers[customer.pk] = true
	v.mu.Unlock()
	call := takeTheOnlySlot(v, logs, stranger)
	ping := customer.send(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	if r, _ := customer.expect(ping); string(r.Result) != `{}` {
		t.Fatalf("the known payer's ping: %+v", r)
	}
	close(v.block)
	stranger.expect(call) // fails on an answer to the dropped ping
}
