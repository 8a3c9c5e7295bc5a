package vend

import (
	"fmt"
	"testing"
	"time"
)

func refEvent(ref string) PaymentEvent {
	var e PaymentEvent
	e.Payment.Ref = ref
	return e
}

// TestWaiterTakenExpires: a taken ref's report counts as delivered (once)
// for takenFor after its take; an older take expires, unless the ref was
// taken again since; and the takes an hour old are forgotten, not kept.
func TestWaiterTakenExpires(t *testing.T) {
	var w waiterSet
	t0 := time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)
	w.take("a", w.add("a"), t0)
	w.take("b", w.add("b"), t0.Add(time.Minute))
	if n := w.deliver(refEvent("a")); n != 1 {
		t.Fatalf("a's report after its take: %d waiters, want 1", n)
	}
	if n := w.deliver(refEvent("a")); n != 0 {
		t.Fatalf("a's second report: %d waiters, want 0 (the orphan path)", n)
	}
	w.take("b", w.add("b"), t0.Add(50*time.Minute)) // taken again
	w.take("c", w.add("c"), t0.Add(takenFor+2*time.Minute))
	if n := w.deliver(refEvent("b")); n != 1 {
		t.Fatalf("b, taken again 50 min in: %d waiters, want 1", n)
	}
	w.take("d", w.add("d"), t0.Add(2*takenFor+3*time.Minute))
	if n := w.deliver(refEvent("c")); n != 0 {
		t.Fatalf("c's report over takenFor after its take: %d waiters, want 0", n)
	}
	for i := range 1000 {
		w.take(fmt.Sprint(i), w.add(fmt.Sprint(i)), t0.Add(3*takenFor+time.Duration(i)*time.Second))
	}
	w.take("e", w.add("e"), t0.Add(5*takenFor))
	if len(w.taken) != 1 {
		t.Errorf("%d taken refs after all but one expired, want 1", len(w.taken))
	}
}

// BenchmarkWaiterTake takes refs with 100 000 taken within the hour: a
// take costs the same whatever their number.
func BenchmarkWaiterTake(b *testing.B) {
	var w waiterSet
	t0 := time.Now()
	for i := range 100_000 {
		w.take(fmt.Sprint("old", i), nil, t0)
	}
	b.ResetTimer()
	for i := range b.N {
		w.take(fmt.Sprint(i), nil, t0.Add(time.Duration(i)))
	}
}
