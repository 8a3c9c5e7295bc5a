package ctxvm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// listChangedServer runs a Server on relay selling v with catalog cat,
// and returns it with the channel of its list_changed rounds.
func listChangedServer(t *testing.T, relay string, v Vendor, cat Catalog) (*Server, chan []string) {
	t.Helper()
	s, err := New(Config{Vendor: v, Catalog: cat, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{relay},
		Logger: quietLog(), AnnounceDelay: 10 * time.Millisecond, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rounds := make(chan []string, 100)
	s.lists.roundDone = func(sent []string) { rounds <- sent }
	runServer(t, s)
	select {
	case <-s.Ready():
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatal("server never subscribed")
	}
	return s, rounds
}

func nextListRound(t *testing.T, rounds chan []string) []string {
	t.Helper()
	select {
	case r := <-rounds:
		return r
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatal("no list_changed round")
	}
	return nil
}

// expectListChanged reads c's next event: the server's list_changed
// notification method, tagged p only, wrapped iff wantWrapped.
func (c *client) expectListChanged(method string, wantWrapped bool) {
	c.t.Helper()
	ev, wrapped := c.next()
	want := `{"jsonrpc":"2.0","method":"` + method + `"}`
	if ev.PubKey != c.server || ev.Kind != KindMessage || ev.Content != want || wrapped != wantWrapped ||
		len(ev.Tags) != 1 || !hasTag(ev.Tags, "p", c.pk) {
		c.t.Fatalf("want %s (wrapped %v), got %v (wrapped %v)", want, wantWrapped, ev, wrapped)
	}
	if ok, _ := ev.CheckSignature(); !ok || !ev.CheckID() {
		c.t.Fatal("badly signed")
	}
}

func TestListChanged(t *testing.T) {
	relay := testkit.Relay(t)
	v, cat := newPriceVendor(), newListCatalog()
	s, rounds := listChangedServer(t, relay, v, cat)
	plain := newClient(t, relay, s.PublicKey())
	secret := newClient(t, relay, s.PublicKey())
	dvmcp := newClient(t, relay, s.PublicKey())
	silent := newClient(t, relay, s.PublicKey()) // never asked anything
	plain.expect(plain.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	inner := secret.event(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	secret.publish(wrapFor(t, *inner, s.PublicKey()))
	if _, wrapped := secret.next(); !wrapped {
		t.Fatal("ping answered in plaintext")
	}
	dvmcp.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`, nostr.Tag{"method", "ping"})
	dvmcp.next()

	// pings prove that nothing came before their answers (and the
	// notifications of a round are all published before the round ends).
	seq := 1
	pings := func(cs ...*client) {
		t.Helper()
		defer func() {
			if n := len(silent.events); n != 0 {
				t.Fatalf("a client that never asked anything got %d events", n)
			}
		}()
		seq++
		for _, c := range cs {
			ping := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, seq)
			if c == dvmcp {
				c.send(ping, nostr.Tag{"method", "ping"})
				if ev, _ := c.next(); ev.Kind != KindDVMCPResponse {
					t.Fatalf("dvmcp client got %v", ev)
				}
				continue
			}
			if r, _ := c.expect(c.send(ping)); string(r.Result) != `{}` {
				t.Fatalf("ping answered %+v", r)
			}
		}
	}

	t.Run("a price changed", func(t *testing.T) {
		v.setPrice("free", 3_000)
		s.Refresh()
		if got := nextListRound(t, rounds); !slices.Equal(got, []string{notifyToolsChanged}) {
			t.Fatalf("round sent %v", got)
		}
		plain.expectListChanged(notifyToolsChanged, false)
		secret.expectListChanged(notifyToolsChanged, true)
		pings(plain, dvmcp)
	})
	t.Run("nothing changed", func(t *testing.T) {
		s.Refresh()
		if got := nextListRound(t, rounds); len(got) != 0 {
			t.Fatalf("round sent %v", got)
		}
		pings(plain)
		seq++ // and a wrapped ping: the secret client stays encrypted
		inner := secret.event(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, seq))
		secret.publish(wrapFor(t, *inner, s.PublicKey()))
		if ev, wrapped := secret.next(); !wrapped || ev.Tags.FindWithValue("e", inner.ID) == nil {
			t.Fatalf("secret client got %v", ev)
		}
	})
	t.Run("a prompt and a tool", func(t *testing.T) {
		cat.addPrompt(vend.Prompt{Name: "new"})
		v.remove("gated")
		s.Refresh()
		if got := nextListRound(t, rounds); !slices.Equal(got, []string{notifyToolsChanged, notifyPromptsChanged}) {
			t.Fatalf("round sent %v", got)
		}
		plain.expectListChanged(notifyToolsChanged, false)
		plain.expectListChanged(notifyPromptsChanged, false)
		secret.expectListChanged(notifyToolsChanged, true)
		secret.expectListChanged(notifyPromptsChanged, true)
		pings(plain)
	})
	t.Run("resources", func(t *testing.T) {
		cat.mu.Lock()
		cat.templates = nil
		cat.mu.Unlock()
		s.Refresh()
		if got := nextListRound(t, rounds); !slices.Equal(got, []string{notifyResourcesChanged}) {
			t.Fatalf("round sent %v", got)
		}
		plain.expectListChanged(notifyResourcesChanged, false)
		secret.expectListChanged(notifyResourcesChanged, true)
		// The secret client's last request is now plaintext: so is its notification.
		pings(secret)
		cat.mu.Lock()
		cat.resources = cat.resources[:1]
		cat.mu.Unlock()
		s.Refresh()
		nextListRound(t, rounds)
		plain.expectListChanged(notifyResourcesChanged, false)
		secret.expectListChanged(notifyResourcesChanged, false)
	})
}

// request is a served ContextVM request of pubkey pk (for the store).
func sessionRequest(pk string, wrap int, method, params string) *request {
	return &request{ev: &nostr.Event{PubKey: pk}, wrap: wrapping{kind: wrap}, msg: message{Method: method, Params: []byte(params)}}
}

func TestSessionStore(t *testing.T) {
	var st sessionStore
	now := time.Unix(1_700_000_000, 0)
	w := 5 * time.Minute
	st.touch(sessionRequest("old", 0, "ping", ""), now.Add(-w-time.Second), w)
	st.touch(sessionRequest("a", KindGiftWrap, "initialize", `{"capabilities":{"elicitation":{}}}`), now.Add(-2*time.Second), w)
	st.touch(sessionRequest("b", 0, "initialize", `{"capabilities":{"elicitation":null}}`), now.Add(-time.Second), w)
	st.touch(sessionRequest("c", 0, "tools/list", `{"capabilities":{"elicitation":{}}}`), now, w)
	if got := st.recent(now, w, 10); !slices.Equal(got, []recipient{{"c", 0}, {"b", 0}, {"a", KindGiftWrap}}) {
		t.Errorf("recent %v", got)
	}
	if got := st.recent(now, w, 2); !slices.Equal(got, []recipient{{"c", 0}, {"b", 0}}) {
		t.Errorf("recent, 2 at most: %v", got)
	}
	if !st.canElicit("a") || st.canElicit("b") || st.canElicit("c") || st.canElicit("nobody") {
		t.Error("canElicit")
	}
	st.touch(sessionRequest("a", 0, "ping", ""), now, w) // not an initialize: still can
	if !st.canElicit("a") {
		t.Error("a ping forgot the capability")
	}

	// Bounded: stale clients go first, then arbitrary ones.
	for i := range maxSessions + 10 {
		st.touch(sessionRequest(fmt.Sprint(i), 0, "ping", ""), now, w)
		if len(st.m) > maxSessions {
			t.Fatalf("%d sessions", len(st.m))
		}
	}
	if _, ok := st.m["old"]; ok {
		t.Error("the stale client is kept")
	}
}

// A round of list_changed stops after a few failures in a row: the relays
// are down.
func TestListChangedGivesUp(t *testing.T) {
	v := newPriceVendor()
	s, err := New(Config{Vendor: v, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://127.0.0.1:1"},
		Logger: quietLog(), AnnounceDelay: time.Millisecond, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var tries atomic.Int32
	s.publish = func(context.Context, nostr.Event) error { tries.Add(1); return errors.New("relay down") }
	rounds := make(chan []string, 10)
	s.lists.roundDone = func(sent []string) { rounds <- sent }
	for i := range 50 {
		st := sessionRequest(fmt.Sprintf("%064x", i+1), 0, "ping", "")
		s.sess.touch(st, time.Now(), time.Minute)
	}
	for range 100 { // Refresh never blocks, before or during Run
		s.Refresh()
	}
	runServer(t, s)
	for range 100 {
		s.Refresh()
	}
	if got := nextListRound(t, rounds); len(got) > 0 { // nothing changed yet
		t.Fatalf("round sent %v", got)
	}
	v.setPrice("free", 1_000)
	s.Refresh()
	for {
		if got := nextListRound(t, rounds); len(got) > 0 {
			break
		}
	}
	if n := tries.Load(); n != maxListChangedFailures {
		t.Errorf("%d publications tried, want %d", n, maxListChangedFailures)
	}
}
