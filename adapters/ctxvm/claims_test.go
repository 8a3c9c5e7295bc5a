package ctxvm

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// memClaims is an in-memory vend.RequestClaimer (the ledger's is tested
// in ledger, and across instances in cmd/capvend).
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
