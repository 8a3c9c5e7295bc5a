package vend_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// racedLedger is the real ledger, except that the first StartExecution
// finds the call already run by someone else (another capvend process on
// the same ledger): it runs the call to delivered first, then makes the
// claim, which is refused.
type racedLedger struct {
	*ledger.Ledger
	raced atomic.Bool
}

func (l *racedLedger) StartExecution(ctx context.Context, id vend.CallID, b vend.Binding, by vend.Release) (vend.Call, error) {
	if l.raced.CompareAndSwap(false, true) {
		if _, err := l.Ledger.StartExecution(ctx, id, b, by); err != nil {
			return vend.Call{}, err
		}
		if err := l.Ledger.Deliver(ctx, id, vend.Result{Body: []byte(`{"content":[{"type":"text","text":"ran elsewhere"}]}`)}); err != nil {
			return vend.Call{}, err
		}
	}
	return l.Ledger.StartExecution(ctx, id, b, by)
}

// TestRunAnswersACallThatRanElsewhere is the run -> resume self-deadlock:
// run registered its own done channel, its claim was refused because the
// call had run elsewhere, and resume then waited on that same channel
// forever. The call must be answered with the stored result.
func TestRunAnswersACallThatRanElsewhere(t *testing.T) {
	var rl *racedLedger
	h := newHarness(t, false, func(c *vend.Config) {
		rl = &racedLedger{Ledger: c.Ledger.(*ledger.Ledger)}
		c.Ledger = rl
	})
	ch := h.callAsync(req("1", "demo_echo", `{"text":"x"}`, nil))
	h.be.pay(h.nextPayment(t).Ref)
	o := result(t, ch) // a deadlock guard: fails after 10 s
	if o.err != nil || !strings.Contains(string(o.res.Body), "ran elsewhere") || h.tools.count("echo") != 0 {
		t.Fatalf("%s %v runs=%d", o.res.Body, o.err, h.tools.count("echo"))
	}
}
