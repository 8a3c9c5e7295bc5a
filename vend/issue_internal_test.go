package vend

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// line queues requests and reports each grant, in order.
type line struct {
	q       *issueQueue
	granted chan grant
	holder  *ticket // the request holding the one turn
	// ctx ends when the test does: requests still waiting then leave the
	// line, and the test's cleanup waits for them (wg).
	ctx context.Context
	wg  sync.WaitGroup
}

type grant struct {
	key string
	t   *ticket
}

func newLine(t *testing.T) *line {
	q := newIssueQueue(1, 1000)
	q.others.perKey, q.known.perKey = 1000, 1000 // the line's order, not its bounds
	tk, err := q.join("x", false)                // the one turn is taken
	if err != nil || !tk.granted {
		t.Fatal("the first request got no turn", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &line{q: q, granted: make(chan grant, 1000), holder: tk, ctx: ctx}
	t.Cleanup(func() {
		cancel()
		l.wg.Wait()
	})
	return l
}

// wait queues a request of key, and returns once it is in the line.
func (l *line) wait(t *testing.T, key string, known bool) {
	tk, err := l.q.join(key, known)
	if err != nil {
		t.Fatal(err)
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if err := l.q.wait(l.ctx, tk); err != nil {
			if l.ctx.Err() == nil {
				t.Error(err)
			}
			return
		}
		l.granted <- grant{key, tk}
	}()
}

// next gives the turn back and returns whom it went to.
func (l *line) next() string {
	l.q.leave(l.holder)
	g := <-l.granted
	l.holder = g.t
	return g.key
}

// acquire waits for a turn for a request of key: join, then wait.
func (q *issueQueue) acquire(ctx context.Context, key string, known bool) error {
	t, err := q.join(key, known)
	if err != nil {
		return err
	}
	return q.wait(ctx, t)
}

// releaseOthers gives back a turn held by a request of others (not a
// known payer), as its leave would.
func (q *issueQueue) releaseOthers() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.free++
	q.othersBusy--
	q.next()
}

func (q *issueQueue) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, l := range q.known.byKey {
		n += l.Len()
	}
	for _, l := range q.others.byKey {
		n += l.Len()
	}
	return n
}

// A customer who asks while a few flooding addresses have many requests
// queued gets a turn within one round of the waiting keys, not after the
// whole flood (the queue used to be first come, first served: 150 turns).
func TestIssueTurnsGoRoundRobinByKey(t *testing.T) {
	l := newLine(t)
	for i := 0; i < 50; i++ {
		for _, k := range []string{"ip:flood-a", "ip:flood-b", "ip:flood-c"} {
			l.wait(t, k, false)
		}
	}
	l.wait(t, "ip:customer", false)
	var got []string
	for range 151 {
		got = append(got, l.next())
		if got[len(got)-1] == "ip:customer" {
			if len(got) > 4 {
				t.Fatalf("the customer got turn %d: %v", len(got), got)
			}
			return
		}
	}
	t.Fatal("the customer never got a turn")
}

// A client that paid before is served before fresh identities, however
// many of them wait (on Nostr identities are free; a payment is not).
func TestIssueTurnsGoToKnownPayersFirst(t *testing.T) {
	l := newLine(t)
	for i := 0; i < 200; i++ {
		l.wait(t, fmt.Sprint("fresh-", i), false)
	}
	l.wait(t, "customer", true)
	if got := l.next(); got != "customer" {
		t.Fatalf("first turn went to %s, want the known payer", got)
	}
	for range 200 {
		l.next()
	}
}

// A request whose client leaves gives up its place, and a turn handed to
// it as it left goes on to the next.
func TestIssueTurnOfALeavingClientGoesOn(t *testing.T) {
	l := newLine(t)
	q := l.q
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	before := q.waiting()
	go func() { left <- q.acquire(ctx, "gone", false) }()
	for q.waiting() == before {
		runtime.Gosched()
	}
	l.wait(t, "next", false)
	cancel()
	if err := <-left; err == nil {
		t.Fatal("a canceled wait got a turn")
	}
	if got := l.next(); got != "next" {
		t.Fatalf("the turn went to %s", got)
	}
	q.leave(l.holder)
	q.mu.Lock()
	free := q.free
	q.mu.Unlock()
	if free != 1 {
		t.Fatalf("%d free turns after all were given back, want 1", free)
	}
}

// The line is bounded: a newcomer takes the place of the oldest request
// of the key with the most waiting, if that key has at least two more
// waiting than the newcomer's; otherwise the newcomer is refused at once
// (the server is busy), so places do not churn between keys.
func TestIssueLineIsBounded(t *testing.T) {
	q := newIssueQueue(1, 4)
	q.others.perKey = 4
	if err := q.acquire(context.Background(), "x", false); err != nil {
		t.Fatal(err)
	}
	outcomes := make(chan error, 100)
	waitOn := func(key string) {
		before := q.waiting()
		go func() { outcomes <- q.acquire(context.Background(), key, false) }()
		for q.waiting() == before {
			runtime.Gosched()
		}
	}
	for range 4 {
		waitOn("ip:flood")
	}
	// Full. Newcomers evict the flood's oldest while it has two waiting.
	// (The line stays at 4, so wait for the evicted one's answer: it is
	// given after the newcomer took its place.)
	for _, k := range []string{"b", "c", "d"} {
		go func() { outcomes <- q.acquire(context.Background(), k, false) }()
		if err := <-outcomes; !errors.Is(err, errBusy) {
			t.Fatalf("the evicted request got %v, want errBusy", err)
		}
	}
	if err := q.acquire(context.Background(), "e", false); !errors.Is(err, errBusy) {
		t.Fatalf("a newcomer to a line of one request per key: %v", err)
	}
	// A known payer has its own line.
	tk, err := q.join("payer", true)
	if err != nil {
		t.Fatalf("the known payers' line: %v", err)
	}
	q.leave(tk)
	for range 4 {
		q.releaseOthers()
		if err := <-outcomes; err != nil {
			t.Fatal(err)
		}
	}

	// No churn: a key waiting with one takes a place from a key waiting
	// with three, but not from one waiting with two.
	q = newIssueQueue(1, 4)
	q.others.perKey = 4
	if err := q.acquire(context.Background(), "x", false); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "a", "a", "b"} {
		waitOn(k)
	}
	go func() { outcomes <- q.acquire(context.Background(), "b", false) }()
	if err := <-outcomes; !errors.Is(err, errBusy) {
		t.Fatalf("a's oldest request got %v, want errBusy", err)
	}
	if err := q.acquire(context.Background(), "b", false); !errors.Is(err, errBusy) {
		t.Fatalf("b's third request, with a and b waiting two each: %v, want errBusy at once", err)
	}
	if err := q.acquire(context.Background(), "a", false); !errors.Is(err, errBusy) {
		t.Fatalf("a's fourth request: %v, want errBusy at once", err)
	}
	for range 4 {
		q.releaseOthers()
		if err := <-outcomes; err != nil {
			t.Fatal(err)
		}
	}
}

// Requests of others than known payers hold one turn at a time: however
// many of them wait, a known payer finds a turn free.
func TestIssueTurnsLeaveRoomForKnownPayers(t *testing.T) {
	q := newIssueQueue(4, 100)
	a, err := q.join("a", false)
	if err != nil || !a.granted {
		t.Fatalf("the first request: %v", err)
	}
	b, err := q.join("b", false)
	if err != nil || b.granted {
		t.Fatalf("a second request of others got a turn beside the first (granted %v, %v)", b.granted, err)
	}
	k, err := q.join("customer", true)
	if err != nil || !k.granted {
		t.Fatalf("a known payer waits while turns are free: %v", err)
	}
	q.leave(a)
	if err := q.wait(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	q.leave(b)
	q.leave(k)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.free != 4 || q.othersBusy != 0 {
		t.Fatalf("after all left: %d free, %d held by others; want 4, 0", q.free, q.othersBusy)
	}
}

// In a busy line a stranger holds one place: while it waits its other
// requests are refused at once, so a burst from a fresh key costs no
// ledger write; a known payer may wait with a few. A quiet line lets a
// client queue several.
func TestIssueLineHoldsOnePlacePerStranger(t *testing.T) {
	q := newIssueQueue(1, 8)
	holder, err := q.join("x", false)
	if err != nil || !holder.granted {
		t.Fatalf("the first request: %v", err)
	}
	for i := range 2 {
		if _, err := q.join("flood", false); err != nil { // quiet: fewer than 8/4 wait
			t.Fatalf("request %d of a client in a quiet line: %v", i+1, err)
		}
	}
	if _, err := q.join("flood", false); !errors.Is(err, errBusy) {
		t.Fatalf("a stranger's second waiting request: %v, want errBusy", err)
	}
	for i := range perKeyKnown {
		if _, err := q.join("k", true); err != nil { // make the known line busy
			t.Fatal(err)
		}
		if _, err := q.join("customer", true); err != nil {
			t.Fatalf("a known payer's request %d: %v", i+1, err)
		}
	}
	if _, err := q.join("customer", true); !errors.Is(err, errBusy) {
		t.Fatalf("a known payer's request beyond %d: %v, want errBusy", perKeyKnown, err)
	}
}

// RecentPayers lists the most recently paid first, at most n, and a key
// that pays again moves to the front.
func TestRecentPayers(t *testing.T) {
	var p payerSet
	if got := p.recent(3); len(got) != 0 {
		t.Fatalf("no payers yet: %v", got)
	}
	for _, k := range []string{"a", "b", "c", "a"} {
		p.add(k)
	}
	if got := fmt.Sprint(p.recent(2)); got != "[a c]" {
		t.Fatalf("recent(2) = %s, want [a c]", got)
	}
	if got := fmt.Sprint(p.recent(10)); got != "[a c b]" {
		t.Fatalf("recent(10) = %s, want [a c b]", got)
	}
}

// Others are served round-robin while their line is short, newest first
// once it is a quarter full: a customer arriving during a flood gets the
// next turn instead of waiting for the whole line.
func TestIssueLineServesNewestFirstWhenBusy(t *testing.T) {
	q := newIssueQueue(1, 8)
	holder, err := q.join("holder", false)
	if err != nil || !holder.granted {
		t.Fatalf("the first request: %v", err)
	}
	a, _ := q.join("a", false) // quiet: one waits
	q.leave(holder)
	if !a.granted {
		t.Fatal("in a short line the oldest is not served first")
	}
	var waiting []*ticket
	for _, k := range []string{"b", "c", "customer"} { // a quarter of 8 and more
		tk, err := q.join(k, false)
		if err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, tk)
	}
	q.leave(a)
	if !waiting[2].granted || waiting[0].granted || waiting[1].granted {
		t.Fatalf("in a busy line the newest is not served first (b %v, c %v, customer %v)", waiting[0].granted, waiting[1].granted, waiting[2].granted)
	}
}
