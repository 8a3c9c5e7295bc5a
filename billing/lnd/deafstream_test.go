package lnd_test

import (
	"context"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"google.golang.org/grpc"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/vend"
)

// deafLightning is the vendor node whose all-invoices stream never
// delivers anything: what the backend sees when LND registers its
// subscription (from settle index 0) only after a payment settled.
type deafLightning struct{ lnrpc.LightningClient }

func (d deafLightning) SubscribeInvoices(ctx context.Context, _ *lnrpc.InvoiceSubscription, _ ...grpc.CallOption) (lnrpc.Lightning_SubscribeInvoicesClient, error) {
	return deafStream{ctx: ctx}, nil
}

type deafStream struct {
	lnrpc.Lightning_SubscribeInvoicesClient
	ctx context.Context
}

func (s deafStream) Recv() (*lnrpc.Invoice, error) {
	<-s.ctx.Done()
	return nil, s.ctx.Err()
}

// TestSettlementMissedByTheStreamIsFoundSoon: a plain invoice paid while
// the stream does not tell (a subscription LND registered late) is found
// by the backend's look-ups after it connected, within seconds, not at
// the invoice's expiry (10 minutes here) or the next reconcile.
func TestSettlementMissedByTheStreamIsFoundSoon(t *testing.T) {
	needStack(t)
	l := newLedger(t)
	conn := vendorConn(t)
	b, err := lnd.New(context.Background(), deafLightning{lnrpc.NewLightningClient(conn)}, invoicesrpc.NewInvoicesClient(conn), l,
		lnd.Config{Sweep: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	settled := make(chan string, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Run(ctx, func(e vend.PaymentEvent) {
			if e.Payment.State == vend.PaymentSettled {
				settled <- e.Payment.Ref
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	c := recordCall(t, l, 1)
	p, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Memo: "deaf", Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), time.Minute)
	defer pcancel()
	if _, err := stack.Pay(pctx, p.Bolt11); err != nil {
		t.Fatal(err)
	}
	select {
	case ref := <-settled:
		if ref != p.Ref {
			t.Fatalf("settled %s, want %s", ref, p.Ref)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a settlement the stream never told was not found in 30 s")
	}
}
