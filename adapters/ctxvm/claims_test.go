package ctxvm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/testkit"
)

// memClaims is an in-memory vend.RequestClaimer (the ledger's is tested
// in ledger, and across instances in internal/cli).
type memClaims struct {
	mu   sync.Mutex
	m    map[string]string
	fail bool
}

func (m *memClaims) ClaimRequest(_ context.Context, key, holder string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return false, errors.New("ledger unreachable")
	}
	if h, ok := m.m[key]; ok {
		return h == holder, nil
	}
	m.m[key] = holder
	return true, nil
}

// TestClaimsServeEachRequestOnce: two servers with the same key and one
// claim store receive the same requests; each is answered once, by the
// server that claimed it, and a call runs once. A request whose claim
// cannot be written is not answered.
func TestClaimsServeEachRequestOnce(t *testing.T) {
	claims := &memClaims{m: map[string]string{}}
	v := &fakeVendor{}
	a, outA := recorder(t, func(c *Config) { c.Vendor, c.Claims, c.Instance = v, claims, "a" })
	b, outB := recorder(t, func(c *Config) {
		c.Vendor, c.Claims, c.Instance, c.SecretKey = v, claims, "b", a.cfg.SecretKey
	})
	sk := nostr.GeneratePrivateKey()
	req := func(content string) *nostr.Event {
		ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Now(), Content: content, Tags: nostr.Tags{{"p", a.PublicKey()}}}
		ev.Sign(sk)
		return ev
	}
	ctx := context.Background()
	call := req(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free","arguments":{"text":"x"}}}`)
	list := req(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	b.handle(ctx, call)
	a.handle(ctx, call)
	a.handle(ctx, list)
	b.handle(ctx, list)
	v.mu.Lock()
	ran := len(v.calls)
	v.mu.Unlock()
	if ran != 1 {
		t.Errorf("the call ran %d times, want 1", ran)
	}
	count := func(out *[]nostr.Event, ev *nostr.Event) int {
		n := 0
		for _, a := range *out {
			if a.Tags.FindWithValue("e", ev.ID) != nil {
				n++
			}
		}
		return n
	}
	if n, m := count(outA, call), count(outB, call); n != 0 || m != 1 {
		t.Errorf("the call was answered %d times by a and %d by b, want once by b", n, m)
	}
	if n, m := count(outA, list), count(outB, list); n != 1 || m != 0 {
		t.Errorf("the list was answered %d times by a and %d by b, want once by a", n, m)
	}
	claims.fail = true
	ping := req(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	a.handle(ctx, ping)
	if n := count(outA, ping); n != 0 {
		t.Errorf("a request whose claim failed was answered %d times", n)
	}
}

// takeoverClaims is a vend.RequestClaimer whose first claim of a key is
// another instance's (one that then dies without answering) and every
// later one the caller's, as after ledger.DefaultClaimTakeover. Each claim tried
// is sent on tried.
type takeoverClaims struct {
	mu    sync.Mutex
	seen  map[string]bool
	tried chan string
}

func (m *takeoverClaims) ClaimRequest(_ context.Context, key, _ string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mine := m.seen[key]
	m.seen[key] = true
	m.tried <- key
	return mine, nil
}

// TestRequestSentAgainAfterTakeover: a request another instance claimed
// and never answered (it died) is served here when the client sends the
// same event again once this server's memory of the event (SeenFor, made
// short here) has passed. The relay subscription must not drop the copy:
// go-nostr's pool (SubscribeMany) did, for one to two minutes after each
// copy it saw, so a client sending the event again every minute was never
// answered.
func TestRequestSentAgainAfterTakeover(t *testing.T) {
	const keep = 200 * time.Millisecond
	relay := testkit.Relay(t)
	claims := &takeoverClaims{seen: map[string]bool{}, tried: make(chan string, 8)}
	s := startServer(t, relay, &fakeVendor{}, func(c *Config) { c.Claims, c.Instance, c.SeenFor = claims, "live", keep })
	c := newClient(t, relay, s.PublicKey())
	ping := c.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	select {
	case <-claims.tried: // claimed by the other instance: dropped
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatal("the request never reached the server")
	}
	time.Sleep(2 * keep) // the server forgets the event
	c.publish(ping)
	if r, _ := c.expect(ping); r.Error != nil {
		t.Fatalf("the request sent again: %+v", r.Error)
	}
}
