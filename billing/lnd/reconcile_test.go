package lnd_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// recEnv is a ledger, an LND backend that is not running (capvend is
// stopped: nothing watches the invoices) and a reconciler on the vendor
// node, with the invoice macaroon as in production.
type recEnv struct {
	l     *ledger.Ledger
	b     *lnd.Backend
	node  *lnd.Node
	calls int
}

func newRecEnv(t *testing.T) *recEnv {
	t.Helper()
	needStack(t)
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conn := vendorConn(t)
	ln, inv := lnrpc.NewLightningClient(conn), invoicesrpc.NewInvoicesClient(conn)
	b, err := lnd.New(context.Background(), ln, inv, l, lnd.Config{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	return &recEnv{l: l, b: b, node: lnd.NewNode(ln, inv)}
}

func (e *recEnv) reconciler(t *testing.T, repair bool, report func(vend.PaymentEvent)) *reconcile.Reconciler {
	t.Helper()
	r, err := reconcile.New(reconcile.Config{Store: e.l, LND: e.node, Repair: repair, Report: report})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// request records a call and asks the backend for its payment.
func (e *recEnv) request(t *testing.T, sats int64, hold bool) (vend.Call, vend.Payment) {
	t.Helper()
	e.calls++
	h := sha256.Sum256([]byte(fmt.Sprint(t.Name(), e.calls)))
	c, _, err := e.l.RecordCall(context.Background(), vend.NewCall{Transport: "test", Client: "reconcile",
		RequestID: fmt.Sprint("req-", e.calls), Server: "s", Name: "paid_echo", ArgsHash: hex.EncodeToString(h[:]),
		Price: vend.Msat(sats * 1000), Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Memo: "reconcile test",
		Expiry: time.Hour, Hold: hold})
	if err != nil {
		t.Fatal(err)
	}
	if hold != (p.Kind == vend.KindHoldInvoice) {
		t.Fatalf("asked hold=%v, got a %s", hold, p.Kind)
	}
	return c, p
}

// payHeld pays a hold invoice from the customer in the background and
// returns once LND holds the HTLC (ACCEPTED); the channel gets the
// payment's outcome (nil: settled; an error: canceled, money back).
func payHeld(t *testing.T, p vend.Payment) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	go func() {
		_, err := stack.Pay(ctx, p.Bolt11)
		done <- err
	}()
	conn, err := stack.Conn(testnet.Vendor)
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := hex.DecodeString(p.Ref)
	for {
		inv, err := lnrpc.NewLightningClient(conn).LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash})
		if err != nil {
			t.Fatal(err)
		}
		if inv.State == lnrpc.Invoice_ACCEPTED {
			return done
		}
		select {
		case err := <-done:
			t.Fatalf("the hold invoice's payment ended before LND accepted it: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// only returns the run's one difference, failing unless there is exactly
// one of kind about ref.
func only(t *testing.T, s reconcile.Summary, kind reconcile.Kind, ref string) reconcile.Difference {
	t.Helper()
	var found []reconcile.Difference
	for _, d := range s.Differences {
		if d.Ref == ref {
			found = append(found, d)
		}
	}
	if len(found) != 1 || found[0].Kind != kind {
		t.Fatalf("want one %s difference about %s, got %+v", kind, ref, s.Differences)
	}
	return found[0]
}

func none(t *testing.T, s reconcile.Summary, ref string) {
	t.Helper()
	for _, d := range s.Differences {
		if d.Ref == ref {
			t.Fatalf("want no difference about %s, got %+v", ref, d)
		}
	}
}

// TestReconcileBooksLateSettlement: an invoice paid while capvend is
// stopped is found (settled at LND, open in the ledger), reported without
// --repair, booked once with it (the entry says reconcile), and the backend
// starting afterwards (its subscription replays the settlement) books
// nothing more.
func TestReconcileBooksLateSettlement(t *testing.T) {
	e := newRecEnv(t)
	ctx := context.Background()
	c, p := e.request(t, 21, false)
	if _, err := stack.Pay(ctx, p.Bolt11); err != nil {
		t.Fatal(err)
	}
	s, err := e.reconciler(t, false, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := only(t, s, reconcile.SettledUnbooked, p.Ref)
	if d.Repair != "" || d.CallID != c.ID {
		t.Fatalf("report-only run: %+v", d)
	}
	if cur, _ := e.l.Payment(ctx, p.Ref); cur.State != vend.PaymentOpen {
		t.Fatalf("a run without repair changed the payment to %s", cur.State)
	}
	var reported []vend.PaymentEvent
	s, err = e.reconciler(t, true, func(ev vend.PaymentEvent) { reported = append(reported, ev) }).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d = only(t, s, reconcile.SettledUnbooked, p.Ref)
	if !strings.HasPrefix(d.Repair, "reconcile") || s.Repaired != 1 {
		t.Fatalf("repair run: %+v (repaired %d)", d, s.Repaired)
	}
	if len(reported) != 1 || reported[0].Payment.State != vend.PaymentSettled || reported[0].Payment.CallID != c.ID {
		t.Fatalf("reported %+v", reported)
	}
	if cur, _ := e.l.Call(ctx, c.ID); cur.State != vend.CallPaid {
		t.Fatalf("call is %s after the late settlement, want paid (Recover runs it)", cur.State)
	}
	// Now capvend starts: its subscription replays the settlement.
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- e.b.Run(rctx, func(vend.PaymentEvent) {}) }()
	s, err = e.reconciler(t, true, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	none(t, s, p.Ref)
	stop()
	<-ran
	rep, err := e.l.Verify(ctx)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	bal, err := e.l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var booked int
	for _, tr := range bal.Tools {
		booked += tr.Calls
		if tr.Revenue != 21_000 {
			t.Fatalf("revenue %d msat, want 21000 (booked once)", tr.Revenue)
		}
	}
	if booked != 1 {
		t.Fatalf("%d settlements booked, want 1", booked)
	}
	runs, err := e.l.ReconcileRuns(ctx, 10)
	if err != nil || len(runs) != 3 || len(runs[1].Differences) != 1 || runs[1].Differences[0].Repair == "" {
		t.Fatalf("recorded runs: %v %+v", err, runs)
	}
	if !strings.Contains(journal(t, e.l), "(reconcile: booked the late settlement)") {
		t.Fatal("the settlement entry does not say it was a reconcile repair")
	}
}

// journal returns the ledger's journal as text (capvend ledger export).
func journal(t *testing.T, l *ledger.Ledger) string {
	t.Helper()
	var sb strings.Builder
	if err := l.Export(context.Background(), &sb, ledger.ExportOptions{Format: ledger.FormatHledger}); err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// lncli runs the stack's lncli against the vendor node with its admin
// macaroon: what an operator does behind capvend's back.
func lncli(t *testing.T, args ...string) string {
	t.Helper()
	dir, err := testnet.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	n := vendor(t)
	bin := filepath.Join(dir, "lnd-"+testnet.LNDVersion, "lncli")
	out, err := exec.Command(bin, append([]string{"--network=regtest", "--rpcserver=" + n.RPCHost,
		"--tlscertpath=" + n.TLSCert, "--macaroonpath=" + n.AdminMacaroon}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("lncli %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestReconcileHoldCanceledWithLncli: a locked-in hold invoice of a paid
// call is canceled with lncli while capvend is stopped; the reconciler
// ends the payment and refunds the call that never ran, and the customer
// has the money back.
func TestReconcileHoldCanceledWithLncli(t *testing.T) {
	e := newRecEnv(t)
	ctx := context.Background()
	c, p := e.request(t, 17, true)
	paid := payHeld(t, p)
	if _, err := e.l.AcceptPayment(ctx, p.Ref); err != nil { // what the watcher recorded before capvend stopped
		t.Fatal(err)
	}
	lncli(t, "cancelinvoice", p.Ref)
	if err := <-paid; err == nil {
		t.Fatal("the customer's payment of the canceled hold invoice succeeded")
	}
	s, err := e.reconciler(t, true, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := only(t, s, reconcile.CanceledUnbooked, p.Ref)
	if d.Repair == "" {
		t.Fatalf("not repaired: %+v", d)
	}
	cur, _ := e.l.Payment(ctx, p.Ref)
	call, _ := e.l.Call(ctx, c.ID)
	if cur.State != vend.PaymentCanceled || call.State != vend.CallRefunded || !strings.HasPrefix(call.Reason, "reconcile") {
		t.Fatalf("after repair: payment %s, call %s (%q)", cur.State, call.State, call.Reason)
	}
	s, err = e.reconciler(t, true, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	none(t, s, p.Ref)
}

// TestReconcileCancelsOrphanHold: a hold invoice stays locked in at LND
// although its call failed (capvend stopped between recording the failure
// and canceling the invoice); the reconciler cancels it at LND, the
// customer's payment comes back, and the ledger records it.
func TestReconcileCancelsOrphanHold(t *testing.T) {
	e := newRecEnv(t)
	ctx := context.Background()
	c, p := e.request(t, 13, true)
	paid := payHeld(t, p)
	if _, err := e.l.AcceptPayment(ctx, p.Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := e.l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := e.l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "upstream failed"); err != nil {
		t.Fatal(err)
	}
	s, err := e.reconciler(t, false, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	only(t, s, reconcile.OrphanHold, p.Ref)
	select {
	case err := <-paid:
		t.Fatalf("a report-only run ended the payment: %v", err)
	default:
	}
	s, err = e.reconciler(t, true, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := only(t, s, reconcile.OrphanHold, p.Ref); d.Repair == "" {
		t.Fatalf("not repaired: %+v", d)
	}
	if err := <-paid; err == nil {
		t.Fatal("the customer's payment of the orphan hold invoice succeeded")
	}
	cur, _ := e.l.Payment(ctx, p.Ref)
	call, _ := e.l.Call(ctx, c.ID)
	if cur.State != vend.PaymentCanceled || call.State != vend.CallRefunded {
		t.Fatalf("after repair: payment %s, call %s", cur.State, call.State)
	}
	s, err = e.reconciler(t, true, nil).Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	none(t, s, p.Ref)
}
