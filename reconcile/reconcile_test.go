package reconcile_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// fakeLND is a node whose invoices the test sets. The regtest tests
// (billing/lnd) make each difference happen on a real node; this one
// makes the races fast to repeat.
type fakeLND struct {
	mu       sync.Mutex
	invs     []reconcile.Invoice
	canceled []string
}

func (f *fakeLND) Invoices(_ context.Context, after uint64, max int) ([]reconcile.Invoice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []reconcile.Invoice
	for _, inv := range f.invs {
		if inv.AddIndex > after && len(out) < max {
			out = append(out, inv)
		}
	}
	return out, nil
}

func (f *fakeLND) CancelInvoice(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.invs {
		if f.invs[i].Ref == ref {
			if f.invs[i].State == reconcile.InvoiceSettled {
				return errors.New("invoice already settled")
			}
			f.invs[i].State = reconcile.InvoiceCanceled
			f.canceled = append(f.canceled, ref)
		}
	}
	return nil
}

func openLedger(t testing.TB) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// invoice records a call and an LND payment for it.
func invoice(t testing.TB, l *ledger.Ledger, n int, kind vend.PaymentKind) (vend.Call, vend.Payment) {
	t.Helper()
	ctx := context.Background()
	h := sha256.Sum256([]byte(fmt.Sprint("args", n)))
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "c", RequestID: fmt.Sprint(n), Server: "s",
		Name: "t", ArgsHash: hex.EncodeToString(h[:]), Price: 5_000, Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	ref := sha256.Sum256([]byte(fmt.Sprint("hash", n)))
	np := vend.NewPayment{Backend: vend.BackendLND, Kind: kind, Ref: hex.EncodeToString(ref[:]), Bolt11: "lnbcrt1",
		Amount: 5_000, ExpiresAt: time.Now().Add(time.Hour)}
	if kind == vend.KindHoldInvoice {
		np.HoldPreimage = make([]byte, 32)
	}
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

// TestRepairRacesBackend: the reconciler and a backend's watcher book the
// same settlement at the same moment, many times over; the ledger's claim
// lets exactly one through each time, so the money is booked once, and
// the repair is reported (and recorded as a difference) only when it was
// the one. Without the claim (a repair that books whatever the ledger
// said when it looked) the income would be booked twice.
func TestRepairRacesBackend(t *testing.T) {
	l := openLedger(t)
	ctx := context.Background()
	const n = 40
	lnd := &fakeLND{}
	for i := 1; i <= n; i++ {
		_, p := invoice(t, l, i, vend.KindInvoice)
		lnd.invs = append(lnd.invs, reconcile.Invoice{Ref: p.Ref, State: reconcile.InvoiceSettled, AmountPaid: 5_000,
			AddIndex: uint64(i), SettleIndex: uint64(i)})
	}
	var mu sync.Mutex
	var reported int
	r, err := reconcile.New(reconcile.Config{Store: l, LND: lnd, Repair: true,
		Report: func(vend.PaymentEvent) { mu.Lock(); reported++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	var backendBooked int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, inv := range lnd.invs {
			_, err := l.SettlePayment(ctx, vend.Settlement{Ref: inv.Ref, Amount: inv.AmountPaid})
			switch {
			case err == nil:
				backendBooked++
			case !errors.Is(err, vend.ErrAlreadySettled):
				t.Error(err)
			}
		}
	}()
	s, err := r.Once(ctx)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("repaired %d, the backend booked %d", s.Repaired, backendBooked)
	if s.Repaired != reported || s.Repaired+backendBooked != n {
		t.Fatalf("repaired %d, reported %d, backend booked %d: want repaired = reported and a total of %d",
			s.Repaired, reported, backendBooked, n)
	}
	bal, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(bal.Tools) != 1 || bal.Tools[0].Calls != n || bal.Tools[0].Revenue != n*5_000 {
		t.Fatalf("booked %+v, want %d settlements of 5000 msat", bal.Tools, n)
	}
	if s, err = r.Once(ctx); err != nil || len(s.Differences) != 0 {
		t.Fatalf("second run: %v %+v", err, s.Differences)
	}
	if cur, _ := l.ReconcileCursor(ctx, "lnd:lnd"); cur != n {
		t.Fatalf("cursor %d, want %d: every invoice is final and agrees", cur, n)
	}
}

// TestCursorStopsAtOpenInvoice: the cursor never passes an invoice that
// may still change, so a later run compares it again.
func TestCursorStopsAtOpenInvoice(t *testing.T) {
	l := openLedger(t)
	ctx := context.Background()
	_, p1 := invoice(t, l, 1, vend.KindInvoice)
	_, p2 := invoice(t, l, 2, vend.KindInvoice)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p1.Ref, Amount: 5_000}); err != nil {
		t.Fatal(err)
	}
	lnd := &fakeLND{invs: []reconcile.Invoice{
		{Ref: p1.Ref, State: reconcile.InvoiceSettled, AmountPaid: 5_000, AddIndex: 1},
		{Ref: p2.Ref, State: reconcile.InvoiceOpen, AddIndex: 2},
	}}
	r, _ := reconcile.New(reconcile.Config{Store: l, LND: lnd, Repair: true})
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if cur, _ := l.ReconcileCursor(ctx, "lnd:lnd"); cur != 1 {
		t.Fatalf("cursor %d, want 1 (invoice 2 is open)", cur)
	}
	lnd.invs[1].State, lnd.invs[1].AmountPaid = reconcile.InvoiceSettled, 5_000
	s, err := r.Once(ctx)
	if err != nil || len(s.Differences) != 1 || s.Differences[0].Kind != reconcile.SettledUnbooked || s.Repaired != 1 {
		t.Fatalf("second run: %v %+v", err, s)
	}
}

// TestBookedUnsettledIsNotRepaired: the ledger has a settlement LND does
// not; nothing is changed, the operator is told.
func TestBookedUnsettledIsNotRepaired(t *testing.T) {
	l := openLedger(t)
	ctx := context.Background()
	_, p := invoice(t, l, 1, vend.KindInvoice)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 5_000}); err != nil {
		t.Fatal(err)
	}
	lnd := &fakeLND{invs: []reconcile.Invoice{{Ref: p.Ref, State: reconcile.InvoiceCanceled, AddIndex: 1}}}
	var observed []reconcile.Summary
	r, _ := reconcile.New(reconcile.Config{Store: l, LND: lnd, Repair: true, Observe: func(s reconcile.Summary) { observed = append(observed, s) }})
	s, err := r.Once(ctx)
	if err != nil || len(s.Differences) != 1 || s.Differences[0].Kind != reconcile.BookedUnsettled || s.Repaired != 0 {
		t.Fatalf("run: %v %+v", err, s)
	}
	if len(observed) != 1 || observed[0].ByKind()[reconcile.BookedUnsettled] != 1 || len(observed[0].ByKind()) != len(reconcile.Kinds()) {
		t.Fatalf("observed %+v", observed)
	}
	runs, err := l.ReconcileRuns(ctx, 1)
	if err != nil || len(runs) != 1 || len(runs[0].Differences) != 1 || runs[0].Differences[0].Ref != p.Ref || runs[0].Finished.IsZero() {
		t.Fatalf("recorded: %v %+v", err, runs)
	}
}

// settlingLND is a fakeLND that settles its invoices right after listing
// them the first time: capvend's own watcher then books them, before the
// reconciler reads the ledger.
type settlingLND struct {
	fakeLND
	once   sync.Once
	settle func()
}

func (s *settlingLND) Invoices(ctx context.Context, after uint64, max int) ([]reconcile.Invoice, error) {
	invs, err := s.fakeLND.Invoices(ctx, after, max)
	s.once.Do(s.settle)
	return invs, err
}

// TestSettledBetweenReads: an invoice LND listed open, paid and booked
// before the reconciler read the ledger, is no difference (seen in
// BenchmarkPaidCallMonitoring, paid calls under load: a reconciliation
// found booked_unsettled where nothing was wrong).
func TestSettledBetweenReads(t *testing.T) {
	for _, kind := range []vend.PaymentKind{vend.KindInvoice, vend.KindHoldInvoice} {
		t.Run(string(kind), func(t *testing.T) {
			l := openLedger(t)
			ctx := context.Background()
			_, p := invoice(t, l, 1, kind)
			listed := reconcile.InvoiceOpen
			if kind == vend.KindHoldInvoice {
				listed = reconcile.InvoiceAccepted
			}
			lnd := &settlingLND{fakeLND: fakeLND{invs: []reconcile.Invoice{{Ref: p.Ref, State: listed, AddIndex: 1}}}}
			lnd.settle = func() {
				lnd.mu.Lock()
				lnd.invs[0].State, lnd.invs[0].AmountPaid, lnd.invs[0].SettleIndex = reconcile.InvoiceSettled, 5_000, 1
				lnd.mu.Unlock()
				if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 5_000}); err != nil {
					t.Error(err)
				}
			}
			r, err := reconcile.New(reconcile.Config{Store: l, LND: lnd, Repair: true})
			if err != nil {
				t.Fatal(err)
			}
			s, err := r.Once(ctx)
			if err != nil || len(s.Differences) != 0 || s.Repaired != 0 {
				t.Fatalf("run: %v %+v", err, s)
			}
			if c, err := l.ReconcileCursor(ctx, "lnd:lnd"); err != nil || c != 1 {
				t.Fatalf("cursor %d, %v; want 1 (settled on both sides)", c, err)
			}
		})
	}
}

// TestCursorPassesForeignOpenInvoice: an open invoice the ledger does not
// know (another application's on the same node) holds the cursor only
// while capvend may still be about to record it; after that the cursor
// passes it, so each run does not re-read every invoice behind it.
func TestCursorPassesForeignOpenInvoice(t *testing.T) {
	l := openLedger(t)
	ctx := context.Background()
	_, p := invoice(t, l, 1, vend.KindInvoice)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 5_000}); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	lnd := &fakeLND{invs: []reconcile.Invoice{
		{Ref: "f0", State: reconcile.InvoiceOpen, AddIndex: 1, Created: now.Add(-time.Minute)},
		{Ref: p.Ref, State: reconcile.InvoiceSettled, AmountPaid: 5_000, AddIndex: 2, Created: now.Add(-time.Minute)},
		{Ref: "f1", State: reconcile.InvoiceAccepted, AddIndex: 3, Created: now.Add(-time.Minute)},
	}}
	r, _ := reconcile.New(reconcile.Config{Store: l, LND: lnd, Repair: true, Now: func() time.Time { return now }})
	run := func(want uint64) {
		t.Helper()
		s, err := r.Once(ctx)
		if err != nil || len(s.Differences) != 0 {
			t.Fatalf("run: %v %+v", err, s)
		}
		if cur, _ := l.ReconcileCursor(ctx, "lnd:lnd"); cur != want {
			t.Fatalf("cursor %d, want %d", cur, want)
		}
	}
	run(0) // a young unknown invoice may be capvend's, about to be recorded
	now = now.Add(time.Hour)
	run(2) // then it is not capvend's; an unknown HTLC locked in still holds the cursor
	lnd.invs[2].State = reconcile.InvoiceCanceled
	run(3)
}
