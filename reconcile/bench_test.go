package reconcile_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// BenchmarkReconcileRun is one run over the invoices capvend's paid calls
// made in a second at full speed (2000, all settled and booked): what a
// reconciler running every second costs (vend's
// BenchmarkMonitoringOverhead measures it against the calls). The ledger
// is in /dev/shm when there is one, so the run's three commits cost no
// disk waits.
func BenchmarkReconcileRun(b *testing.B) {
	const n = 2000
	dir, err := os.MkdirTemp("/dev/shm", "capvend-bench")
	if err != nil {
		dir = b.TempDir()
	} else {
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	l, err := ledger.Open(context.Background(), filepath.Join(dir, "capvend.db"), ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	ctx := context.Background()
	lnd := &fakeLND{}
	for i := 1; i <= n; i++ {
		_, p := invoice(b, l, i, vend.KindInvoice)
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			b.Fatal(err)
		}
		lnd.invs = append(lnd.invs, reconcile.Invoice{Ref: p.Ref, State: reconcile.InvoiceSettled, AmountPaid: p.Amount,
			AddIndex: uint64(i), SettleIndex: uint64(i)})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// A node name of its own: its cursor starts at 0, so each run
		// compares all n invoices.
		r, err := reconcile.New(reconcile.Config{Store: l, LND: lnd, Node: fmt.Sprint("bench", i)})
		if err != nil {
			b.Fatal(err)
		}
		s, err := r.Once(ctx)
		if err != nil || len(s.Differences) != 0 {
			b.Fatalf("%v %+v", err, s.Differences)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/invoice")
}
