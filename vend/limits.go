package vend

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Limits: who is counted, the per-minute rate, the open unpaid payment
// requests per client and in all (with shedding of the oldest), and proof
// of work. docs/OPERATING.md, Limits, has them with their settings.
//
// Every limit counts a request by CallRequest.Source when the front set
// it, else by CallRequest.Client (limitKey): the MCP HTTP front sets
// Source to "ip:<address>" (or "id:<client id>" a trusted proxy vouched
// for), so every session from one address is one client; Nostr requests
// have no Source and count by pubkey; stdio by "stdio".
//
//   - RequestsPerMinute: calls (free or priced) per client in each clock
//     minute. Only the keys of the current minute are held, at most
//     DefaultMaxRateKeys; a key first seen beyond that is not counted.
//   - MaxUnpaidPerClient: open unpaid payment requests per client. A
//     request counts from its quote until it is paid, canceled or expired
//     (the backend's report), whether or not its client still waits: a
//     dropped connection or an explicit-gating quote holds its slot while
//     its invoice is payable. Beyond it: ErrLimit (-32053).
//   - MaxUnpaidTotal: open unpaid payment requests in all. When it is
//     reached, the oldest request of the client(s) holding the most is
//     withdrawn (shed) so the newest customer still gets a quote: its
//     invoice is canceled at its backend (its call becomes canceled) and
//     a client waiting for it gets notifications/payment_rejected and
//     ErrLimit. Requests of a previous run are not counted (they expire
//     within the TTL).
//   - With SharedConfig.Unpaid (instances sharing a ledger), both unpaid
//     limits also count the requests every instance has open, read from
//     the ledger (NewCall.LimitKey) once this process's own count let a
//     new quote through: a client at MaxUnpaidPerClient there is refused
//     before anything is written; at MaxUnpaidTotal this instance sheds
//     its own oldest request of its busiest client (none: ErrLimit). The
//     count is read, not reserved: quotes made at once on several
//     instances can pass a limit by those not yet recorded when the
//     others read (each instance's own limits still hold).
//   - Daily free quotas (PriceBook's FreePerDay) count per transport and
//     client, a Source as "source:<source>"; FreePerDayTotal bounds a
//     tool's free calls per UTC day across all clients and transports (a
//     fresh Nostr key is free to make), in the same ledger transaction.
//   - Proof of work: a front may require it (CallRequest.WorkRequired; the
//     Nostr front's NIP-13 difficulty). A request with less Work gets no
//     free use (it is priced instead); if it would get a free call or an
//     unpaid quote it is refused with *WorkRequiredError; one paying with
//     a Cashu token is not refused.

// Defaults of the limits left zero in Config.
const (
	DefaultMaxUnpaidPerClient = 10
	DefaultMaxUnpaidTotal     = 1_000
	// DefaultMaxRateKeys bounds the clients the rate limit tracks in one
	// minute.
	DefaultMaxRateKeys = 100_000
)

// maxIssuing bounds the payment requests being issued at once (a backend
// round trip each): under a flood the rest wait their turn (issue.go)
// instead of piling up at the backend, and at most this many unpaid slots
// of the total are taken by requests not yet issued (which cannot be
// shed).
const maxIssuing = 16

// deadAfter is how long past its expiry an unpaid request whose end no
// backend reported still counts: then it is forgotten.
const deadAfter = time.Minute

// limitKey is who the limits count: the request's Source when set (an
// address, or a client id a trusted proxy vouched for), else its Client
// (a Nostr pubkey, "stdio").
func limitKey(r *CallRequest) string {
	switch {
	case r.Source != "":
		return r.Source
	case r.Client != "":
		return r.Client
	}
	return "anonymous"
}

// quotaKey is who a daily free quota counts, as limitKey, with a Source
// written "source:<source>" (the form the ledger's free uses have always
// had for addresses).
func quotaKey(r *CallRequest) string {
	if r.Source != "" {
		return "source:" + r.Source
	}
	return limitKey(r)
}

// allow applies the rate limit to r: counted in this process, or, with
// Config.Shared.Rates, in the ledger the instances share (a count that
// cannot be written lets the call through: the rate limit is a shield,
// not money, and the call's own ledger writes fail anyway).
func (v *Vendor) allow(ctx context.Context, r *CallRequest) bool {
	rates, limit := v.cfg.Shared.Rates, v.cfg.RequestsPerMinute
	if rates == nil || limit <= 0 {
		return v.rate.allow(limitKey(r), time.Now())
	}
	ok, err := rates.CountCall(ctx, limitKey(r), time.Now(), limit)
	if err != nil {
		v.cfg.Log.Warn("vend: rate limit not counted", "err", err)
		return true
	}
	return ok
}

// checkWork refuses a request with less proof of work than its front
// requires.
func checkWork(r *CallRequest) error {
	if r.WorkRequired > 0 && r.Work < r.WorkRequired {
		return &WorkRequiredError{Required: r.WorkRequired, Work: r.Work}
	}
	return nil
}

// rateLimiter counts each key's calls in fixed one-minute windows aligned
// to the clock's minutes. The counts are dropped when a minute ends, so the
// map holds only the keys seen this minute, and at most maxKeys of them:
// a key first seen when it is full is not counted (every key beyond is a
// fresh identity, which the rate limit cannot stop anyway; the unpaid
// limits still hold).
type rateLimiter struct {
	perMinute, maxKeys int

	mu     sync.Mutex
	minute time.Time
	n      map[string]int
}

func (l *rateLimiter) allow(key string, now time.Time) bool {
	if l.perMinute <= 0 {
		return true
	}
	m := now.Truncate(time.Minute)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !m.Equal(l.minute) || l.n == nil {
		l.minute = m
		if len(l.n) > 1024 || l.n == nil {
			l.n = map[string]int{} // give the memory back
		} else {
			clear(l.n)
		}
	}
	c, ok := l.n[key]
	if !ok && len(l.n) >= l.maxKeys {
		return true
	}
	if c >= l.perMinute {
		return false
	}
	l.n[key] = c + 1
	return true
}

// keys is how many keys the limiter holds (tests).
func (l *rateLimiter) keys() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.n)
}

// unpaidQuote is one open payment request a client was given (or is
// being given: ref is "" until the backend issued it).
type unpaidQuote struct {
	key     string
	ref     string
	backend Backend
	expires time.Time
	shed    chan struct{} // closed when it is withdrawn to make room
	el      *list.Element // in unpaidBook.order; nil once removed
	held    bool          // counted for its key, not yet in the total (under unpaidBook.mu)
	full    bool          // the shared total is reached: enter makes room here (under unpaidBook.mu)
}

// unpaidBook counts the open unpaid payment requests: per key (at most
// perKey) and in all (at most total), from the request to the backend
// until the payment leaves the open state (paid, canceled, expired; a
// backend's report, or vend's own cancel). A client that stops waiting
// (a dropped connection, explicit gating) still holds its request while
// the invoice is payable: otherwise connect-and-drop would make unbounded
// open invoices. When the total is reached, the oldest request of the
// key(s) holding the most is withdrawn (shed) to make room.
type unpaidBook struct {
	perKey, total int

	mu       sync.Mutex
	byKey    map[string]int
	keysWith []int     // keysWith[c] is how many keys hold exactly c requests
	order    list.List // of *unpaidQuote, oldest first
	byRef    map[string]*unpaidQuote
}

func newUnpaidBook(perKey, total int) *unpaidBook {
	return &unpaidBook{perKey: perKey, total: total, byKey: map[string]int{}, keysWith: make([]int, perKey+1),
		byRef: map[string]*unpaidQuote{}}
}

// Errors of reserve.
var (
	errUnpaidPerClient = errors.New("too many unpaid payment requests of this client")
	errUnpaidTotal     = errors.New("too many unpaid payment requests")
)

// hold takes a slot of key's own limit for a new payment request, before
// anything is written for it: a client at its limit is refused at once
// (errUnpaidPerClient), for free. The slot counts toward the total only
// once enter admits it; release gives it back at any point.
func (b *unpaidBook) hold(key string) (*unpaidQuote, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byKey[key] >= b.perKey {
		return nil, errUnpaidPerClient
	}
	q := &unpaidQuote{key: key, shed: make(chan struct{}), held: true}
	b.move(key, +1)
	return q, nil
}

// enter admits a held slot into the total, right before its request is
// issued. When every slot of the total is taken it withdraws the oldest
// request of the key(s) holding the most (victim, removed from the book:
// the caller cancels it at its backend). It fails when nothing can be
// withdrawn (every slot is a request still being issued); q stays held.
func (b *unpaidBook) enter(q *unpaidQuote, now time.Time) (victim *unpaidQuote, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !q.held {
		return nil, errUnpaidTotal // released meanwhile
	}
	if b.order.Len() >= b.total {
		b.dropDead(now)
	}
	if b.order.Len() >= b.total || q.full {
		victim = b.victim()
		if victim == nil {
			return nil, errUnpaidTotal
		}
		b.remove(victim)
		close(victim.shed)
	}
	q.held = false
	q.el = b.order.PushBack(q)
	return victim, nil
}

// reserve is hold then enter (tests, and a request quoted without an
// earlier hold).
func (b *unpaidBook) reserve(key string, now time.Time) (q, victim *unpaidQuote, err error) {
	if q, err = b.hold(key); err != nil {
		return nil, nil, err
	}
	if victim, err = b.enter(q, now); err != nil {
		b.release(q)
		return nil, nil, err
	}
	return q, victim, nil
}

// victim is the oldest issued request of the keys holding the most, else
// the oldest issued request; nil if none is issued.
func (b *unpaidBook) victim() *unpaidQuote {
	most := 0
	for c := len(b.keysWith) - 1; c > 0; c-- {
		if b.keysWith[c] > 0 {
			most = c
			break
		}
	}
	var oldest *unpaidQuote
	for e := b.order.Front(); e != nil; e = e.Next() {
		q := e.Value.(*unpaidQuote)
		if q.ref == "" {
			continue
		}
		if b.byKey[q.key] == most {
			return q
		}
		if oldest == nil {
			oldest = q
		}
	}
	return oldest
}

// dropDead forgets requests past their expiry whose end no backend
// reported (they are not payable any more).
func (b *unpaidBook) dropDead(now time.Time) {
	for e := b.order.Front(); e != nil; {
		next := e.Next()
		if q := e.Value.(*unpaidQuote); q.ref != "" && now.Sub(q.expires) > deadAfter {
			b.remove(q)
		}
		e = next
	}
}

// move changes key's count by d, keeping keysWith.
func (b *unpaidBook) move(key string, d int) {
	c := b.byKey[key]
	if c > 0 && c < len(b.keysWith) {
		b.keysWith[c]--
	}
	c += d
	if c <= 0 {
		delete(b.byKey, key)
		return
	}
	b.byKey[key] = c
	if c < len(b.keysWith) {
		b.keysWith[c]++
	}
}

func (b *unpaidBook) remove(q *unpaidQuote) {
	if q.held {
		q.held = false
		b.move(q.key, -1)
		return
	}
	if q.el == nil {
		return
	}
	b.order.Remove(q.el)
	q.el = nil
	if q.ref != "" && b.byRef[q.ref] == q {
		delete(b.byRef, q.ref)
	}
	b.move(q.key, -1)
}

// bind records the payment request issued for q.
func (b *unpaidBook) bind(q *unpaidQuote, p *Payment) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q.el == nil {
		return
	}
	q.ref, q.backend, q.expires = p.Ref, p.Backend, p.ExpiresAt
	b.byRef[p.Ref] = q
}

// release gives q's slot back (its request was never issued), held or
// entered; releasing twice, or a nil q, is harmless.
func (b *unpaidBook) release(q *unpaidQuote) {
	if q == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.remove(q)
}

// unhold gives q's slot back if it is still only held: no payment request
// was issued for it. A nil q is fine.
func (b *unpaidBook) unhold(q *unpaidQuote) {
	if q == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if q.held {
		b.remove(q)
	}
}

// end gives back the slot of the request ref once it is no longer open.
// Unknown refs are ignored.
func (b *unpaidBook) end(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.byRef[ref]; q != nil {
		b.remove(q)
	}
}

// shedOf is the channel closed when the request ref is withdrawn; nil
// (never ready) if the book does not hold it.
func (b *unpaidBook) shedOf(ref string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.byRef[ref]; q != nil {
		return q.shed
	}
	return nil
}

// counts returns the requests held in all and by key (tests).
func (b *unpaidBook) counts(key string) (total, ofKey int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.order.Len(), b.byKey[key]
}

// holdUnpaid takes a slot of r's client's own limit for a new payment
// request (see unpaidBook.hold). The error wraps ErrLimit. With
// Config.Shared.Unpaid the client's open requests on every instance are
// counted too (one ledger read, only once this instance's own count let
// the request through): at MaxUnpaidPerClient it is refused, before
// anything is written; at MaxUnpaidTotal its entry withdraws this
// instance's oldest request of its busiest client (see enter). A count
// that cannot be read lets the request through (the instance's own limits
// still hold).
func (v *Vendor) holdUnpaid(ctx context.Context, r *CallRequest) (*unpaidQuote, error) {
	key := limitKey(r)
	q, err := v.unpaid.hold(key)
	if err != nil {
		return nil, v.unpaidError(err)
	}
	counter := v.cfg.Shared.Unpaid
	if counter == nil {
		return q, nil
	}
	ofKey, total, err := counter.OpenUnpaid(ctx, key, time.Now())
	switch {
	case err != nil:
		v.cfg.Log.Warn("vend: unpaid payment requests not counted in the ledger", "err", err)
	case ofKey >= v.cfg.MaxUnpaidPerClient:
		v.unpaid.release(q)
		return nil, v.unpaidError(errUnpaidPerClient)
	case total >= v.cfg.MaxUnpaidTotal:
		v.unpaid.markFull(q)
	}
	return q, nil
}

// sharedLimitKey is the NewCall.LimitKey of r's call: its limit key when
// the instances count the unpaid limits in the ledger (holdUnpaid), else
// "" (nothing reads it).
func (v *Vendor) sharedLimitKey(r *CallRequest) string {
	if v.cfg.Shared.Unpaid == nil {
		return ""
	}
	return limitKey(r)
}

// markFull notes that the shared total is reached: q's entry must make
// room (see enter).
func (b *unpaidBook) markFull(q *unpaidQuote) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q.full = true
}

// enterUnpaid admits r's held slot q into the total right before its
// payment request is issued, withdrawing the oldest request of the
// busiest client when every slot is taken. The error wraps ErrLimit.
func (v *Vendor) enterUnpaid(q *unpaidQuote) error {
	victim, err := v.unpaid.enter(q, time.Now())
	if err != nil {
		return v.unpaidError(err)
	}
	if victim != nil {
		v.cfg.Log.Info("vend: unpaid payment requests at their limit: withdrawing the oldest of the busiest client",
			"payment", victim.ref, "limit", v.cfg.MaxUnpaidTotal)
		v.background(func(ctx context.Context) { v.withdraw(ctx, victim.backend, victim.ref) })
	}
	return nil
}

func (v *Vendor) unpaidError(err error) error {
	if errors.Is(err, errUnpaidPerClient) {
		return fmt.Errorf("%w: too many unpaid payment requests (at most %d per client)", ErrLimit, v.cfg.MaxUnpaidPerClient)
	}
	return fmt.Errorf("%w: too many unpaid payment requests", ErrLimit)
}

// withdraw cancels an unpaid request at its backend, which records it
// canceled (and its call canceled). A payment that arrived meanwhile is
// left to its normal course.
func (v *Vendor) withdraw(ctx context.Context, backend Backend, ref string) {
	b := v.backend(backend)
	if b == nil {
		return
	}
	if cur := v.currentPayment(ctx, ref); cur == nil || cur.State != PaymentOpen {
		return
	}
	if err := b.Cancel(context.WithoutCancel(ctx), ref); err != nil {
		v.cfg.Log.Warn("vend: could not withdraw an unpaid payment request", "payment", ref, "err", err)
	}
}

// withdrawn answers a waiting call whose payment request was shed: it
// cancels the request (if the shedder has not yet), and unless the
// payment arrived meanwhile (then it is returned, to run the call) tells
// the client. The error wraps ErrLimit.
func (v *Vendor) withdrawn(ctx context.Context, p *Payment, r *CallRequest) (*Payment, error) {
	v.withdraw(ctx, p.Backend, p.Ref)
	if cur := v.currentPayment(context.WithoutCancel(ctx), p.Ref); cur != nil && (cur.State == PaymentAccepted || cur.State == PaymentSettled) {
		return cur, nil
	}
	r.Notify(NotifyPaymentRejected, map[string]any{"amount": p.Amount.SatsCeil(), "pmi": PMILightning,
		"message": "the payment request was withdrawn unpaid: the server has too many unpaid requests; ask again"})
	return nil, fmt.Errorf("%w: the payment request was withdrawn unpaid (too many unpaid requests)", ErrLimit)
}
