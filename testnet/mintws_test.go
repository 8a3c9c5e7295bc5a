package testnet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// gonutsLike is a NUT-17 endpoint that behaves like gonuts v0.4.2's where
// it hurts: a subscription's initial states are sent by a goroutine of
// their own, here later than any answer and than the guard's quiet
// period (a slow machine). When
// its connection ends it reports what it still had: subscriptions and
// initial states to send. gonuts panics when the latter is not zero.
type gonutsLike struct {
	mu     sync.Mutex
	ends   chan [2]int // {open subscriptions, unsent initial states}
	unsent int
}

func (g *gonutsLike) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/ws" {
		fmt.Fprint(w, `{"name":"fake"}`)
		return
	}
	conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	var wmu sync.Mutex
	send := func(v any) {
		wmu.Lock()
		defer wmu.Unlock()
		conn.WriteJSON(v)
	}
	subs := map[string]bool{}
	for {
		var req struct {
			Method string `json:"method"`
			ID     int    `json:"id"`
			Params struct {
				SubID   string   `json:"subId"`
				Filters []string `json:"filters"`
			} `json:"params"`
		}
		if err := conn.ReadJSON(&req); err != nil {
			g.mu.Lock()
			g.ends <- [2]int{len(subs), g.unsent}
			g.mu.Unlock()
			return
		}
		answer := map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"status": "OK", "subId": req.Params.SubID}}
		switch req.Method {
		case "subscribe":
			subs[req.Params.SubID] = true
			g.mu.Lock()
			g.unsent += len(req.Params.Filters)
			g.mu.Unlock()
			ids, sub := req.Params.Filters, req.Params.SubID
			time.AfterFunc(guardQuiet+200*time.Millisecond, func() {
				for _, id := range ids {
					send(map[string]any{"jsonrpc": "2.0", "method": "subscribe", "params": map[string]any{"subId": sub, "payload": map[string]any{"quote": id, "state": "UNPAID"}}})
					g.mu.Lock()
					g.unsent--
					g.mu.Unlock()
				}
			})
		case "unsubscribe":
			if !subs[req.Params.SubID] {
				answer = map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": 1000, "message": "no such subscription"}}
			}
			delete(subs, req.Params.SubID)
		}
		send(answer)
	}
}

// TestGuardWSDrainsBeforeClosing: a subscriber that vanishes right after
// subscribing does not close gonuts' connection under it: the guard
// unsubscribes and lets the initial states go out first. The rest of the
// mint's API and a subscriber that stays are served as before.
func TestGuardWSDrainsBeforeClosing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	fake := &gonutsLike{ends: make(chan [2]int, 10)}
	h, stop, err := guardWS(ctx, fake, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer func() {
		srv.Close()
		cancel()
		stop()
	}()

	resp, err := http.Get(srv.URL + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != `{"name":"fake"}` {
		t.Fatalf("/v1/info through the guard: %s", body)
	}

	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/ws"
	ids := make([]string, 25)
	for i := range ids {
		ids[i] = fmt.Sprint("q", i)
	}
	subscribe := func(c *websocket.Conn, sub string, id int) {
		t.Helper()
		if err := c.WriteJSON(map[string]any{"jsonrpc": "2.0", "method": "subscribe", "id": id,
			"params": map[string]any{"kind": "bolt11_mint_quote", "subId": sub, "filters": ids}}); err != nil {
			t.Fatal(err)
		}
	}

	// A subscriber that stays gets the answer and every initial state.
	stays, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	subscribe(stays, "stays", 1)
	stays.SetReadDeadline(time.Now().Add(30 * time.Second))
	var answers, notes int
	for notes < len(ids) || answers < 1 {
		var m struct {
			ID     *int            `json:"id"`
			Params json.RawMessage `json:"params"`
		}
		if err := stays.ReadJSON(&m); err != nil {
			t.Fatalf("after %d answers, %d notifications: %v", answers, notes, err)
		}
		if m.ID != nil {
			answers++
		} else {
			notes++
		}
	}

	// Subscribers that vanish: at once, and after the mint's answer.
	for i := range 2 {
		c, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		subscribe(c, fmt.Sprint("gone-", i), 1)
		subscribe(c, fmt.Sprint("gone-", i, "-b"), 2)
		if i == 1 {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, _, err := c.ReadMessage(); err != nil {
				t.Fatal(err)
			}
		}
		c.NetConn().Close()
		select {
		case end := <-fake.ends:
			if end != [2]int{0, 0} {
				t.Fatalf("gonuts' connection closed with %d subscriptions open and %d initial states unsent", end[0], end[1])
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the guard never closed gonuts' connection")
		}
	}
	stays.Close()
	if end := <-fake.ends; end != [2]int{0, 0} {
		t.Fatalf("the staying subscriber's end: %d subscriptions open, %d initial states unsent", end[0], end[1])
	}
}
