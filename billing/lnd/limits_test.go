package lnd_test

import (
	"context"
	"encoding/hex"
	"runtime/pprof"
	"strings"
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
	ln := lnrpc.NewLightningClient(vendorConn(t))
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

// grpcStreams counts the client streams gRPC keeps open in this process
// (each has a goroutine watching its context until it ends).
func grpcStreams() int {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	return strings.Count(b.String(), "grpc.newClientStreamWithParams.func")
}

// TestEndedHoldInvoicesCloseTheirStreams: a hold invoice's
// SubscribeSingleInvoice stream is closed once the invoice is settled or
// canceled. It used to stay open (watchHold returned after the final
// state without ending the stream), one gRPC stream per ended hold
// invoice for as long as capvend ran: under an invoice flood, thousands.
func TestEndedHoldInvoicesCloseTheirStreams(t *testing.T) {
	needStack(t)
	l := newLedger(t)
	be := open(t, l, vendor(t).RPCHost, lnd.Config{Hold: true})
	runBackend(t, be)
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for grpcStreams() < 1 { // Run's SubscribeInvoices
		if time.Now().After(deadline) {
			t.Fatal("the backend never subscribed to its invoices")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := grpcStreams()
	const n = 10
	for i := 0; i < n; i++ {
		c := recordCall(t, l, i)
		p, err := be.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: 1000, Memo: "stream", Expiry: time.Hour, Hold: true})
		if err != nil || p.Kind != vend.KindHoldInvoice {
			t.Fatalf("%s %v", p.Kind, err)
		}
		if err := be.Cancel(ctx, p.Ref); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.Now().Add(30 * time.Second)
	for be.Watching() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d hold invoices still watched after they were canceled", be.Watching())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A canceled stream's goroutine ends just after its context does
	// (which is just before Watching drops): wait for it, bounded.
	for after := grpcStreams(); after > before; after = grpcStreams() {
		if time.Now().After(deadline) {
			t.Fatalf("%d gRPC streams open after %d hold invoices ended, %d before", after, n, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchOfAnEndedHoldInvoiceEnds: a hold invoice watch that begins
// after the invoice was canceled (and deleted at LND) ends. Request starts
// the watch's goroutine and Cancel may run before it subscribes; LND keeps
// a stream for a deleted invoice open forever, sending nothing, so the
// watch (and its gRPC stream) used to stay for as long as capvend ran.
func TestWatchOfAnEndedHoldInvoiceEnds(t *testing.T) {
	needStack(t)
	l := newLedger(t)
	be := open(t, l, vendor(t).RPCHost, lnd.Config{Hold: true})
	ctx := context.Background()
	c := recordCall(t, l, 0)
	p, err := be.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: 1000, Memo: "late watch", Expiry: time.Hour, Hold: true})
	if err != nil || p.Kind != vend.KindHoldInvoice {
		t.Fatalf("%s %v", p.Kind, err)
	}
	if err := be.Cancel(ctx, p.Ref); err != nil { // not running: no watch yet
		t.Fatal(err)
	}
	runBackend(t, be)
	deadline := time.Now().Add(30 * time.Second)
	for !be.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("the backend never connected")
		}
		time.Sleep(20 * time.Millisecond)
	}
	be.WatchHold(p.Ref) // as a watch goroutine that lost the race with Cancel
	for be.Watching() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the watch of a canceled, deleted hold invoice is still open")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
