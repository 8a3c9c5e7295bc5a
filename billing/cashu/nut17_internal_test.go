package cashu

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/cashu/nuts/nut17"
	"github.com/gorilla/websocket"
)

// fakeNUT17 is a NUT-17 mint that behaves like gonuts v0.4.2 where it
// hurts: a subscription's initial quote states are sent by a goroutine of
// their own, apart from the answers, so they may still be on their way
// after the mint answered an unsubscribe. Here they go holdInitial after
// the subscribe, later than the answers: the worst case for a client that
// closes too early. It records what was still to send when the client's
// close arrived: a gonuts mint panics then ("send on closed channel").
type fakeNUT17 struct {
	t           *testing.T
	holdInitial time.Duration

	mu         sync.Mutex
	subscribed chan string // subIds, as subscribe requests arrive
	unsent     int         // initial states not yet sent
	closed     chan closeSeen
}

type closeSeen struct {
	unsent int  // initial states the mint would still send
	frame  bool // a close frame, not a dropped connection
	code   int
}

func newFakeNUT17(t *testing.T) (*fakeNUT17, *httptest.Server) {
	f := &fakeNUT17{t: t, holdInitial: 200 * time.Millisecond, subscribed: make(chan string, 100), closed: make(chan closeSeen, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/info", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"nuts":{"17":{"supported":[{"method":"bolt11","unit":"sat","commands":["bolt11_mint_quote"]}]}}}`)
	})
	mux.HandleFunc("/v1/ws", f.serveWS)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeNUT17) serveWS(w http.ResponseWriter, r *http.Request) {
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
	var senders sync.WaitGroup
	defer senders.Wait()
	for {
		_, m, err := conn.ReadMessage()
		if err != nil {
			f.mu.Lock()
			seen := closeSeen{unsent: f.unsent}
			f.mu.Unlock()
			if ce, ok := err.(*websocket.CloseError); ok {
				seen.frame, seen.code = true, ce.Code
			}
			f.closed <- seen
			return
		}
		var req nut17.WsRequest
		if err := json.Unmarshal(m, &req); err != nil {
			f.t.Errorf("fake mint: bad request %s", m)
			continue
		}
		switch req.Method {
		case nut17.SUBSCRIBE:
			f.mu.Lock()
			f.unsent += len(req.Params.Filters)
			f.mu.Unlock()
			send(nut17.WsResponse{JsonRPC: "2.0", Result: nut17.Result{Status: nut17.OK, SubId: req.Params.SubId}, Id: req.Id})
			ids := req.Params.Filters
			senders.Add(1)
			time.AfterFunc(f.holdInitial, func() {
				defer senders.Done()
				for _, id := range ids {
					payload, _ := json.Marshal(&nut04.PostMintQuoteBolt11Response{Quote: id, State: nut04.Unpaid})
					send(nut17.WsNotification{JsonRPC: "2.0", Method: nut17.SUBSCRIBE, Params: nut17.NotificationParams{SubId: req.Params.SubId, Payload: payload}})
					f.mu.Lock()
					f.unsent--
					f.mu.Unlock()
				}
			})
			f.subscribed <- req.Params.SubId
		case nut17.UNSUBSCRIBE:
			send(nut17.WsResponse{JsonRPC: "2.0", Result: nut17.Result{Status: nut17.OK, SubId: req.Params.SubId}, Id: req.Id})
		}
	}
}

// TestNUT17ClosesGently: when capvend stops, it unsubscribes and waits for
// the mint's answers and for every initial state before its close frame,
// so a gonuts mint has nothing left to send when it sees the close.
func TestNUT17ClosesGently(t *testing.T) {
	f, srv := newFakeNUT17(t)
	b := &Backend{
		cfg:     Config{PollInterval: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, SafetyPoll: time.Hour, Websocket: true},
		mints:   []string{srv.URL},
		http:    srv.Client(),
		log:     slog.New(slog.DiscardHandler),
		now:     time.Now,
		watched: map[string]*watchedQuote{},
		wake:    make(chan struct{}, 1),
		wsKick:  make(chan struct{}, 1),
	}
	const quotes = 30 // two subscriptions: 25 + 5
	for i := range quotes {
		ref := fmt.Sprintf("quote-%02d", i)
		b.watched[ref] = &watchedQuote{ref: ref, mint: srv.URL, created: time.Now(), expiresAt: time.Now().Add(time.Hour), quoteExpiry: time.Now().Add(time.Hour)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.runWS(ctx)
	}()
	for range 2 {
		select {
		case <-f.subscribed:
		case <-time.After(30 * time.Second):
			t.Fatal("no subscription")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("runWS did not return")
	}
	select {
	case seen := <-f.closed:
		if seen.unsent != 0 {
			t.Errorf("closed while the mint still had %d initial states to send (a gonuts mint panics)", seen.unsent)
		}
		if !seen.frame || seen.code != websocket.CloseNormalClosure {
			t.Errorf("ended by %+v, want a normal close frame", seen)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fake mint saw no close")
	}
}
