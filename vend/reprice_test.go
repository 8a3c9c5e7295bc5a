package vend_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// A price change that makes a tool free refunds the explicit-gating grants
// paid for it (the client's repeat would run free and never use them) and
// withdraws the ones not paid yet.
func TestGrantOfAToolThatBecameFreeIsRefunded(t *testing.T) {
	h := newHarness(t, false, nil)
	ctx := context.Background()
	paid := req("1", "demo_echo", `{"text":"paid"}`, nil)
	paid.Explicit = true
	var pr *vend.PaymentRequiredError
	if _, err := h.v.CallItem(ctx, paid); !errors.As(err, &pr) {
		t.Fatalf("first call: %v", err)
	}
	pp := h.nextPayment(t)
	h.be.pay(pp.Ref)
	unpaid := req("2", "demo_echo", `{"text":"unpaid"}`, nil)
	unpaid.Explicit = true
	if _, err := h.v.CallItem(ctx, unpaid); !errors.As(err, &pr) {
		t.Fatalf("second call: %v", err)
	}
	up := h.nextPayment(t)
	// A grant for a tool still priced is left alone.
	other := req("3", "demo_fail", `{"text":"x"}`, nil)
	other.Explicit = true
	if _, err := h.v.CallItem(ctx, other); !errors.As(err, &pr) {
		t.Fatalf("third call: %v", err)
	}
	op := h.nextPayment(t)
	h.be.pay(op.Ref)

	h.v.SetPrices(newBook(t, map[string]pricing.Rule{"fail": {Price: 10_000}}))
	n, err := h.v.RefundFreedGrants(ctx)
	if err != nil || n != 2 {
		t.Fatalf("RefundFreedGrants = %d, %v; want 2", n, err)
	}
	if c, _ := h.l.Call(ctx, pp.CallID); c.State != vend.CallRefunded {
		t.Fatalf("paid grant is %s, want refunded", c.State)
	}
	if p, _ := h.l.Payment(ctx, up.Ref); p.State != vend.PaymentCanceled {
		t.Fatalf("unpaid grant's invoice is %s, want canceled", p.State)
	}
	if c, _ := h.l.Call(ctx, op.CallID); c.State != vend.CallPaid {
		t.Fatalf("grant of a still priced tool is %s, want paid", c.State)
	}
	b, err := h.l.Balance(ctx)
	if err != nil || b.Pending.RefundsOwed != 21_000 {
		t.Fatalf("refunds owed %v (%v), want 21 sat", b.Pending.RefundsOwed, err)
	}
	// The client's repeat now runs free; nothing else is charged.
	paid.RequestID = "4"
	res, err := h.v.CallItem(ctx, paid)
	if err != nil || !strings.Contains(string(res.Body), "echo:paid") {
		t.Fatalf("repeat: %s %v", res.Body, err)
	}
	if n, err := h.v.RefundFreedGrants(ctx); err != nil || n != 0 {
		t.Fatalf("second RefundFreedGrants = %d, %v; want 0", n, err)
	}
	verify(t, h.l)
}
