package vend

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
)

// Issuing payment requests under a flood.
//
// A payment request costs a backend round trip (LND writes the invoice to
// its database), so at most maxIssuing are issued at once and the rest wait
// for a turn. A flood of requests from fresh identities can keep that queue
// long for as long as it lasts; were the queue first come, first served, a
// customer arriving during the flood would wait behind all of it. So turns
// go round-robin by limit key (one request of each waiting key in turn: a
// flood from a few addresses gets a few turns per round, not all of them),
// and keys that have paid before in this run (known payers) are served
// first: identities are free on Nostr, a payment history is not. Others
// hold one turn at a time (maxOthers), newest first once their line is a
// quarter full (see fairLine.next): LND writes each invoice in its own
// fsync'd transaction, and a customer's payment (its HTLC's writes, the
// hold invoice's accept and settle) waits behind the writes queued before
// it. Under capvend-flood, with four of a flood's invoices being added at
// once, a known payer's paid call over MCP HTTP took 6-10 times as long
// as without the flood; with one, about 3 times, and the flood got half
// as many invoices.
//
// The line is bounded (maxWaiting for each of the two): a request waiting
// here holds its front's resources (a Nostr request slot, an HTTP
// connection), so an unbounded line would let a flood crowd out the
// customers at the fronts' doors instead. Once a line is a quarter full,
// a key holds at most perKeyOthers places in the line of others
// (perKeyKnown in the known payers'): a request beyond is refused at once
// (ErrLimit). (A quiet server lets one client queue many calls.) A request
// that finds the line full takes the place of the oldest waiting request of the key with the
// most waiting, if that key has at least two more waiting than its own;
// else it is refused at once (ErrLimit): the server is busy. So places
// move only towards an even share: once every key waits with about as
// many as any other, a flood's newcomers are refused for free instead of
// each displacing another (a displaced request has cost a ledger write to
// record and costs one to end).

// issueQueue hands out turns to issue a payment request.
type issueQueue struct {
	mu         sync.Mutex
	free       int      // turns not handed out
	maxWaiting int      // bound of each line
	known      fairLine // waiting requests of known payers: served first
	others     fairLine
	// othersBusy counts the turns held by requests of others (not known
	// payers), at most maxOthers: the rest of the backend's capacity
	// stays with the customers who pay (LND adding a flood's invoices
	// is LND slower to settle a customer's payment).
	othersBusy, maxOthers int
}

// maxWaiting bounds the requests waiting for a turn, in each line.
const maxWaiting = 128

// errBusy: the line for turns is full (see issueQueue).
var errBusy = errors.New("too many payment requests waiting to be issued")

// newIssueQueue hands out turns turns, one of them at a time to others
// than known payers, with lines of waiting places.
func newIssueQueue(turns, waiting int) *issueQueue {
	return &issueQueue{free: turns, maxWaiting: waiting, known: newFairLine(perKeyKnown), others: newFairLine(perKeyOthers),
		maxOthers: 1}
}

// ticket is one request waiting for a turn.
type ticket struct {
	key     string
	ready   chan struct{} // closed when the turn is granted, or the ticket evicted
	granted bool          // under issueQueue.mu: it holds a turn
	known   bool          // a known payer's (see issueQueue.othersBusy)
	evicted bool          // under issueQueue.mu: its place went to another key
	line    *fairLine
	el      *list.Element // in its key's list
}

// fairLine is a round-robin queue over keys: each key has its own FIFO of
// tickets, and keys take turns in the order they first waited.
type fairLine struct {
	byKey  map[string]*list.List // key -> *ticket, oldest first
	ring   list.List             // keys with tickets, next to serve first
	where  map[string]*list.Element
	n      int // tickets in all
	perKey int // places one key may hold
}

func newFairLine(perKey int) fairLine {
	return fairLine{byKey: map[string]*list.List{}, where: map[string]*list.Element{}, perKey: perKey}
}

// Places a key may hold in a busy line. A stranger (not a known payer)
// holds one: its other requests are refused at once while it waits, so a flood
// key's burst costs nothing, instead of taking places that newcomers
// would then take back (each displaced request has cost a ledger write to
// record and costs one to end: under capvend-flood, hundreds waited to).
const (
	perKeyOthers = 1
	perKeyKnown  = 4
)

func (f *fairLine) push(t *ticket) {
	l := f.byKey[t.key]
	if l == nil {
		l = list.New()
		f.byKey[t.key] = l
		f.where[t.key] = f.ring.PushBack(t.key)
	}
	t.line, t.el = f, l.PushBack(t)
	f.n++
}

// pop takes the oldest ticket of the next key, and moves that key to the
// back of the ring; nil when empty.
func (f *fairLine) pop() *ticket { return f.take(f.ring.Front()) }

// popNewest takes the oldest ticket of the key that came (or came back)
// last; nil when empty.
func (f *fairLine) popNewest() *ticket { return f.take(f.ring.Back()) }

// take takes the oldest ticket of the key at el in the ring, and moves
// that key to the back; nil when el is.
func (f *fairLine) take(el *list.Element) *ticket {
	if el == nil {
		return nil
	}
	key := el.Value.(string)
	l := f.byKey[key]
	t := l.Remove(l.Front()).(*ticket)
	t.el = nil
	f.n--
	if l.Len() == 0 {
		f.drop(key)
	} else {
		f.ring.MoveToBack(el)
	}
	return t
}

// remove takes t out of its line (its client left).
func (f *fairLine) remove(t *ticket) {
	if t.el == nil {
		return
	}
	l := f.byKey[t.key]
	l.Remove(t.el)
	t.el = nil
	f.n--
	if l.Len() == 0 {
		f.drop(t.key)
	}
}

func (f *fairLine) drop(key string) {
	f.ring.Remove(f.where[key])
	delete(f.where, key)
	delete(f.byKey, key)
}

// next is the next ticket to serve of a line bounded at max: round-robin
// by key while the line is short; the newest key's once it is a quarter
// full (a flood): there, served in arrival order, a customer arriving
// during the flood would wait for all of it (under capvend-flood, 2.4 s
// for 128 places at the rate LND adds invoices), and newest first it is
// served at the next turn, while the oldest waiting wait longer (they
// keep their places, or leave when their client does).
func (f *fairLine) next(max int) *ticket {
	if f.waiting() >= max/4 {
		return f.popNewest()
	}
	return f.pop()
}

func (f *fairLine) len() int { return f.ring.Len() }

// waiting is how many tickets the line holds.
func (f *fairLine) waiting() int { return f.n }

// victim is the oldest ticket of the key with the most waiting, if that
// key has at least two more waiting than key; nil otherwise.
func (f *fairLine) victim(key string) *ticket {
	own := 0
	if l := f.byKey[key]; l != nil {
		own = l.Len()
	}
	var most *list.List
	for _, l := range f.byKey {
		if l.Len() > own+1 && (most == nil || l.Len() > most.Len()) {
			most = l
		}
	}
	if most == nil {
		return nil
	}
	return most.Front().Value.(*ticket)
}

// join takes a place in the line for a request of key (known: a known
// payer), or a turn at once if one is free and nobody waits. It returns
// errBusy when the line is full and no place can be taken (see
// issueQueue). The caller then waits for its turn, or leaves.
func (q *issueQueue) join(key string, known bool) (*ticket, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.free > 0 && q.known.len() == 0 && (known || q.others.len() == 0 && q.othersBusy < q.maxOthers) {
		t := &ticket{key: key, ready: make(chan struct{}), known: known}
		q.grant(t)
		return t, nil
	}
	line := &q.others
	if known {
		line = &q.known
	}
	if l := line.byKey[key]; l != nil && l.Len() >= line.perKey && line.waiting() >= q.maxWaiting/4 {
		return nil, errBusy
	}
	if line.waiting() >= q.maxWaiting {
		v := line.victim(key)
		if v == nil {
			return nil, errBusy
		}
		line.remove(v)
		v.evicted = true
		close(v.ready)
	}
	t := &ticket{key: key, ready: make(chan struct{}), known: known}
	line.push(t)
	return t, nil
}

// wait waits for t's turn. It returns errBusy if t's place was taken (see
// issueQueue), holding no turn; and ctx's error, holding no turn, if ctx
// ends first.
func (q *issueQueue) wait(ctx context.Context, t *ticket) error {
	select {
	case <-t.ready:
		q.mu.Lock()
		evicted := t.evicted
		q.mu.Unlock()
		if evicted {
			return errBusy
		}
		return nil
	case <-ctx.Done():
		q.leave(t)
		return ctx.Err()
	}
}

// leave gives up t: its place in the line, or the turn it was handed
// (which goes on to the next). Leaving twice, or an evicted or nil
// ticket, is harmless.
func (q *issueQueue) leave(t *ticket) {
	if t == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !t.granted {
		if t.line != nil {
			t.line.remove(t)
		}
		return
	}
	t.granted = false
	q.free++
	if !t.known {
		q.othersBusy--
	}
	q.next()
}

// grant hands a free turn to t; q.mu is held.
func (q *issueQueue) grant(t *ticket) {
	q.free--
	if !t.known {
		q.othersBusy++
	}
	t.granted = true
	close(t.ready)
}

// next hands the free turns to waiting requests: known payers first, then
// others while fewer than maxOthers of theirs are held; q.mu is held.
func (q *issueQueue) next() {
	for q.free > 0 {
		t := q.known.pop()
		if t == nil && q.othersBusy < q.maxOthers {
			t = q.others.next(q.maxWaiting)
		}
		if t == nil {
			return
		}
		q.grant(t)
	}
}

// maxPayers bounds the known payers remembered; the oldest are forgotten.
const maxPayers = 100_000

// payerSet remembers the limit keys that paid for a call in this run, the
// most recent last, at most maxPayers of them.
type payerSet struct {
	mu    sync.Mutex
	order list.List // of string, least recently paid first
	where map[string]*list.Element
}

func (p *payerSet) add(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.where == nil {
		p.where = map[string]*list.Element{}
	}
	if el, ok := p.where[key]; ok {
		p.order.MoveToBack(el)
		return
	}
	p.where[key] = p.order.PushBack(key)
	if p.order.Len() > maxPayers {
		oldest := p.order.Front()
		delete(p.where, oldest.Value.(string))
		p.order.Remove(oldest)
	}
}

// recent returns up to n keys, the most recently paid first.
func (p *payerSet) recent(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, min(n, p.order.Len()))
	for el := p.order.Back(); el != nil && len(keys) < n; el = el.Prev() {
		keys = append(keys, el.Value.(string))
	}
	return keys
}

func (p *payerSet) has(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.where[key]
	return ok
}

// joinIssuing takes r's place in the line for a turn to issue its payment
// request (see issueQueue), before anything is written for it: an error
// wrapping ErrLimit when the server is too busy. The place is waited on
// by startIssuing, or given up with leaveIssuing.
func (v *Vendor) joinIssuing(r *CallRequest) (*ticket, error) {
	key := limitKey(r)
	t, err := v.issue.join(key, v.payers.has(key))
	if err != nil {
		return nil, fmt.Errorf("%w: %w; ask again shortly", ErrLimit, err)
	}
	return t, nil
}

// startIssuing waits for the turn of r's place t (taken now when nil):
// ctx's error if the client leaves first, an error wrapping ErrLimit if
// the server is too busy or the place was taken. With a nil error the
// caller holds the returned ticket's turn: leaveIssuing gives it back.
func (v *Vendor) startIssuing(ctx context.Context, r *CallRequest, t *ticket) (*ticket, error) {
	if t == nil {
		var err error
		if t, err = v.joinIssuing(r); err != nil {
			return nil, err
		}
	}
	if err := v.issue.wait(ctx, t); err != nil {
		if errors.Is(err, errBusy) {
			return nil, fmt.Errorf("%w: %w; ask again shortly", ErrLimit, err)
		}
		return nil, err
	}
	return t, nil
}

// leaveIssuing gives up a place in the line, or the turn it holds (the
// one startIssuing returned, once issued); nil, or leaving twice, is
// harmless.
func (v *Vendor) leaveIssuing(t *ticket) { v.issue.leave(t) }

// paid notes that r's client paid: its later requests are served first
// when payment requests queue.
func (v *Vendor) paid(r *CallRequest) { v.payers.add(limitKey(r)) }

// KnownPayer reports whether client (a front's client id: a Nostr pubkey)
// paid for a call in this run, counted as limitKey counts a request with
// no source address.
func (v *Vendor) KnownPayer(client string) bool { return v.payers.has(client) }

// RecentPayers returns up to n of the known payers (see KnownPayer), the
// most recently paid first: limit keys, Nostr pubkeys among them.
func (v *Vendor) RecentPayers(n int) []string { return v.payers.recent(n) }
