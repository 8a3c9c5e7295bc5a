package ctxvm

import (
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/testkit"
)

// TestClientPubkeyIsTheSigner (CEP-16): the ctx a call is sold with
// carries the pubkey that signed the request (the inner event's author
// when gift-wrapped, not the wrap's throwaway key), whatever the
// client wrote in _meta.clientPubkey; the call's arguments, which vend
// prices and binds a payment to, do not carry it.
func TestClientPubkeyIsTheSigner(t *testing.T) {
	relay := testkit.Relay(t)
	v := &fakeVendor{}
	s := startServer(t, relay, v, nil)
	c := newClient(t, relay, s.PublicKey())
	other := strings.Repeat("ab", 32)
	content := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"free","arguments":{"text":"hi"},"_meta":{"clientPubkey":"` +
		other + `"}}}`

	check := func(t *testing.T) {
		t.Helper()
		v.mu.Lock()
		signer, got := v.signer[len(v.signer)-1], v.calls[len(v.calls)-1]
		v.mu.Unlock()
		if signer != c.pk {
			t.Errorf("the call's ctx carries pubkey %q, want the signer %s", signer, c.pk)
		}
		if got.Client != c.pk || string(got.Arguments) != `{"text":"hi"}` {
			t.Errorf("call request: client %s, arguments %s", got.Client, got.Arguments)
		}
	}
	t.Run("plaintext", func(t *testing.T) {
		req := c.send(content)
		if r, ev := c.expect(req); string(r.Result) != `{"content":[{"type":"text","text":"free:hi"}]}` {
			t.Fatalf("answer %s", ev.Content)
		}
		check(t)
	})
	t.Run("gift-wrapped", func(t *testing.T) {
		inner := c.event(strings.Replace(content, `"id":1`, `"id":2`, 1))
		c.publish(wrapFor(t, *inner, s.PublicKey()))
		if ev, wrapped := c.next(); !wrapped || !strings.Contains(ev.Content, "free:hi") {
			t.Fatalf("answer %v %s", wrapped, ev.Content)
		}
		check(t)
	})
}
