package vend

import (
	"fmt"
	"testing"
	"time"
)

// TestRateMapIsBounded: the rate limiter holds only this minute's keys,
// and at most maxKeys of them (it used to keep every key until 100,000
// were held, then sweep).
func TestRateMapIsBounded(t *testing.T) {
	l := &rateLimiter{perMinute: 2, maxKeys: 50}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i := 0; i < 200; i++ {
		l.allow(fmt.Sprint("fresh-", i), now)
	}
	if n := l.keys(); n != 50 {
		t.Fatalf("%d keys held, want the bound 50", n)
	}
	// A tracked key is still limited.
	if !l.allow("fresh-0", now) || l.allow("fresh-0", now) {
		t.Fatal("fresh-0 was not limited to 2 a minute")
	}
	// The next minute starts empty.
	if !l.allow("fresh-0", now.Add(time.Minute)) || l.keys() != 1 {
		t.Fatalf("the next minute holds %d keys", l.keys())
	}
}

func TestUnpaidVictimIsTheOldestOfTheBusiest(t *testing.T) {
	b := newUnpaidBook(3, 5)
	now := time.Now()
	issue := func(key string) *unpaidQuote {
		q, victim, err := b.reserve(key, now)
		if err != nil || victim != nil {
			t.Fatalf("reserve %s: %v %v", key, victim, err)
		}
		b.bind(q, &Payment{NewPayment: NewPayment{Ref: key + fmt.Sprint(b.order.Len()), ExpiresAt: now.Add(time.Minute)}})
		return q
	}
	honest := issue("honest") // the oldest of all, but its client holds one
	spam1 := issue("spam")
	issue("spam")
	issue("other")
	issue("other")
	q, victim, err := b.reserve("new", now)
	if err != nil || victim != spam1 {
		t.Fatalf("victim %+v (honest %p spam1 %p): %v", victim, honest, spam1, err)
	}
	select {
	case <-victim.shed:
	default:
		t.Fatal("the victim's shed channel is open")
	}
	if total, n := b.counts("spam"); total != 5 || n != 1 {
		t.Fatalf("total %d, spam %d", total, n)
	}
	_ = q // still being issued: never dropped nor shed
	// Requests past their expiry whose end nobody reported are forgotten
	// before anything is shed.
	later := now.Add(time.Minute + deadAfter + time.Second)
	if _, victim, err := b.reserve("new", later); err != nil || victim != nil {
		t.Fatalf("after expiry: victim %v, %v", victim, err)
	}
	if total, _ := b.counts("spam"); total != 2 {
		t.Fatalf("total %d after the dead were dropped", total)
	}
}
