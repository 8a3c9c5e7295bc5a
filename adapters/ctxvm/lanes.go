package ctxvm

import (
	"context"
	"encoding/hex"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip13"
)

// Lanes: requests that do not queue behind a flood.
//
// go-nostr hands each event of a subscription to its reader from a
// goroutine of its own, and those goroutines take the subscription's
// mutex in turn. Under a flood the line before Run is thousands of events
// long (capvend-flood: about 3,000, from 1,000 fresh keys), and a
// customer's request waits behind all of it: 2 to 4 seconds, before the
// Vendor sees it and can put a known payer first. So beside the
// subscription to every request, Run keeps lanes, subscriptions on the
// same relay connections that carry only what should not wait:
//
//   - payers: the same filter for the authors who paid for a call in this
//     run (PayerLister), the maxLaneAuthors most recent, subscribed again
//     when they change: identities are free on Nostr, a payment history
//     is not;
//   - work (with Config.PowDifficulty): the same filter, with go-nostr's
//     duplicate check (which its relay reader runs on each event's id
//     before queueing it) dropping every event whose id has fewer leading
//     zero bits than the difficulty, so only requests that did the work
//     queue there. (A request needs none to pay with a Cashu token, or
//     for a method that is neither a free call nor an unpaid quote: those
//     come by the main subscription as before.)
//
// An event that came by one subscription is dropped when it comes by
// another (laneSeen), so each is served once. A lane that fails is tried
// again; everything it would carry still comes by the main subscription.

// PayerLister is what a Vendor may also do: list the clients that paid
// for a call in this run, the most recently paid first, at most n (limit
// keys: Nostr pubkeys among them). Their requests come by a lane of
// their own (see Lanes in lanes.go).
type PayerLister interface {
	RecentPayers(n int) []string
}

const (
	// maxLaneAuthors bounds the authors of the payers lane's filter
	// (relays bound a filter's size).
	maxLaneAuthors = 100
	// laneRefresh is how often the payers lane looks for new payers.
	laneRefresh = time.Second
	// laneRetry is the wait before a lane subscribes again after its
	// subscription failed or ended.
	laneRetry = 5 * time.Second
	// seenFor is how long an event id is remembered (go-nostr's pool
	// forgets the ids it saw after a minute too), and maxSeen bounds how
	// many are.
	seenFor = time.Minute
	maxSeen = 1 << 16
)

// lane is a subscription beside the main one (see Lanes).
type lane uint8

const (
	lanePayers lane = iota
	laneWork
	laneMain // the main subscription, to every request (see startMain)
)

// startLanes subscribes the lanes on every relay of the pool with filter
// (see Lanes); their events come on the returned channel until ctx ends.
// wg counts the lanes' goroutines.
func (s *Server) startLanes(ctx context.Context, pool *nostr.SimplePool, filter nostr.Filter, wg *sync.WaitGroup) <-chan *nostr.Event {
	out := make(chan *nostr.Event)
	var lanes []lane
	if _, ok := s.cfg.Vendor.(PayerLister); ok {
		lanes = append(lanes, lanePayers)
	}
	if s.cfg.PowDifficulty > 0 {
		lanes = append(lanes, laneWork)
	}
	for _, url := range s.cfg.Relays {
		for _, l := range lanes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.runLane(ctx, pool, url, l, filter, out, nil)
			}()
		}
	}
	return out
}

// startMain subscribes filter (since the Window) on every relay of the
// pool, each relay's subscription on its own as a lane's, and passes
// their events to the returned channel until ctx ends; s.ready is closed
// once every relay has sent the end of its stored events. Not the pool's
// SubscribeMany: its duplicate check drops an event id seen in the last
// one to two minutes, each copy starting that wait again, so a request
// sent again after the instance that claimed it died (see
// Config.Claims) would never reach this one. Run drops copies itself,
// for seenFor (laneSeen). A subscription that ends is made again from
// then on, as the pool's would be. wg counts the goroutines.
func (s *Server) startMain(ctx context.Context, pool *nostr.SimplePool, filter nostr.Filter, wg *sync.WaitGroup) <-chan *nostr.Event {
	out := make(chan *nostr.Event)
	var left atomic.Int64
	left.Store(int64(len(s.cfg.Relays)))
	eosed := func() {
		if left.Add(-1) == 0 {
			close(s.ready)
		}
	}
	for _, url := range s.cfg.Relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.runLane(ctx, pool, url, laneMain, filter, out, eosed)
		}()
	}
	return out
}

// runLane keeps lane l subscribed on relay url until ctx ends. eose, if
// set, is called once, at the first end of stored events. The main
// subscription, subscribed again after its connection broke, starts
// from where it was (see resume); a lane from then on.
func (s *Server) runLane(ctx context.Context, pool *nostr.SimplePool, url string, l lane, base nostr.Filter, out chan<- *nostr.Event, eose func()) {
	var first sync.Once
	var pos *resume
	if l == laneMain {
		pos = &resume{}
	}
	resubscribed := false
	for ctx.Err() == nil {
		f := base
		// From now on: what was sent before came by the main
		// subscription, or, for its own first, since base's Since.
		since := nostr.Timestamp(s.cfg.Now().Unix())
		if pos != nil && resubscribed {
			since = pos.since(s.cfg.Now(), s.cfg.Window)
		}
		if l != laneMain || resubscribed {
			f.Since = &since
		}
		var opts []nostr.SubscriptionOption
		var authors []string
		switch l {
		case lanePayers:
			if authors = s.payerAuthors(); len(authors) == 0 {
				sleepCtx(ctx, laneRefresh)
				continue
			}
			f.Authors = authors
		case laneWork:
			d := s.cfg.PowDifficulty
			opts = append(opts, nostr.WithCheckDuplicate(func(id, _ string) bool { return nip13.Difficulty(id) < d }))
		}
		relay, err := pool.EnsureRelay(url)
		if err != nil {
			s.relayFailed(l, url, err)
			sleepCtx(ctx, laneRetry)
			continue
		}
		subCtx, cancel := context.WithCancel(ctx)
		sub, err := relay.Subscribe(subCtx, nostr.Filters{f}, opts...)
		if err != nil {
			cancel()
			s.relayFailed(l, url, err)
			sleepCtx(ctx, laneRetry)
			continue
		}
		if resubscribed && pos != nil {
			s.log.Info("nostr relay subscribed again", logKeyRelay, url, "since", since.Time().UTC().Format(time.RFC3339))
		}
		resubscribed = true
		onEOSE := func() {
			if l == laneMain {
				s.relaySubscribed(url)
			}
			if eose != nil {
				first.Do(eose)
			}
		}
		ended := s.readLane(ctx, sub, authors, out, pos, onEOSE)
		sub.Unsub()
		cancel()
		if ended {
			if pos != nil {
				err := context.Cause(sub.Context)
				s.relayFailed(l, url, err)
				s.log.Warn("nostr relay subscription ended", logKeyRelay, url, logKeyErr, err)
			}
			sleepCtx(ctx, laneRetry)
		}
	}
}

// readLane passes sub's events to out until ctx ends (false), sub ends
// (true), or, when authors is set, the payers to follow changed (false).
// It calls eose at the end of sub's stored events. With pos (the main
// subscription), a stored event that came before on this relay is
// dropped, and the events are noted in pos.
func (s *Server) readLane(ctx context.Context, sub *nostr.Subscription, authors []string, out chan<- *nostr.Event, pos *resume, eose func()) (ended bool) {
	var tick <-chan time.Time
	if authors != nil {
		t := time.NewTicker(laneRefresh)
		defer t.Stop()
		tick = t.C
	}
	stored := true
	for {
		select {
		case ev, ok := <-sub.Events:
			if !ok {
				return true
			}
			if pos != nil && pos.note(ev, stored, s.cfg.Now()) {
				continue
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return false
			}
		case <-sub.EndOfStoredEvents:
			stored = false
			if pos != nil {
				pos.eose(s.cfg.Now())
			}
			eose()
		case <-tick:
			if !slices.Equal(authors, s.payerAuthors()) {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
}

const (
	// resumeMargin is how far before the newest created_at it saw on a
	// relay the main subscription starts again after its connection
	// broke: a request published meanwhile may be dated a little
	// earlier (its client's clock). resumeMax bounds how far back it
	// starts (never more than Config.Window), so that a long outage does
	// not replay every stored request since; maxResumeIDs bounds the ids
	// remembered to drop what came before.
	resumeMargin = 30 * time.Second
	resumeMax    = 5 * time.Minute
	maxResumeIDs = 1 << 14
)

// resume is where the main subscription on one relay is: the newest
// created_at it saw (never later than when the event came), or its last
// end of stored events, and the ids of the events it saw dated
// resumeMargin before that or later. Subscribed again since newest minus
// resumeMargin, the relay sends again the stored events of that margin
// it had sent (gift wraps and job requests): they are dropped here, as
// their ids are known. Events after the end of stored events are live,
// and never dropped here (a client sending the same event again must
// reach Run: see startMain).
type resume struct {
	mu     sync.Mutex
	newest nostr.Timestamp
	ids    map[string]nostr.Timestamp
}

// since is where to subscribe again from at now.
func (r *resume) since(now time.Time, window time.Duration) nostr.Timestamp {
	r.mu.Lock()
	defer r.mu.Unlock()
	floor := nostr.Timestamp(now.Add(-min(window, resumeMax)).Unix())
	return max(r.newest-nostr.Timestamp(resumeMargin/time.Second), floor)
}

// eose notes the end of a subscription's stored events at now: every
// event since came live.
func (r *resume) eose(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.advance(nostr.Timestamp(now.Unix()))
}

// note notes an event that came at now (stored: before the end of stored
// events) and reports whether to drop it: a stored event seen before.
func (r *resume) note(ev *nostr.Event, stored bool, now time.Time) (drop bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ids[ev.ID]; ok && stored {
		return true
	}
	at, margin := nostr.Timestamp(now.Unix()), nostr.Timestamp(resumeMargin/time.Second)
	r.advance(min(ev.CreatedAt, at))
	// Not one dated later than the margin: it would stay (a flood of
	// future dates would fill the map).
	if ev.CreatedAt >= r.newest-margin && ev.CreatedAt <= at+margin && len(r.ids) < maxResumeIDs {
		if r.ids == nil {
			r.ids = make(map[string]nostr.Timestamp)
		}
		r.ids[ev.ID] = ev.CreatedAt
	}
	return false
}

// advance moves newest to t if later, forgetting the ids dated before
// the margin (at most once a second: timestamps are seconds).
func (r *resume) advance(t nostr.Timestamp) {
	if t <= r.newest {
		return
	}
	r.newest = t
	cut := t - nostr.Timestamp(resumeMargin/time.Second)
	for id, at := range r.ids {
		if at < cut {
			delete(r.ids, id)
		}
	}
}

// payerAuthors is the payers lane's authors: the Vendor's most recent
// payers that are Nostr pubkeys, sorted.
func (s *Server) payerAuthors() []string {
	pl, ok := s.cfg.Vendor.(PayerLister)
	if !ok {
		return nil
	}
	var authors []string
	for _, k := range pl.RecentPayers(4 * maxLaneAuthors) {
		if nostr.IsValid32ByteHex(k) {
			authors = append(authors, k)
			if len(authors) == maxLaneAuthors {
				break
			}
		}
	}
	slices.Sort(authors)
	return authors
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// laneSeen remembers the ids of the events Run let in for seenFor, at
// most maxSeen of them, so that an event that comes by a lane and by the
// main subscription (or from two relays) is served once.
type laneSeen struct {
	keep time.Duration // how long an id is remembered; 0: seenFor
	mu   sync.Mutex
	at   map[[32]byte]time.Time
	ring [][32]byte // the ids in at, oldest at next once full
	next int
}

// admit reports whether the event id is new (or last seen over seenFor
// ago), and remembers it.
func (l *laneSeen) admit(id string, now time.Time) bool {
	var k [32]byte
	if len(id) != 64 {
		return true // not an event id: parse drops it
	}
	if _, err := hex.Decode(k[:], []byte(id)); err != nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == nil {
		l.at = make(map[[32]byte]time.Time)
	}
	keep := l.keep
	if keep == 0 {
		keep = seenFor
	}
	if t, ok := l.at[k]; ok {
		if now.Sub(t) < keep {
			return false
		}
		l.at[k] = now // it keeps its place in the ring
		return true
	}
	if len(l.ring) < maxSeen {
		l.ring = append(l.ring, k)
	} else {
		delete(l.at, l.ring[l.next])
		l.ring[l.next] = k
		l.next = (l.next + 1) % maxSeen
	}
	l.at[k] = now
	return true
}
