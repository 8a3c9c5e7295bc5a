package reconcile_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// markedInvoice is an invoice LND settled whose preimage pre was made
// under mark m (capvend's own, if m is its ledger's).
func markedInvoice(t *testing.T, m lnd.Mark, add uint64, amount vend.Msat) reconcile.Invoice {
	t.Helper()
	pre, err := m.NewPreimage()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(pre)
	return reconcile.Invoice{Ref: hex.EncodeToString(h[:]), State: reconcile.InvoiceSettled, AmountPaid: amount,
		AddIndex: add, SettleIndex: add, Created: time.Now(), Preimage: pre}
}

// TestLostSettlementBookedOnce: a ledger restored from its replica does
// not have the quotes made after its last replicated change; LND settled
// one of their invoices meanwhile. The reconciler tells capvend's own
// invoice by the mark of its preimage (keyed by the ledger's identity,
// which the restore brings back) and books its amount, once, to
// liabilities:unattributed; an invoice of another application on the
// same node (unmarked, or marked under another ledger's identity) is not
// capvend's and is left alone, and an invoice the ledger has settled
// agrees. On main the lost settlement was passed over as "not capvend's":
// money LND holds that the books never showed.
func TestLostSettlementBookedOnce(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t)
	id, err := l.InvoiceMark(ctx)
	if err != nil || len(id) != 32 {
		t.Fatalf("the ledger's identity: %x, %v", id, err)
	}
	mark := lnd.Mark(id)
	other := make(lnd.Mark, 32)
	rand.Read(other)

	node := &fakeLND{}
	// An open invoice the ledger does not know, just added: not final,
	// so the cursor stays behind it and the next run looks at everything
	// again (a booking must not repeat).
	node.invs = append(node.invs, reconcile.Invoice{Ref: "aa", State: reconcile.InvoiceOpen, AddIndex: 1, Created: time.Now()})
	_, p := invoice(t, l, 1, vend.KindInvoice)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 5_000}); err != nil {
		t.Fatal(err)
	}
	booked := reconcile.Invoice{Ref: p.Ref, State: reconcile.InvoiceSettled, AmountPaid: 5_000, AddIndex: 2, SettleIndex: 2}
	lost := markedInvoice(t, mark, 3, 21_000)
	foreign := markedInvoice(t, other, 4, 7_000)
	unmarked := markedInvoice(t, nil, 5, 9_000)
	openMarked := markedInvoice(t, mark, 6, 0)
	openMarked.State, openMarked.Preimage = reconcile.InvoiceOpen, nil
	node.invs = append(node.invs, booked, lost, foreign, unmarked, openMarked)

	for run := 1; run <= 2; run++ {
		r, err := reconcile.New(reconcile.Config{Store: l, LND: node, Repair: true, OwnsPreimage: mark.Owns})
		if err != nil {
			t.Fatal(err)
		}
		s, err := r.Once(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if run == 1 {
			want = 1
		}
		if len(s.Differences) != want {
			t.Fatalf("run %d: %d differences, want %d: %+v", run, len(s.Differences), want, s.Differences)
		}
		if run == 1 {
			d := s.Differences[0]
			if d.Kind != reconcile.SettledUnbooked || d.Ref != lost.Ref || d.Ledger != "lost" || d.Repair == "" || s.Repaired != 1 {
				t.Fatalf("run 1: %+v", d)
			}
		}
	}
	// A run that repairs nothing (capvend reconcile) finds it booked:
	// no difference.
	r, err := reconcile.New(reconcile.Config{Store: l, LND: node, OwnsPreimage: mark.Owns})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := r.Once(ctx); err != nil || len(s.Differences) != 0 {
		t.Fatalf("a report-only run after the booking: %+v %v", s.Differences, err)
	}
	bal, err := l.AccountBalances(ctx, "liabilities:unattributed")
	if err != nil {
		t.Fatal(err)
	}
	if got := bal[ledger.AccountUnattributed]; got != -21_000 {
		t.Fatalf("liabilities:unattributed holds %d msat after two runs, want -21000 (the lost settlement, once): %v", got, bal)
	}
	assets, err := l.AccountBalances(ctx, ledger.AccountLND)
	if err != nil {
		t.Fatal(err)
	}
	if got := assets[ledger.AccountLND]; got != 5_000+21_000 {
		t.Fatalf("%s holds %d msat, want %d: what LND received", ledger.AccountLND, got, 5_000+21_000)
	}
	rep, err := l.Verify(ctx)
	if err != nil || !rep.OK() {
		t.Fatalf("verify after booking a lost settlement: %v\n%+v", err, rep)
	}
	// Without repairs (capvend reconcile without --repair) it is reported
	// and nothing is booked.
	l2 := openLedger(t)
	id2, _ := l2.InvoiceMark(ctx)
	if string(id2) == string(id) {
		t.Fatal("two ledgers got the same identity")
	}
	lost2 := markedInvoice(t, lnd.Mark(id2), 1, 1_000)
	r, _ = reconcile.New(reconcile.Config{Store: l2, LND: &fakeLND{invs: []reconcile.Invoice{lost2}}, OwnsPreimage: lnd.Mark(id2).Owns})
	s, err := r.Once(ctx)
	if err != nil || len(s.Differences) != 1 || s.Differences[0].Repair != "" || s.Differences[0].Ledger != "lost" {
		t.Fatalf("report only: %+v %v", s.Differences, err)
	}
	if bal, _ := l2.AccountBalances(ctx, "liabilities:"); bal[ledger.AccountUnattributed] != 0 {
		t.Fatalf("a report-only run booked %v", bal)
	}
}
