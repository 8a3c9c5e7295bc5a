package vend

import (
	"sync"
	"time"
)

// waiterSet holds the requests waiting for a payment's report, by payment
// ref. It owns its lock.
type waiterSet struct {
	mu sync.Mutex
	m  map[string][]chan *Payment
	// taken holds the refs whose change a waiter read from the ledger
	// (taken, with when) before this process's backend reported it: the
	// report, if it comes, is the waiter's and takes no orphan path.
	taken map[string]time.Time
	// orphans holds, sharing the ledger, the refs of this instance's open
	// payments whose client left (with when to stop watching): another
	// instance may record their change, and then no report comes here
	// (see watchOrphans).
	orphans map[string]time.Time
	// order is taken's refs in the order taken (with when), oldest from
	// head: each take expires the oldest ones, O(1) amortized. An entry
	// whose ref was taken again later, or delivered, is skipped.
	order []takenRef
	head  int
}

type takenRef struct {
	ref string
	at  time.Time
}

// takenFor bounds how long a taken ref waits for its report (another
// instance may have recorded the change: then no report comes).
const takenFor = time.Hour

// take ends what add registered, as remove, for a waiter that read its
// payment's change from the ledger: a report of the change arriving
// later counts as delivered (see deliver).
func (w *waiterSet) take(ref string, ch chan *Payment, now time.Time) {
	w.remove(ref, ch)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.markTakenLocked(ref, now)
}

// markTakenLocked records ref as taken at now, expiring the oldest.
func (w *waiterSet) markTakenLocked(ref string, now time.Time) {
	if w.taken == nil {
		w.taken = map[string]time.Time{}
	}
	for ; w.head < len(w.order) && now.Sub(w.order[w.head].at) > takenFor; w.head++ {
		if e := w.order[w.head]; w.taken[e.ref].Equal(e.at) {
			delete(w.taken, e.ref)
		}
		w.order[w.head] = takenRef{}
	}
	if w.head > len(w.order)/2 { // the expired half's room back
		w.order = append(w.order[:0], w.order[w.head:]...)
		w.head = 0
	}
	w.taken[ref] = now
	w.order = append(w.order, takenRef{ref, now})
}

// add registers a waiter for ref and returns its channel, which holds the
// first report delivered to it (a waiter takes that one and leaves).
// Every request waiting for payment holds one, so it holds a pointer:
// a buffer of payments would cost each waiting request a kilobyte.
func (w *waiterSet) add(ref string) chan *Payment {
	ch := make(chan *Payment, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string][]chan *Payment{}
	}
	w.m[ref] = append(w.m[ref], ch)
	w.mu.Unlock()
	return ch
}

// remove ends what add registered. Idempotent.
func (w *waiterSet) remove(ref string, ch chan *Payment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(ref, ch)
}

func (w *waiterSet) removeLocked(ref string, ch chan *Payment) {
	list := w.m[ref]
	for i, c := range list {
		if c == ch {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.m, ref)
	} else {
		w.m[ref] = list
	}
}

// deliver sends e to every waiter of its payment and returns how many
// there were. The sends happen under the lock and never block: a waiter
// is either still registered and gets the event in its channel, or has
// removed itself and is not counted (the event then takes onPayment's
// orphan path). A waiter that leaves looks in its channel after removing
// itself (waitPaid), so an event is never dropped between the two.
func (w *waiterSet) deliver(e PaymentEvent) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.orphans, e.Payment.Ref) // reported here: no watching needed
	list := w.m[e.Payment.Ref]
	if _, ok := w.taken[e.Payment.Ref]; ok && len(list) == 0 {
		delete(w.taken, e.Payment.Ref)
		return 1
	}
	for _, ch := range list {
		p := e.Payment // each waiter's own copy
		select {
		case ch <- &p:
		default: // the waiter has what it needs already
		}
	}
	return len(list)
}

// leave ends what add registered for a waiter whose client left. An
// event delivered before it left is returned (the waiter takes it on, as
// if its client had stayed); otherwise, if watch, ref is watched as an
// orphan until until. Both happen under the lock, so an event is either
// returned here or takes the orphan path once, never both.
func (w *waiterSet) leave(ref string, ch chan *Payment, watch bool, until time.Time) (*Payment, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(ref, ch)
	select {
	case p := <-ch:
		return p, true
	default:
	}
	if watch {
		if w.orphans == nil {
			w.orphans = map[string]time.Time{}
		}
		w.orphans[ref] = until
	}
	return nil, false
}

// orphanRefs returns the watched orphans, forgetting those watched past
// their time.
func (w *waiterSet) orphanRefs(now time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	refs := make([]string, 0, len(w.orphans))
	for ref, until := range w.orphans {
		if now.After(until) {
			delete(w.orphans, ref)
			continue
		}
		refs = append(refs, ref)
	}
	return refs
}

// claimOrphan ends the watch of ref, whose change the ledger shows, and
// reports whether the caller takes the orphan path for it: not if a
// report came meanwhile (deliver ended the watch) or a replay of the
// request waits for it (the waiter reads the ledger itself). A report of
// the change arriving later counts as delivered (see taken).
func (w *waiterSet) claimOrphan(ref string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.orphans[ref]; !ok {
		return false
	}
	delete(w.orphans, ref)
	if len(w.m[ref]) > 0 {
		return false
	}
	w.markTakenLocked(ref, now)
	return true
}

// waiting reports whether anyone waits for ref.
func (w *waiterSet) waiting(ref string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m[ref]) > 0
}

// runningSet holds the calls executing in this process, each with a
// channel closed when it is done. It owns its lock.
type runningSet struct {
	mu sync.Mutex
	m  map[CallID]chan struct{}
}

// start registers the call as running in this process and returns
// the channel stop closes; nil if it runs already.
func (s *runningSet) start(id CallID) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.m[id]; busy {
		return nil
	}
	if s.m == nil {
		s.m = map[CallID]chan struct{}{}
	}
	done := make(chan struct{})
	s.m[id] = done
	return done
}

// stop ends what start registered, waking whoever waits.
func (s *runningSet) stop(id CallID, done chan struct{}) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
	close(done)
}

// done returns the channel of the call running in this process, nil if it
// does not run here.
func (s *runningSet) done(id CallID) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}
