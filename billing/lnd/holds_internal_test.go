package lnd

import (
	"testing"
	"time"
)

// TestHoldBeingIssuedSurvivesAReconcile: a reconcile whose ledger listing
// ran before a hold invoice was recorded keeps counting it; once recorded,
// a later listing that lacks it (it ended unseen) stops counting it.
func TestHoldBeingIssuedSurvivesAReconcile(t *testing.T) {
	b := &Backend{cfg: Config{MaxHold: 2}, holds: map[string]time.Time{}}
	if !b.takeHold("a") {
		t.Fatal("no room for a")
	}
	b.countHolds(nil, time.Now()) // the ledger does not list "a" yet
	if n := b.OpenHolds(); n != 1 {
		t.Fatalf("%d open holds after a reconcile during issuing, want 1", n)
	}
	b.heldHold("a")
	b.countHolds(nil, time.Now().Add(time.Millisecond))
	if n := b.OpenHolds(); n != 0 {
		t.Fatalf("%d open holds after a recorded hold ended unseen, want 0", n)
	}
}
