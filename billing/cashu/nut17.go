package cashu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/cashu/nuts/nut06"
	"github.com/elnosh/gonuts/cashu/nuts/nut17"
	"github.com/gorilla/websocket"

	"github.com/capvend/capvend/internal/retry"
)

// NUT-17 (opt-in, Config.Websocket): the mint pushes mint quote state
// changes over a websocket, so a paid quote is seen at once instead of at
// the next poll. Off by default because gonuts v0.4.2's mint panics when a
// subscriber disconnects while it is sending (see Config.Websocket); when
// capvend itself ends the connection it unsubscribes and waits for the
// mint first (closeGently). TestNUT17 runs it against the regtest stack's
// mint, whose websocket is guarded against that panic. gonuts v0.4.2's
// wallet has a subscription manager (wallet/submanager) but it is not wired
// into Wallet, shares maps between goroutines without locks, waits 10 s per
// subscription and never reconnects; capvend speaks the protocol itself on
// one connection with its own reconnect.
//
// Limits of gonuts' mint: 100 subscriptions per connection, 2048 bytes per
// request (about 25 quote ids), and it only publishes a payment from the
// per-quote watcher started when the quote was created (a mint restart
// loses it). So polling stays as the safety net: quotes covered by an
// acknowledged subscription are polled every SafetyPoll, others every
// PollInterval.
const (
	wsBatch   = 25  // quote ids per subscription
	wsMaxSubs = 100 // subscriptions per connection
)

// wsSub is one subscription: a fixed set of quote ids.
type wsSub struct {
	id    string
	ids   []string
	req   int  // JSON-RPC id of the subscribe request
	acked bool // the mint answered OK
	notes int  // notifications received (the first len(ids) are the initial states)
}

// wsWatcher keeps subscriptions for the watched quotes of one mint.
type wsWatcher struct {
	b    *Backend
	mint string

	subs    map[string]*wsSub // by subId
	byQuote map[string]*wsSub
	byReq   map[int]*wsSub
	refused map[string]bool // quotes the mint would not subscribe: polled only
	nextReq int
	nextSub int
}

// errNoNUT17: the mint offers no bolt11_mint_quote subscriptions.
var errNoNUT17 = errors.New("mint offers no NUT-17 mint quote subscriptions")

// runWS keeps a NUT-17 connection to the quote mint until ctx ends,
// reconnecting with backoff (PollInterval doubling to MaxBackoff,
// jittered; back to PollInterval after a connection that lasted 10 s). It
// returns when ctx ends, or at once if the mint does not offer
// bolt11_mint_quote subscriptions.
func (b *Backend) runWS(ctx context.Context) {
	mint := b.mints[0]
	policy := retry.Policy{
		Base:  b.cfg.PollInterval,
		Max:   b.cfg.MaxBackoff,
		Reset: 10 * time.Second, // it worked for a while
		OnRetry: func(err error, _ int, wait time.Duration) {
			b.log.Debug("mint websocket down; reconnecting", logMint, mint, logErr, err, logBackoff, wait)
		},
	}
	err := policy.Do(ctx, func(ctx context.Context) error {
		defer b.uncoverAll()
		ok, err := b.supportsNUT17(ctx, mint)
		if err != nil {
			return err
		}
		if !ok {
			return retry.Permanent(errNoNUT17)
		}
		w := &wsWatcher{b: b, mint: mint}
		return w.run(ctx)
	})
	if errors.Is(err, errNoNUT17) {
		b.log.Info("mint offers no NUT-17 mint quote subscriptions: polling only", logMint, mint)
	}
}

func (b *Backend) supportsNUT17(ctx context.Context, mint string) (bool, error) {
	var info nut06.MintInfo
	if err := b.getJSON(ctx, mint+"/v1/info", &info); err != nil {
		var me *mintError
		if errors.As(err, &me) {
			return false, nil
		}
		return false, err
	}
	for _, m := range info.Nuts.Nut17.Supported {
		if m.Method == "bolt11" && slices.Contains(m.Commands, nut17.Bolt11MintQuote.String()) {
			return true, nil
		}
	}
	return false, nil
}

func wsURL(mint string) (string, error) {
	u, err := url.Parse(mint)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/v1/ws"
	return u.String(), nil
}

// run serves one connection until it breaks or ctx ends.
func (w *wsWatcher) run(ctx context.Context) error {
	u, err := wsURL(w.mint)
	if err != nil {
		return err
	}
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	conn, _, err := d.DialContext(ctx, u, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	w.subs, w.byQuote, w.byReq = map[string]*wsSub{}, map[string]*wsSub{}, map[int]*wsSub{}
	w.refused = map[string]bool{}
	w.b.log.Debug("mint websocket connected", logMint, w.mint)

	// The mint pings every 30 s; a connection silent for longer than
	// that is dead.
	const readTimeout = 75 * time.Second
	conn.SetReadDeadline(time.Now().Add(readTimeout))
	conn.SetPingHandler(func(data string) error {
		conn.SetReadDeadline(time.Now().Add(readTimeout))
		return conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(5*time.Second))
	})
	msgs := make(chan []byte)
	readErr := make(chan error, 1)
	stop := make(chan struct{}) // run returned: the reader hands on no more
	defer close(stop)
	go func() {
		for {
			_, m, err := conn.ReadMessage()
			if err != nil {
				readErr <- err
				return
			}
			conn.SetReadDeadline(time.Now().Add(readTimeout))
			select {
			case msgs <- m:
			case <-stop:
				return
			}
		}
	}()
	tick := time.NewTicker(time.Second) // drop subscriptions of settled quotes
	defer tick.Stop()
	// New quotes are subscribed in batches: a burst of requests waits
	// 25 ms and costs one subscription, not one each.
	var batch <-chan time.Time
	if err := w.sync(conn); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			w.closeGently(conn, msgs, readErr)
			return ctx.Err()
		case err := <-readErr:
			return err
		case m := <-msgs:
			w.handle(m)
		case <-w.b.wsKick:
			if batch == nil {
				batch = time.After(25 * time.Millisecond)
			}
		case <-batch:
			batch = nil
			if err := w.sync(conn); err != nil {
				return err
			}
		case <-tick.C:
			if err := w.sync(conn); err != nil {
				return err
			}
		}
	}
}

// sync subscribes watched quotes that have no subscription yet and drops
// subscriptions none of whose quotes is watched any more.
func (w *wsWatcher) sync(conn *websocket.Conn) error {
	watched := w.b.watchedRefs(w.mint)
	var fresh []string
	for _, ref := range watched {
		if w.byQuote[ref] == nil && !w.refused[ref] {
			fresh = append(fresh, ref)
		}
	}
	live := make(map[string]bool, len(watched))
	for _, ref := range watched {
		live[ref] = true
	}
	for id, s := range w.subs {
		if slices.ContainsFunc(s.ids, func(r string) bool { return live[r] }) {
			continue
		}
		w.nextReq++
		if err := w.write(conn, nut17.WsRequest{JsonRPC: "2.0", Method: nut17.UNSUBSCRIBE, Params: nut17.RequestParams{SubId: id}, Id: w.nextReq}); err != nil {
			return err
		}
		w.drop(s)
	}
	var batches [][]string
	for len(fresh) > 0 {
		n := min(len(fresh), wsBatch)
		batches = append(batches, fresh[:n])
		fresh = fresh[n:]
	}
	for _, ids := range batches {
		if len(w.subs) >= wsMaxSubs {
			break // the rest is polled at PollInterval
		}
		w.nextReq++
		w.nextSub++
		s := &wsSub{id: fmt.Sprintf("capvend-%d", w.nextSub), ids: slices.Clone(ids), req: w.nextReq}
		req := nut17.WsRequest{JsonRPC: "2.0", Method: nut17.SUBSCRIBE, Id: s.req,
			Params: nut17.RequestParams{Kind: nut17.Bolt11MintQuote.String(), SubId: s.id, Filters: s.ids}}
		if err := w.write(conn, req); err != nil {
			return err
		}
		w.subs[s.id], w.byReq[s.req] = s, s
		for _, ref := range s.ids {
			w.byQuote[ref] = s
		}
	}
	return nil
}

// closeGentlyWait bounds how long closeGently waits for the mint.
const closeGentlyWait = 2 * time.Second

// closeGently ends the connection without crashing a gonuts v0.4.2 mint:
// its connection reader closes the channel its senders write to as soon as
// it sees the close, and a subscription's initial quote states (or a
// notification) still being sent then panic the mint ("send on closed
// channel", mint/websocket.go:260). So every subscription is unsubscribed
// first, and the close frame goes only once the mint has answered each
// unsubscribe and sent each subscription's initial states (at most
// closeGentlyWait). A connection that breaks, rather than being closed by
// capvend, cannot be helped: see Config.Websocket.
func (w *wsWatcher) closeGently(conn *websocket.Conn, msgs <-chan []byte, readErr <-chan error) {
	pending := map[int]bool{}
	for id := range w.subs {
		w.nextReq++
		if w.write(conn, nut17.WsRequest{JsonRPC: "2.0", Method: nut17.UNSUBSCRIBE, Params: nut17.RequestParams{SubId: id}, Id: w.nextReq}) != nil {
			return // broken: nothing to close gently
		}
		pending[w.nextReq] = true
	}
	give := time.NewTimer(closeGentlyWait)
	defer give.Stop()
wait:
	for len(pending) > 0 || w.sending() {
		select {
		case m := <-msgs:
			var ans struct {
				ID *int `json:"id"`
			}
			if json.Unmarshal(m, &ans) == nil && ans.ID != nil && pending[*ans.ID] {
				delete(pending, *ans.ID)
				continue
			}
			w.handle(m)
		case <-readErr:
			return
		case <-give.C:
			w.b.log.Debug("mint websocket: closing before the mint answered", logMint, w.mint, "unanswered", len(pending))
			break wait
		}
	}
	conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
}

// sending reports whether the mint may still be sending a subscription's
// initial states: one per quote of every subscription it did not refuse.
func (w *wsWatcher) sending() bool {
	for _, s := range w.subs {
		if s.notes < len(s.ids) {
			return true
		}
	}
	return false
}

func (w *wsWatcher) write(conn *websocket.Conn, v any) error {
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return conn.WriteJSON(v)
}

func (w *wsWatcher) drop(s *wsSub) {
	delete(w.subs, s.id)
	delete(w.byReq, s.req)
	for _, ref := range s.ids {
		if w.byQuote[ref] == s {
			delete(w.byQuote, ref)
		}
	}
	w.b.cover(false, s.ids...)
}

// handle processes one message of the mint: a notification of a quote's
// state, or the answer to a (un)subscribe request.
func (w *wsWatcher) handle(m []byte) {
	var msg struct {
		Method string           `json:"method"`
		Params *json.RawMessage `json:"params"`
		Result *nut17.Result    `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		ID *int `json:"id"`
	}
	if err := json.Unmarshal(m, &msg); err != nil {
		return
	}
	switch {
	case msg.Params != nil:
		var p nut17.NotificationParams
		if json.Unmarshal(*msg.Params, &p) != nil {
			return
		}
		var q nut04.PostMintQuoteBolt11Response
		if json.Unmarshal(p.Payload, &q) != nil || q.Quote == "" {
			return
		}
		s := w.subs[p.SubId]
		if s == nil || !slices.Contains(s.ids, q.Quote) {
			return // not ours
		}
		s.notes++
		if q.State == nut04.Paid || q.State == nut04.Issued {
			w.b.urgent(q.Quote)
		}
	case msg.Result != nil && msg.ID != nil:
		if s := w.byReq[*msg.ID]; s != nil && msg.Result.Status == nut17.OK {
			s.acked = true
			w.b.cover(true, s.ids...)
		}
	case msg.Error != nil && msg.ID != nil:
		if s := w.byReq[*msg.ID]; s != nil {
			// A quote the mint does not know, or its subscription
			// limit: these quotes are polled only.
			w.b.log.Debug("mint refused a subscription", logMint, w.mint, logErr, msg.Error.Message)
			for _, ref := range s.ids {
				w.refused[ref] = true
			}
			w.drop(s)
		}
	}
}
