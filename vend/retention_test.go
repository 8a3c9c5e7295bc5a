package vend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// TestReplayOfAPrunedResultIsExpired: once a paid call's stored answer
// is pruned after the retention period, a replay of its request gets
// ErrResultExpired: not an empty answer, no new payment, no second run.
// A refunded call's replay still carries its refund with that error.
func TestReplayOfAPrunedResultIsExpired(t *testing.T) {
	h := newHarness(t, false, nil)
	ctx := context.Background()
	ch := h.callAsync(req("7", "demo_echo", `{"text":"hi"}`, nil))
	h.be.pay(h.nextPayment(t).Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatal(o.err)
	}
	failed := req("8", "demo_fail", `{"text":"x"}`, nil)
	failed.RefundInvoice = "lnbcrt100n1pjqxyzpp5qqqsyqcyq5rqwzqfqqqsyqcyq5rqwzqfqqqsyqcyq5rqwzqfqypqdq"
	ch = h.callAsync(failed)
	h.be.pay(h.nextPayment(t).Ref)
	if o := result(t, ch); o.err != nil || !o.res.IsError {
		t.Fatalf("the failing call: %s %v", o.res.Body, o.err)
	}
	st, err := h.l.Prune(ctx, time.Now().Add(time.Hour), time.Millisecond)
	if err != nil || st.Results != 2 {
		t.Fatalf("pruned %+v, %v", st, err)
	}

	res, err := h.v.CallItem(ctx, req("7", "demo_echo", `{"text":"hi"}`, nil))
	if !errors.Is(err, vend.ErrResultExpired) || res.Body != nil {
		t.Fatalf("replay of a pruned result: %s %v; want ErrResultExpired", res.Body, err)
	}
	if n := h.tools.count("echo"); n != 1 {
		t.Fatalf("echo ran %d times, want once", n)
	}
	_, err = h.v.CallItem(ctx, failed)
	var re *vend.RefundError
	if !errors.As(err, &re) || !errors.Is(err, vend.ErrResultExpired) || !re.Refund.Owed || re.Refund.Amount != 10 {
		t.Fatalf("replay of a refunded call whose result was pruned: %v; want its refund with ErrResultExpired", err)
	}
	if n := h.tools.count("fail"); n != 1 {
		t.Fatalf("fail ran %d times, want once", n)
	}
	select {
	case p := <-h.be.last:
		t.Fatalf("a replay asked for a payment: %+v", p)
	default:
	}
	verify(t, h.l)
}
