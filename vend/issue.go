package vend

import (
	"container/list"
	"context"
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
// first: identities are free on Nostr, a payment history is not.

// issueQueue hands out turns to issue a payment request.
type issueQueue struct {
	mu     sync.Mutex
	free   int      // turns not handed out
	known  fairLine // waiting requests of known payers: served first
	others fairLine
}

func newIssueQueue(turns int) *issueQueue {
	return &issueQueue{free: turns, known: newFairLine(), others: newFairLine()}
}

// ticket is one request waiting for a turn.
type ticket struct {
	key     string
	ready   chan struct{} // closed when the turn is granted
	granted bool          // under issueQueue.mu
	line    *fairLine
	el      *list.Element // in its key's list
}

// fairLine is a round-robin queue over keys: each key has its own FIFO of
// tickets, and keys take turns in the order they first waited.
type fairLine struct {
	byKey map[string]*list.List // key -> *ticket, oldest first
	ring  list.List             // keys with tickets, next to serve first
	where map[string]*list.Element
}

func newFairLine() fairLine {
	return fairLine{byKey: map[string]*list.List{}, where: map[string]*list.Element{}}
}

func (f *fairLine) push(t *ticket) {
	l := f.byKey[t.key]
	if l == nil {
		l = list.New()
		f.byKey[t.key] = l
		f.where[t.key] = f.ring.PushBack(t.key)
	}
	t.line, t.el = f, l.PushBack(t)
}

// pop takes the oldest ticket of the next key, and moves that key to the
// back of the ring; nil when empty.
func (f *fairLine) pop() *ticket {
	front := f.ring.Front()
	if front == nil {
		return nil
	}
	key := front.Value.(string)
	l := f.byKey[key]
	t := l.Remove(l.Front()).(*ticket)
	t.el = nil
	if l.Len() == 0 {
		f.drop(key)
	} else {
		f.ring.MoveToBack(front)
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
	if l.Len() == 0 {
		f.drop(t.key)
	}
}

func (f *fairLine) drop(key string) {
	f.ring.Remove(f.where[key])
	delete(f.where, key)
	delete(f.byKey, key)
}

func (f *fairLine) len() int { return f.ring.Len() }

// acquire waits for a turn for a request of key (known: a known payer).
// It returns ctx's error, holding no turn, if ctx ends first.
func (q *issueQueue) acquire(ctx context.Context, key string, known bool) error {
	q.mu.Lock()
	if q.free > 0 && q.known.len() == 0 && q.others.len() == 0 {
		q.free--
		q.mu.Unlock()
		return nil
	}
	t := &ticket{key: key, ready: make(chan struct{})}
	if known {
		q.known.push(t)
	} else {
		q.others.push(t)
	}
	q.mu.Unlock()
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		granted := t.granted
		if !granted {
			t.line.remove(t)
		}
		q.mu.Unlock()
		if granted {
			q.release() // handed over as ctx ended: pass it on
		}
		return ctx.Err()
	}
}

// release gives a turn back: to the next waiting request, if any.
func (q *issueQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.known.pop()
	if t == nil {
		t = q.others.pop()
	}
	if t == nil {
		q.free++
		return
	}
	t.granted = true
	close(t.ready)
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

func (p *payerSet) has(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.where[key]
	return ok
}

// startIssuing waits for a turn to issue r's payment request; ctx's error
// if the client leaves first.
func (v *Vendor) startIssuing(ctx context.Context, r *CallRequest) error {
	key := limitKey(r)
	return v.issue.acquire(ctx, key, v.payers.has(key))
}

func (v *Vendor) doneIssuing() { v.issue.release() }

// paid notes that r's client paid: its later requests are served first
// when payment requests queue.
func (v *Vendor) paid(r *CallRequest) { v.payers.add(limitKey(r)) }
