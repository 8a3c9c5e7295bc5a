package cli

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// TestCreditRefundRacesDrawsOnPostgres pays a credit account's balance
// back to its client while another capvend instance on the same
// PostgreSQL ledger keeps drawing from it. Instance B sells the credit (a
// top-up paid through a mint quote: the ecash lands in B's wallet) and
// stops; instance A serves credit calls; `capvend credit refund ACCOUNT
// --invoice` pays the whole balance from B's wallet to the customer's
// node. The customer's invoice is a hold invoice: while the melt's
// payment is held at the customer (the money is on its way, nothing is
// final), the client makes credit calls on A. They must all be refused:
// the payout reserved the balance before the money left. Then the
// invoice settles, and the payout is booked once, the client got exactly
// what was left, the wallet reconciles and `capvend ledger verify` passes.
func TestCreditRefundRacesDrawsOnPostgres(t *testing.T) {
	t.Parallel() // most of it waits on payments
	s := needStack(t)
	ctx := context.Background()
	dsn := capvendtest.Postgres(t)
	pathB, listenB := writeServeConfig(t, s, serveOpts{cashu: true, credit: true})
	capvendtest.OnPostgres(t, pathB, dsn)
	pathA, listenA := writeServeConfig(t, s, serveOpts{cashu: true, credit: true})
	capvendtest.OnPostgres(t, pathA, dsn)

	// B sells 200 sats of credit, and a call paid with a Cashu token
	// brings its wallet the melt's fee reserve.
	procB := startCapvend(t, pathB, capvendtest.Options{Process: true})
	pcB := capvendtest.NewPayingClient(t, s, "http://"+listenB+"/mcp")
	capvendtest.WaitTools(t, pcB.Client, listed.Count(11))
	info := capvendtest.BuyCredit(t, pcB, 200, "")
	tok, err := s.CashuMint(ctx, 21)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := pcB.CallMeta(t, "t_sha256", map[string]any{"text": "fee reserve"}, map[string]any{vend.MetaCashuToken: tok}); err != nil || r.IsError {
		t.Fatalf("a call paid with a token: %+v %v", r, err)
	}
	procB.Stop() // B's wallet pays the refund

	procA := startCapvend(t, pathA, capvendtest.Options{Process: true})
	defer procA.Signal(syscall.SIGTERM)
	pcA := capvendtest.NewPayingClient(t, s, "http://"+listenA+"/mcp")
	capvendtest.WaitTools(t, pcA.Client, listed.Count(11))
	draw := func(i int) error {
		t.Helper()
		r, err := pcA.CallMeta(t, "t_sha256", map[string]any{"text": fmt.Sprint("draw ", i)}, map[string]any{vend.MetaCredit: info.Token})
		if err == nil && r.IsError {
			err = fmt.Errorf("isError: %s", capvendtest.Text(r))
		}
		return err
	}
	if err := draw(0); err != nil {
		t.Fatalf("a credit call before the refund: %v", err)
	}
	l, err := ledger.OpenPostgres(ctx, dsn, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	left, err := l.CreditBalance(ctx, info.Account)
	if err != nil || left != 179_000 {
		t.Fatalf("balance before the refund %s (%v), want 179 sats", left, err)
	}

	// The customer's hold invoice for all that is left.
	conn, err := s.Conn(testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	invoices, ln := invoicesrpc.NewInvoicesClient(conn), lnrpc.NewLightningClient(conn)
	preimage := make([]byte, 32)
	rand.Read(preimage)
	hash := sha256.Sum256(preimage)
	inv, err := invoices.AddHoldInvoice(ctx, &invoicesrpc.AddHoldInvoiceRequest{Hash: hash[:], Value: int64(left.SatsCeil()),
		Memo: "credit refund", Expiry: 3600})
	if err != nil {
		t.Fatal(err)
	}
	defer invoices.CancelInvoice(context.Background(), &invoicesrpc.CancelInvoiceMsg{PaymentHash: hash[:]})
	invoiceState := func() *lnrpc.Invoice {
		t.Helper()
		got, err := ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash[:]})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	refund := startCapvend(t, pathB, capvendtest.Options{Args: []string{"credit", "refund", info.Account, "--invoice", inv.PaymentRequest, "--config", pathB},
		Process: true})
	refund.Await("its payment reaching the customer's invoice", func() bool { return invoiceState().State == lnrpc.Invoice_ACCEPTED })

	// The payout is in flight: the balance is reserved for it, and
	// nothing may be drawn from it, on any instance.
	drawn := 0
	for i := range 3 {
		err := draw(1 + i)
		switch {
		case err == nil:
			drawn++
		case !strings.Contains(err.Error(), "Credit exhausted"):
			t.Errorf("a credit call while the refund was in flight: %v", err)
		}
	}
	if drawn > 0 {
		t.Errorf("%d credit calls of 21 sats drew on the %s that the refund in flight is paying out", drawn, left)
	}
	listing, errOut, _ := run(t, nil, "credit", "show", "--config", pathA, info.Account)
	t.Logf("capvend credit show while the payout is in flight:\n%s", listing)
	if !strings.Contains(listing, "179.000") || !strings.Contains(strings.ToLower(listing), "in flight") {
		t.Errorf("credit show does not show the payout in flight:\n%s%s", listing, errOut)
	}

	if _, err := invoices.SettleInvoice(ctx, &invoicesrpc.SettleInvoiceMsg{Preimage: preimage}); err != nil {
		t.Fatal(err)
	}
	if code := refund.Wait(); code != 0 {
		t.Errorf("credit refund: exit %d\n%s%s", code, refund.Stdout(), refund.Stderr())
	}
	received := invoiceState().AmtPaidMsat
	if received != int64(left) {
		t.Errorf("the customer received %d msat, want the %s that was left", received, left)
	}
	if err := draw(10); err == nil || !strings.Contains(err.Error(), "Credit exhausted") {
		t.Errorf("a credit call after the refund: %v", err)
	}

	accts, err := l.CreditAccounts(ctx, info.Account)
	if err != nil {
		t.Fatal(err)
	}
	a := accts[0]
	t.Logf("account %s: bought %s, spent %s on %d calls, refunded %s, balance %s", a.ID, a.TopUps, a.Draws, a.Calls, a.Refunded, a.Balance)
	if a.Refunded != left {
		t.Errorf("the refund is booked as %s, want %s once", a.Refunded, left)
	}
	if spent := vend.Msat(received) + a.Draws; spent > a.TopUps {
		t.Errorf("the client got %s back and %s of calls: %s, more than the %s it bought", vend.Msat(received), a.Draws, spent, a.TopUps)
	}
	if a.TopUps != a.Draws+a.Refunded+a.Balance {
		t.Errorf("bought %s != spent %s + refunded %s + balance %s", a.TopUps, a.Draws, a.Refunded, a.Balance)
	}
	if out, errOut, code := run(t, nil, "cashu", "balance", "--config", pathB); code != 0 {
		t.Errorf("B's wallet does not reconcile with the ledger: %s %s", out, errOut)
	}
	checkLedgerVerifies(t, pathA)
}

// TestRefundsListPayoutsInFlight: an owed refund whose payout is in
// flight (reserved, not booked: a crash between paying and booking) says
// so in `capvend refunds`, with what identifies the money on its way and
// the wallet that resolves it.
func TestRefundsListPayoutsInFlight(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "capvend.db")
	l, err := ledger.Open(ctx, db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := capvendtest.OwedRefund(t, l, 1, "mcp-session-alice", "lnbcrt50n1pjexampleinvoiceforalicexyz")
	p, err := l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, Method: vend.RefundBolt11, MintURL: "http://mint",
		Amount: 5_000, Invoice: r.Invoice, Quote: "q0123456789abcdef", Wallet: "w0011223344556677"})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	out, errOut, code := run(t, nil, "refunds", "--db", db)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{fmt.Sprintf("owed, payout %d in flight", p.ID), "1 refund(s) owed, 5.000 sat in all",
		"1 payout(s) in flight", fmt.Sprintf("payout %d: 5.000 sat of refund %d by bolt11, melt quote q0123456789a…", p.ID, r.ID),
		"wallet w0011223344556677"} {
		if !strings.Contains(out, want) {
			t.Errorf("refunds lacks %q:\n%s", want, out)
		}
	}
}
