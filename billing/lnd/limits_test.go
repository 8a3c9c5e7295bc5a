package lnd_test

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/vend"
)

// runBackend runs be's watcher until the test ends.
func runBackend(t *testing.T, be *lnd.Backend) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); be.Run(ctx, func(vend.PaymentEvent) {}) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestHoldInvoicesAreBounded: at most MaxHold hold invoices are open (one
// SubscribeSingleInvoice stream each); beyond, quotes get plain invoices,
// which the one SubscribeInvoices stream follows.
func TestHoldInvoicesAreBounded(t *testing.T) {
	needStack(t)
	l := newLedger(t)
	be := open(t, l, vendor(t).RPCHost, lnd.Config{Hold: true, MaxHold: 2})
	runBackend(t, be)
	ctx := context.Background()
	var ps []vend.Payment
	for i := 0; i < 3; i++ {
		c := recordCall(t, l, i)
		p, err := be.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: 1000, Memo: "bound", Expiry: time.Hour, Hold: true})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if ps[0].Kind != vend.KindHoldInvoice || ps[1].Kind != vend.KindHoldInvoice || ps[2].Kind != vend.KindInvoice {
		t.Fatalf("kinds %s %s %s, want hold, hold, plain", ps[0].Kind, ps[1].Kind, ps[2].Kind)
	}
	if n := be.OpenHolds(); n != 2 {
		t.Fatalf("%d open hold invoices", n)
	}
	// A hold invoice that ends makes room.
	if err := be.Cancel(ctx, ps[0].Ref); err != nil {
		t.Fatal(err)
	}
	c := recordCall(t, l, 3)
	p, err := be.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: 1000, Memo: "bound", Expiry: time.Hour, Hold: true})
	if err != nil || p.Kind != vend.KindHoldInvoice {
		t.Fatalf("after a cancel: %s %v", p.Kind, err)
	}
}

// TestCanceledUnpaidInvoicesAreDeleted: an unpaid invoice capvend cancels
// (shed, expired) is deleted from LND, so a flood leaves nothing there.
func TestCanceledUnpaidInvoicesAreDeleted(t *testing.T) {
	needStack(t)
	l := newLedger(t)
	be := open(t, l, vendor(t).RPCHost, lnd.Config{Hold: true})
	n := vendor(t)
	conn, err := lnd.Dial(n.RPCHost, n.TLSCert, n.InvoiceMacaroon)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ln := lnrpc.NewLightningClient(conn)
	ctx := context.Background()
	for i, hold := range []bool{true, false} {
		c := recordCall(t, l, i)
		p, err := be.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: 1000, Memo: "delete me", Expiry: time.Hour, Hold: hold})
		if err != nil {
			t.Fatal(err)
		}
		if err := be.Cancel(ctx, p.Ref); err != nil {
			t.Fatal(err)
		}
		hash, _ := hex.DecodeString(p.Ref)
		inv, err := ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash})
		if err == nil {
			t.Fatalf("hold %v: the canceled invoice is still at LND (%s)", hold, inv.State)
		}
		if got, _ := l.Payment(ctx, p.Ref); got.State != vend.PaymentCanceled {
			t.Fatalf("hold %v: ledger says %s", hold, got.State)
		}
	}
}
