package nwc_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestLostNotificationIsLookedUp: a wallet that sends payment_received
// is not polled; a notification it (or the relay) lost while the
// connection stayed up left the paid invoice waiting for its expiry. The
// newest open payments are looked up every TailCheck: the payment is
// booked settled, once, long before its expiry.
func TestLostNotificationIsLookedUp(t *testing.T) {
	ctx := context.Background()
	w := newFakeWalletNoting(t, []string{nwc.NotePaymentReceived}, nwc.MethodMakeInvoice, nwc.MethodLookupInvoice)
	l, err := ledger.Open(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := nwc.NewClient(w.uri, nwc.ClientConfig{Timeout: 3 * time.Second, ConnectTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := nwc.New(ctx, c, l, nwc.Config{Sweep: 10 * time.Millisecond, TailCheck: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	settled := make(chan vend.Payment, 4)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Run(rctx, func(e vend.PaymentEvent) {
			if e.Payment.State == vend.PaymentSettled {
				settled <- e.Payment
			}
		})
	}()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); !b.Available(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not connected in 10 s")
		}
	}

	bolt11, _, hash := testInvoice(t, 21_000, 10*time.Minute)
	w.script(nwc.MethodMakeInvoice, answer{result: nwc.Transaction{Type: "incoming", State: "pending", Invoice: bolt11,
		PaymentHash: hash, Amount: 21_000}})
	w.script(nwc.MethodLookupInvoice, answer{result: nwc.Transaction{Type: "incoming", State: "pending", Invoice: bolt11,
		PaymentHash: hash, Amount: 21_000}})
	c1, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "c", RequestID: "1", Server: "s", Name: "t",
		ArgsHash: strings.Repeat("0", 64), Price: 21_000, Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.Request(ctx, vend.PaymentRequest{CallID: c1.ID, Amount: c1.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Looked up while unpaid: still open.
	for deadline := time.Now().Add(10 * time.Second); w.count(nwc.MethodLookupInvoice) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the open invoice was never looked up")
		}
	}
	// Paid; the payment_received notification never comes.
	w.script(nwc.MethodLookupInvoice, answer{result: nwc.Transaction{Type: "incoming", State: "settled", Invoice: bolt11,
		PaymentHash: hash, Amount: 21_000, SettledAt: time.Now().Unix()}})
	select {
	case got := <-settled:
		if got.Ref != p.Ref || got.Settled != 21_000 {
			t.Fatalf("settled %+v, want %s for 21000 msat", got, p.Ref)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a paid invoice whose notification was lost was not booked in 10 s")
	}
	time.Sleep(300 * time.Millisecond) // more tail checks: nothing booked twice
	select {
	case again := <-settled:
		t.Fatalf("settled twice: %+v", again)
	default:
	}
	if got, err := l.Payment(ctx, p.Ref); err != nil || got.State != vend.PaymentSettled {
		t.Fatalf("payment %+v %v", got, err)
	}
}
