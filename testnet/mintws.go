package testnet

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// NUT-17 guard. gonuts v0.4.2's mint (and its master as of April 2025)
// crashes when a websocket subscriber goes away while the mint is sending
// to it: the connection's reader, on its read error, closes the channel
// that the writer drains (mint/websocket.go, Client.close), while the
// goroutines that send a subscription's initial quote states
// (websocket.go:260) or its later notifications (listenForSubscriptionUpdates)
// may still be sending on it: "panic: send on closed channel" in a
// goroutine of gonuts, which nothing outside gonuts can recover, and the
// mint process dies. A subscriber that drops its connection just after
// subscribing, or just as a quote it watches is paid, takes the mint down.
//
// The stack's mint therefore does not let its subscribers' connections
// reach gonuts. guardWS terminates each subscriber's websocket itself and
// relays its messages over a connection of its own to gonuts' handler,
// served on a private loopback listener. When the subscriber goes away,
// the guard unsubscribes what it had subscribed, waits for gonuts' answers,
// for every subscription's initial states (one per quote) and for the
// connection to fall quiet, and only then closes its connection to gonuts:
// by then no goroutine of gonuts sends on it. What a subscriber sees is unchanged:
// the same messages both ways, and the mint's pings.
//
// This protects capvend's test and demo mint only; an operator running a
// gonuts mint needs the same in front of it (see billing/cashu's
// Config.Websocket).

// guardDrain bounds how long the guard drains a connection to gonuts after
// its subscriber left; guardQuiet is how long it must be silent first.
const (
	guardDrain = 10 * time.Second
	guardQuiet = 500 * time.Millisecond
)

// guardWS serves h (gonuts' handler) with its /v1/ws endpoint behind the
// guard until ctx ends. h itself is served on a private loopback listener
// for the guard's own connections; stop closes it and waits for the
// guard's relays.
func guardWS(ctx context.Context, h http.Handler, log *slog.Logger) (guarded http.Handler, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	inner := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go inner.Serve(ln)
	g := &wsGuard{upstream: "ws://" + ln.Addr().String() + "/v1/ws", log: log, ctx: ctx}
	// Routed by hand, not by a ServeMux: every other request reaches
	// gonuts' own router exactly as before.
	guarded = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/ws" {
			g.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
	stop = func() {
		g.wg.Wait() // relays end with ctx
		inner.Close()
	}
	return guarded, stop, nil
}

type wsGuard struct {
	upstream string
	log      *slog.Logger
	ctx      context.Context
	wg       sync.WaitGroup
}

var guardUpgrader = websocket.Upgrader{
	ReadBufferSize:  1024,
	WriteBufferSize: 1024,
	CheckOrigin:     func(*http.Request) bool { return true },
}

func (g *wsGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "websocket only", http.StatusMethodNotAllowed)
		return
	}
	up, _, err := websocket.DefaultDialer.DialContext(r.Context(), g.upstream, nil)
	if err != nil {
		http.Error(w, "mint websocket unavailable", http.StatusBadGateway)
		return
	}
	sub, err := guardUpgrader.Upgrade(w, r, nil)
	if err != nil {
		// gonuts saw a connection that never subscribed: closing it
		// is safe.
		up.Close()
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.relay(sub, up)
	}()
}

// relay copies messages between a subscriber and gonuts until either side
// ends or the mint shuts down, then lets gonuts' side down gently.
func (g *wsGuard) relay(sub, up *websocket.Conn) {
	defer sub.Close()
	stop := make(chan struct{}) // the relay is over: readers stop handing on
	defer close(stop)
	// gonuts pings its subscribers every 30 s; pass them on (a
	// subscriber treats a silent connection as dead). The guard answers
	// gonuts itself.
	up.SetPingHandler(func(data string) error {
		sub.WriteControl(websocket.PingMessage, []byte(data), time.Now().Add(5*time.Second))
		return up.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(5*time.Second))
	})
	fromMint, upDone := readAll(up, stop)
	fromSub, subDone := readAll(sub, stop)
	subs := guardSubs{} // what the subscriber subscribed
	for {
		select {
		case m := <-fromSub:
			subs.request(m)
			up.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if err := up.WriteMessage(websocket.TextMessage, m); err != nil {
				up.Close() // broken already
				return
			}
		case m := <-fromMint:
			subs.answer(m)
			sub.SetWriteDeadline(time.Now().Add(10 * time.Second))
			sub.WriteMessage(websocket.TextMessage, m) // a gone subscriber shows as a read error
		case <-subDone:
			g.drain(up, subs, fromMint, upDone)
			return
		case <-upDone:
			// gonuts closed the connection (its mint is shutting
			// down): nothing of gonuts sends on it any more.
			up.Close()
			return
		case <-g.ctx.Done():
			sub.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, ""), time.Now().Add(time.Second))
			g.drain(up, subs, fromMint, upDone)
			return
		}
	}
}

// readAll reads c's messages onto a channel until c fails (done closes) or
// stop closes.
func readAll(c *websocket.Conn, stop <-chan struct{}) (<-chan []byte, <-chan struct{}) {
	msgs, done := make(chan []byte), make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-stop:
				return
			}
		}
	}()
	return msgs, done
}

// drain unsubscribes everything the gone subscriber had subscribed, waits
// for gonuts' answers, for every subscription's initial states and for
// quiet, then closes the connection to gonuts.
func (g *wsGuard) drain(up *websocket.Conn, subs guardSubs, fromMint <-chan []byte, upDone <-chan struct{}) {
	defer up.Close()
	pending := map[int]bool{}
	id := -1 // the guard's own request ids: negative, apart from the subscriber's
	for subID := range subs {
		req := map[string]any{"jsonrpc": "2.0", "method": "unsubscribe", "params": map[string]any{"subId": subID}, "id": id}
		up.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := up.WriteJSON(req); err != nil {
			return // gonuts' side is broken too: nothing left to protect
		}
		pending[id] = true
		id--
	}
	give := time.NewTimer(guardDrain)
	defer give.Stop()
	quiet := time.NewTimer(guardQuiet)
	defer quiet.Stop()
	for {
		select {
		case m := <-fromMint:
			if id, ok := subs.answer(m); ok {
				delete(pending, id)
			}
			quiet.Reset(guardQuiet)
		case <-quiet.C:
			if len(pending) == 0 && !subs.sending() {
				return
			}
			quiet.Reset(guardQuiet)
		case <-give.C:
			g.log.Warn("mint websocket guard: gonuts did not answer the unsubscribes; closing anyway", "pending", len(pending))
			return
		case <-upDone:
			return
		}
	}
}

// guardSubs are a subscriber's subscriptions by subId, with the number of
// initial quote states gonuts owes each (one per filter) and has sent.
type guardSubs map[string]*guardSub

type guardSub struct {
	req        int // JSON-RPC id of the subscribe request
	want, seen int
	refused    bool
}

// request notes the subscriptions a subscriber's request opens or closes.
func (s guardSubs) request(m []byte) {
	var req struct {
		Method string `json:"method"`
		ID     int    `json:"id"`
		Params struct {
			SubID   string   `json:"subId"`
			Filters []string `json:"filters"`
		} `json:"params"`
	}
	if json.Unmarshal(m, &req) != nil || req.Params.SubID == "" {
		return
	}
	switch strings.ToLower(req.Method) {
	case "subscribe":
		if s[req.Params.SubID] == nil {
			s[req.Params.SubID] = &guardSub{req: req.ID, want: len(req.Params.Filters)}
		}
	case "unsubscribe":
		if sub := s[req.Params.SubID]; sub != nil {
			delete(s, req.Params.SubID) // initial states still due: drain's quiet covers them
		}
	}
}

// answer counts a message of gonuts: a notification for a subscription,
// or an answer (whose id it returns); an error answering a subscribe means
// gonuts owes that subscription nothing.
func (s guardSubs) answer(m []byte) (id int, ok bool) {
	var msg struct {
		ID     *int            `json:"id"`
		Error  json.RawMessage `json:"error"`
		Params *struct {
			SubID string `json:"subId"`
		} `json:"params"`
	}
	if json.Unmarshal(m, &msg) != nil {
		return 0, false
	}
	if msg.Params != nil {
		if sub := s[msg.Params.SubID]; sub != nil {
			sub.seen++
		}
	}
	if msg.ID == nil {
		return 0, false
	}
	if msg.Error != nil {
		for _, sub := range s {
			if sub.req == *msg.ID {
				sub.refused = true
			}
		}
	}
	return *msg.ID, true
}

// sending reports whether gonuts may still be sending initial states.
func (s guardSubs) sending() bool {
	for _, sub := range s {
		if !sub.refused && sub.seen < sub.want {
			return true
		}
	}
	return false
}
