package cashu_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/vend"
)

// wsOnly configures a backend that learns of payments from its NUT-17
// subscription only: its polls are an hour apart, while reconnects stay
// fast (MaxBackoff caps every retry wait).
func wsOnly(c *cashu.Config) {
	c.Websocket = true
	c.PollInterval = time.Hour
	c.SafetyPoll = time.Hour
	c.MaxBackoff = 200 * time.Millisecond
}

// until waits (at most d) for cond, checking it every few milliseconds.
func until(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mintAlive fails the test if the stack's mint process died or stopped
// answering (gonuts' NUT-17 panic kills it), with the end of its log.
func mintAlive(t *testing.T) {
	t.Helper()
	resp, err := http.Get(stack.MintURL + "/v1/info")
	if err == nil {
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusOK || !stack.Info.Mint.Proc.Alive() {
		log, _ := os.ReadFile(stack.Info.Mint.Log)
		if i := bytes.LastIndex(log, []byte("panic:")); i >= 0 {
			log = log[i:]
		} else if len(log) > 4000 {
			log = log[len(log)-4000:]
		}
		t.Fatalf("the mint is down (%v): its log ends:\n%s", err, log)
	}
}

// TestNUT17 runs capvend's NUT-17 client against the stack's gonuts mint.
func TestNUT17(t *testing.T) {
	needStack(t)
	t.Run("PaidQuoteSeenViaSubscription", testNUT17Paid)
	t.Run("SubscriberDropsWhileTheMintSends", testNUT17Drops)
	t.Run("ReconnectsAfterTheConnectionDrops", testNUT17Reconnects)
}

// testNUT17Paid: a quote paid while subscribed is reported through the
// subscription (polling cannot: its first poll is an hour away).
func testNUT17Paid(t *testing.T) {
	l := openLedger(t)
	b := newBackend(t, l, stack.MintURL, t.TempDir(), wsOnly)
	ev := newEvents()
	runBackend(t, b, ev)
	c := priced(t, l, 6)
	p, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	until(t, 30*time.Second, "subscription acknowledged", func() bool { return b.Covered(p.Ref) })
	if err := pay(context.Background(), p.Bolt11); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, p.Ref, vend.PaymentSettled, 30*time.Second)
	mintAlive(t)
}

// testNUT17Drops: subscribers that vanish while the mint is still sending
// them their quotes' states (the moment gonuts v0.4.2's mint panics on:
// "send on closed channel", see cashu.Config.Websocket) leave the mint
// running.
func testNUT17Drops(t *testing.T) {
	var ids []string
	for range 25 { // one full subscription: 25 initial states to send
		ids = append(ids, newMintQuote(t))
	}
	wsURL := "ws" + strings.TrimPrefix(stack.MintURL, "http") + "/v1/ws"
	for i := range 8 {
		conn, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
		if err != nil {
			mintAlive(t)
			t.Fatalf("dial %d: %v", i, err)
		}
		req := map[string]any{"jsonrpc": "2.0", "method": "subscribe", "id": 1,
			"params": map[string]any{"kind": "bolt11_mint_quote", "subId": fmt.Sprint("drop-", i), "filters": ids}}
		if err := conn.WriteJSON(req); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			// Wait for the first message (the mint is sending now).
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, _, err := conn.ReadMessage(); err != nil {
				t.Fatal(err)
			}
		}
		conn.NetConn().Close() // gone: no close frame, unread messages
	}
	// A subscriber that stays sees the mint alive and answering.
	conn, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
	if err != nil {
		mintAlive(t)
		t.Fatalf("the mint's websocket after the drops: %v", err)
	}
	defer conn.Close()
	req := map[string]any{"jsonrpc": "2.0", "method": "subscribe", "id": 7,
		"params": map[string]any{"kind": "bolt11_mint_quote", "subId": "stays", "filters": ids[:1]}}
	if err := conn.WriteJSON(req); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for acked := false; !acked; {
		var m struct {
			ID     *int `json:"id"`
			Result *struct {
				Status string `json:"status"`
			} `json:"result"`
		}
		if err := conn.ReadJSON(&m); err != nil {
			mintAlive(t)
			t.Fatalf("subscribing after the drops: %v", err)
		}
		acked = m.ID != nil && *m.ID == 7 && m.Result != nil && m.Result.Status == "OK"
	}
	mintAlive(t)
}

// testNUT17Reconnects: capvend's connection to the mint is cut; its
// quotes fall back to polling, it reconnects, subscribes again, and a
// quote paid then is reported through the new subscription.
func testNUT17Reconnects(t *testing.T) {
	proxy := billingtest.NewProxy(t, mintHostPort())
	l := openLedger(t)
	b := newBackend(t, l, "http://"+proxy.Addr(), t.TempDir(), wsOnly)
	ev := newEvents()
	runBackend(t, b, ev)
	c := priced(t, l, 7)
	p, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	until(t, 30*time.Second, "subscription acknowledged", func() bool { return b.Covered(p.Ref) })
	proxy.Cut()
	until(t, 30*time.Second, "quote uncovered after the drop", func() bool { return !b.Covered(p.Ref) })
	proxy.Restore()
	until(t, 30*time.Second, "subscribed again after the drop", func() bool { return b.Covered(p.Ref) })
	if err := pay(context.Background(), p.Bolt11); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, p.Ref, vend.PaymentSettled, 30*time.Second)
	mintAlive(t)
}

// newMintQuote asks the stack's mint for a 1-sat mint quote and returns
// its id.
func newMintQuote(t *testing.T) string {
	t.Helper()
	resp, err := http.Post(stack.MintURL+"/v1/mint/quote/bolt11", "application/json", strings.NewReader(`{"amount":1,"unit":"sat"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var q struct {
		Quote string `json:"quote"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || resp.StatusCode != http.StatusOK || q.Quote == "" {
		t.Fatalf("mint quote: HTTP %d, %v", resp.StatusCode, err)
	}
	return q.Quote
}
