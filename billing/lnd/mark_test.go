package lnd_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

func TestMarkOwnsOnlyItsPreimages(t *testing.T) {
	m := make(lnd.Mark, 32)
	rand.Read(m)
	other := make(lnd.Mark, 32)
	rand.Read(other)
	for range 100 {
		pre, err := m.NewPreimage()
		if err != nil {
			t.Fatal(err)
		}
		if len(pre) != 32 || !m.Owns(pre) || other.Owns(pre) || lnd.Mark(nil).Owns(pre) {
			t.Fatalf("preimage %x: owned by its mark %v, by another %v", pre, m.Owns(pre), other.Owns(pre))
		}
		random := make([]byte, 32)
		rand.Read(random)
		if m.Owns(random) {
			t.Fatalf("a random preimage %x is owned", random)
		}
		if unmarked, _ := lnd.Mark(nil).NewPreimage(); m.Owns(unmarked) {
			t.Fatal("an unmarked preimage is owned")
		}
	}
}

// TestInvoicesCarryTheLedgersMark on regtest: the preimage of a plain
// invoice the backend makes is capvend's (marked under the ledger's
// identity), and LND reports it once settled, so the reconciler can tell
// it from another application's invoice on the node (made by LND itself,
// not marked); a hold invoice's preimage, kept in the ledger, is marked
// too.
func TestInvoicesCarryTheLedgersMark(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l := newLedger(t)
	id, err := l.InvoiceMark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mark := lnd.Mark(id)
	b := open(t, l, vendor(t).RPCHost, lnd.Config{Hold: true, Mark: mark})
	plain, err := b.Request(ctx, vend.PaymentRequest{CallID: recordCall(t, l, 1).ID, Amount: 3_000, Memo: "mark", Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hold, err := b.Request(ctx, vend.PaymentRequest{CallID: recordCall(t, l, 2).ID, Amount: 3_000, Memo: "mark", Expiry: time.Hour, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	if hold.Kind != vend.KindHoldInvoice {
		t.Fatalf("asked for a hold invoice, got %s", hold.Kind)
	}
	pre, err := l.HoldPreimage(ctx, hold.Ref)
	if err != nil || !mark.Owns(pre) {
		t.Fatalf("the hold preimage %x is not marked (%v)", pre, err)
	}
	if err := b.Cancel(ctx, hold.Ref); err != nil {
		t.Logf("cancel the hold invoice: %v", err)
	}
	conn := vendorConn(t)
	ln := lnrpc.NewLightningClient(conn)
	foreign, err := ln.AddInvoice(ctx, &lnrpc.Invoice{ValueMsat: 2_000, Memo: "another application"})
	if err != nil {
		t.Fatal(err)
	}
	for _, bolt11 := range []string{plain.Bolt11, foreign.PaymentRequest} {
		if _, err := stack.Pay(ctx, bolt11); err != nil {
			t.Fatal(err)
		}
	}
	invs, err := lnd.NewNode(ln, invoicesrpc.NewInvoicesClient(conn)).Invoices(ctx, 0, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, inv := range invs {
		switch inv.Ref {
		case plain.Ref, hex.EncodeToString(foreign.RHash):
			if inv.State != reconcile.InvoiceSettled {
				t.Fatalf("invoice %s is %s, paid", inv.Ref, inv.State)
			}
			if h := sha256.Sum256(inv.Preimage); hex.EncodeToString(h[:]) != inv.Ref {
				t.Fatalf("the reported preimage of %s does not hash to it", inv.Ref)
			}
			seen[inv.Ref] = mark.Owns(inv.Preimage)
		}
	}
	if len(seen) != 2 || !seen[plain.Ref] || seen[hex.EncodeToString(foreign.RHash)] {
		t.Fatalf("owned by the mark, by payment hash: %v (want capvend's %s only)", seen, plain.Ref)
	}
}
