package lnd

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// TestMissedSettlementIsBooked: LND's all-invoices stream can skip a
// settlement (lnd v0.20.2's dispatchToClients stops at the first
// subscriber whose stream is being closed, so every subscriber after it
// misses that event: another application, or another capvend, leaving
// the node at that moment). A paid plain invoice the stream skipped is
// booked without waiting for its expiry:
//   - a later settlement on the node shows the gap in the settle indexes:
//     the backend subscribes again from the last index it saw in order,
//     LND replays what it skipped, and the stored cursor never passes a
//     settlement not booked;
//   - with no settlement after it, the look-up of the newest unsettled
//     invoices (Config.TailCheck) finds it.
func TestMissedSettlementIsBooked(t *testing.T) {
	for _, tc := range []struct {
		name string
		tail time.Duration
		gap  bool // a later settlement arrives on the stream
		amp  bool // and an index before it is no plain settlement
	}{
		{"a later settlement shows the gap", time.Hour, true, false},
		{"nothing after it", 20 * time.Millisecond, false, false},
		{"a gap that is no settlement", time.Hour, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			n, l, ps, settled := runLate(t, Config{Sweep: 10 * time.Millisecond, TailCheck: tc.tail})
			seen, missed := ps[0], ps[1]
			waitFor := func(ref string) {
				t.Helper()
				select {
				case got := <-settled:
					if got != ref {
						t.Fatalf("settled %s, want %s", got, ref)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s not booked settled in 10 s", ref)
				}
			}
			// One settlement the stream delivers (settle index 1), then
			// one it skips (2).
			n.settle(seen.Ref)
			n.stream <- n.invoice(seen.Ref)
			waitFor(seen.Ref)
			cursorAt := func(want uint64) {
				t.Helper()
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					_, at, _ := l.LNDCursor(ctx, "lnd")
					if at == want {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("cursor at %d, want %d", at, want)
					}
				}
			}
			cursorAt(1) // the stream is done with it
			n.settle(missed.Ref)
			if tc.amp {
				// Index 3 is an AMP payment's: the stream and LND's
				// replay show no settlement at 3.
				n.skipIndex()
			}
			if tc.gap {
				// Another application's invoice, settled next (3, or 4
				// after the AMP payment), is delivered.
				other := n.add(5000)
				ref := fmt.Sprintf("%x", other.RHash)
				n.settle(ref)
				n.stream <- n.invoice(ref)
			}
			waitFor(missed.Ref)
			if p, err := l.Payment(ctx, missed.Ref); err != nil || p.State != vend.PaymentSettled || p.SettleIndex != 2 {
				t.Fatalf("skipped invoice: %+v %v", p, err)
			}
			if !tc.gap {
				cursorAt(1) // the stream saw nothing after it
				return
			}
			last := uint64(3)
			if tc.amp {
				last = 4
			}
			cursorAt(last)
			// One more settlement after the replay: no gap, no new
			// subscription (an index that is no settlement is not a gap
			// for ever).
			other := n.add(5000)
			ref := fmt.Sprintf("%x", other.RHash)
			n.settle(ref)
			n.stream <- n.invoice(ref)
			cursorAt(last + 1)
			if got := n.subscriptions(); !slices.Equal(got, []uint64{0, 1}) {
				t.Fatalf("subscribed from settle indexes %v, want [0 1]: once, then again after the last seen in order", got)
			}
		})
	}
}
