package vend_test

import (
	"context"
	"sync"
	"testing"

	"github.com/capvend/capvend/vend"
)

// TestClientLeavesAtTheInstantItsPaymentLands: the backend reports the
// payment to the waiting call and the client's context ends at that same
// instant, before the waiter looks. Whichever the waiter sees first, the
// call must not be left paid with its money (or a locked hold invoice)
// held: it runs (its result stored for the replay) or it is refunded.
func TestClientLeavesAtTheInstantItsPaymentLands(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(map[bool]string{false: "invoice", true: "hold invoice"}[hold], func(t *testing.T) {
			for i := 0; i < 20; i++ { // both of the waiter's choices, many times over
				h := newHarness(t, hold, nil)
				ctx, cancel := context.WithCancel(context.Background())
				var once sync.Once
				var p vend.Payment
				r := req("1", "demo_echo", `{"text":"x"}`, nil)
				r.Notify = func(method string, _ any) {
					if method != vend.NotifyPaymentRequired {
						return
					}
					once.Do(func() { // on the waiter's goroutine, before it waits
						p = <-h.be.last
						h.be.pay(p.Ref) // reported: the event is in the waiter's channel
						cancel()        // and the client is gone
					})
				}
				h.v.CallItem(ctx, r)
				c, err := h.l.Call(context.Background(), p.CallID)
				if err != nil {
					t.Fatal(err)
				}
				pay, _ := h.l.Payment(context.Background(), p.Ref)
				switch {
				case c.State == vend.CallDelivered && pay.State == vend.PaymentSettled:
					res, err := h.v.CallItem(context.Background(), req("1", "demo_echo", `{"text":"x"}`, nil))
					if err != nil || string(res.Body) != `{"content":[{"type":"text","text":"echo:x"}]}` {
						t.Fatalf("replay: %s %v", res.Body, err)
					}
				case c.State == vend.CallRefunded && (pay.State == vend.PaymentCanceled || !hold):
				default:
					t.Fatalf("run %d: call %s, payment %s: stuck", i, c.State, pay.State)
				}
				verify(t, h.l)
			}
		})
	}
}
