package nwc_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// owedRefund books, in f's ledger only, a call of sats paid by a plain
// LND invoice whose tool failed: a refund owed to client, to invoice.
func owedRefund(t *testing.T, f *fixture, sats int64, invoice string) vend.Refund {
	t.Helper()
	ctx := context.Background()
	f.n++
	h := sha256.Sum256([]byte(fmt.Sprint("refund ", f.n)))
	c, _, err := f.l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "payout", RequestID: fmt.Sprint("r", f.n), Server: "s",
		Name: "fails", ArgsHash: hex.EncodeToString(h[:]), Price: vend.Msat(sats * 1000), RefundInvoice: invoice})
	if err != nil {
		t.Fatal(err)
	}
	ref := hex.EncodeToString(h[:])
	if _, err := f.l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref,
		Amount: c.Price, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { _, err := f.l.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: c.Price}); return err },
		func() error {
			_, err := f.l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
			return err
		},
		func() error {
			return f.l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte("{}")}, "the tool failed")
		},
		func() error { return f.l.Refund(ctx, c.ID, "the tool failed") },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := f.l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// customerInvoice is an invoice of sats (0: no amount) on the customer
// node, and its payment hash.
func customerInvoice(t *testing.T, w *wallet, sats int64) (string, string) {
	t.Helper()
	inv, err := w.stack.InvoiceOn(context.Background(), testnet.Customer, sats, "refund")
	if err != nil {
		t.Fatal(err)
	}
	return inv.PaymentRequest, hex.EncodeToString(inv.RHash)
}

func customerBalance(t *testing.T, w *wallet) int64 {
	t.Helper()
	b, err := w.stack.Balance(context.Background(), testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitCustomer waits until the customer's balance is want.
func waitCustomer(t *testing.T, w *wallet, want int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := customerBalance(t, w)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the customer's balance is %d msat, want %d", got, want)
		}
	}
}

func payer(t *testing.T, f *fixture, cfg nwc.PayerConfig) *nwc.Payer {
	t.Helper()
	p, err := nwc.NewPayer(f.c, f.l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustVerify(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	r, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		var b strings.Builder
		r.WriteTo(&b)
		t.Fatal(b.String())
	}
}

// TestPayRefundFromTheWallet: a call paid into the wallet with its plain
// invoice fails and its refund is owed; a connection not granted
// pay_invoice is refused (naming it), an invoice asking more than is
// owed is refused, both before anything is reserved; then the wallet
// pays the client's refund invoice once: the customer gets exactly the
// refund, the refund is paid from the connection and booked out of its
// wallet's account, and a second payment is refused.
func TestPayRefundFromTheWallet(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCPlain, w.relay.Open)
	f.run()
	ctx := context.Background()

	// The customer pays a 9 sat call into the wallet; the tool fails.
	c, p := f.request(t, 9, false)
	pay(t, w, p.Bolt11)
	f.ev.wait(t, p.Ref, vend.PaymentSettled)
	refundInv, refundHash := customerInvoice(t, w, 9)
	for _, step := range []func() error{
		func() error {
			_, err := f.l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
			return err
		},
		func() error {
			return f.l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte("{}")}, "the tool failed")
		},
		func() error { return f.l.Refund(ctx, c.ID, "the tool failed") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := f.l.CallRefund(ctx, c.ID)
	if err != nil || r.State != vend.RefundOwed || r.Amount != 9_000 || r.Backend != vend.BackendNWC {
		t.Fatalf("the refund owed: %+v %v", r, err)
	}

	// A receive-only connection may not pay.
	rc, err := nwc.NewClient(w.uri(t, testnet.NWCReceive, w.relay.Open), nwc.ClientConfig{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rp, err := nwc.NewPayer(rc, f.l, nwc.PayerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rp.PayRefund(ctx, r.ID, refundInv); !errors.Is(err, nwc.ErrMethodNotGranted) || !strings.Contains(err.Error(), "pay_invoice") {
		t.Fatalf("a connection without pay_invoice: %v", err)
	}
	big, _ := customerInvoice(t, w, 10)
	pp := payer(t, f, nwc.PayerConfig{})
	if _, _, err := pp.PayRefund(ctx, r.ID, big); err == nil || !strings.Contains(err.Error(), "more than the 9.000 sat owed: refused") {
		t.Fatalf("an invoice for more than owed: %v", err)
	}
	if all, _ := f.l.Payouts(ctx, true); len(all) != 0 {
		t.Fatalf("a refused payout was reserved: %+v", all)
	}

	if _, _, err := pp.PayRefund(ctx, r.ID, ""); !errors.Is(err, nwc.ErrNoRefundInvoice) { // the client gave none
		t.Fatalf("no refund invoice: %v", err)
	}
	before := customerBalance(t, w)
	got, res, err := pp.PayRefund(ctx, r.ID, refundInv)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != vend.RefundPaid || got.Paid != 9_000 || got.PaidFrom != "nwc" || got.Ref != refundHash || res.PaymentHash != refundHash {
		t.Fatalf("paid refund %+v, result %+v", got, res)
	}
	if sum := sha256.Sum256(mustHex(t, res.Preimage)); hex.EncodeToString(sum[:]) != refundHash {
		t.Fatalf("preimage %s does not prove the payment", res.Preimage)
	}
	waitCustomer(t, w, before+9_000)
	if _, _, err := pp.PayRefund(ctx, r.ID, refundInv); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("paid twice? %v", err)
	}
	accts, _ := f.l.AccountBalances(ctx, "")
	if w, fee := accts[ledger.NWCAccount(vend.BackendNWC)], accts[ledger.NWCFeeAccount(vend.BackendNWC)]; w != -res.Fee || fee != res.Fee {
		t.Fatalf("the wallet's account %d, fees %d; the payment's fee %d", w, fee, res.Fee)
	}
	mustVerify(t, f.l)
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPayCreditFromTheWallet: what is left of a credit account is paid
// to an invoice without an amount, exactly the balance, and booked once.
func TestPayCreditFromTheWallet(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCHold, w.relay.Open)
	ctx := context.Background()
	const account = "t0123456789abcdef01234567"
	c, _, err := f.l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "buyer", RequestID: "topup", Server: vend.CreditServer,
		Name: "topup", ArgsHash: strings.Repeat("ab", 32), Price: 6_000, Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.Repeat("cd", 32)
	for _, step := range []func() error{
		func() error { return f.l.BindTopUp(ctx, c.ID, account) },
		func() error {
			_, err := f.l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref,
				Amount: c.Price, ExpiresAt: time.Now().Add(time.Hour)})
			return err
		},
		func() error { _, err := f.l.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: c.Price}); return err },
		func() error {
			_, err := f.l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
			return err
		},
		func() error { return f.l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[]}`)}) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	inv, _ := customerInvoice(t, w, 0)
	before := customerBalance(t, w)
	cp, res, err := payer(t, f, nwc.PayerConfig{}).PayCredit(ctx, account, inv)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Paid != 6_000 || cp.NWC != vend.BackendNWC || res.Payout.State != vend.PayoutBooked {
		t.Fatalf("credit payout %+v %+v", cp, res)
	}
	waitCustomer(t, w, before+6_000)
	if bal, _ := f.l.CreditBalance(ctx, account); bal != 0 {
		t.Fatalf("balance after the payout %s", bal)
	}
	if _, _, err := payer(t, f, nwc.PayerConfig{}).PayCredit(ctx, account, inv); err == nil {
		t.Fatal("an empty account paid out again")
	}
	mustVerify(t, f.l)
}

// TestPayoutLeftInFlightIsResolvedAtStart: a payout command dies after
// the wallet paid and before the booking (the failpoint): the payout
// stays reserved (a second payer is refused); the backend, when it
// connects (capvend serve starting), asks the wallet and books it once,
// with the fee the wallet reports. A payout the wallet never heard of
// stays in flight until its invoice has expired, then is released.
func TestPayoutLeftInFlightIsResolvedAtStart(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCPlain, w.relay.Open)
	ctx := context.Background()
	inv, hash := customerInvoice(t, w, 5)
	r := owedRefund(t, f, 5, inv)
	before := customerBalance(t, w)
	crash := payer(t, f, nwc.PayerConfig{Failpoint: func(step string) {
		if step == nwc.FailAfterPayout {
			panic("killed " + step)
		}
	}})
	func() {
		defer func() {
			if v := recover(); v != "killed "+nwc.FailAfterPayout {
				t.Fatalf("the failpoint: %v", v)
			}
		}()
		crash.PayRefund(ctx, r.ID, "")
	}()
	waitCustomer(t, w, before+5_000)
	inFlight, err := f.l.Payouts(ctx, false)
	if err != nil || len(inFlight) != 1 || inFlight[0].Quote != hash || inFlight[0].NWC != vend.BackendNWC || inFlight[0].Wallet != nwc.WalletID(f.c) {
		t.Fatalf("in flight: %+v %v", inFlight, err)
	}
	if _, err := f.l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, Method: vend.RefundCashu,
		MintURL: "http://mint", Amount: 5_000}); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("a second payer of the refund: %v", err)
	}

	// A payout the wallet never heard of (its request lost).
	lost, lostHash := customerInvoice(t, w, 3)
	r2 := owedRefund(t, f, 3, lost)
	p2, err := f.l.ReservePayout(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r2.ID, Method: vend.RefundBolt11, NWC: vend.BackendNWC,
		Wallet: nwc.WalletID(f.c), Amount: 3_000, Invoice: lost, Quote: lostHash})
	if err != nil {
		t.Fatal(err)
	}

	f.run() // serve starts: the backend connects and resolves
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, _ := f.l.RefundByID(ctx, r.ID); got.State == vend.RefundPaid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the payout left in flight was not booked at start")
		}
	}
	got, _ := f.l.RefundByID(ctx, r.ID)
	if got.Paid != 5_000 || got.Ref != hash || got.PaidFrom != "nwc" {
		t.Fatalf("refund %+v", got)
	}
	if p, _ := f.l.PayoutByID(ctx, p2.ID); p.State != vend.PayoutReserved {
		t.Fatalf("the payout the wallet does not know is %s, want left in flight", p.State)
	}
	if _, left, err := payer(t, f, nwc.PayerConfig{}).Resolve(ctx); left != 1 || err == nil || !strings.Contains(err.Error(), "until the invoice expires") {
		t.Fatalf("resolve before the invoice expired: %d left, %v", left, err)
	}
	later := payer(t, f, nwc.PayerConfig{Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	ended, left, err := later.Resolve(ctx)
	if err != nil || left != 0 || len(ended) != 1 || ended[0].ID != p2.ID || ended[0].State != vend.PayoutReleased {
		t.Fatalf("resolve after the invoice expired: %+v %d %v", ended, left, err)
	}
	if got, _ := f.l.RefundByID(ctx, r2.ID); got.State != vend.RefundOwed {
		t.Fatalf("the released refund is %s", got.State)
	}
	waitCustomer(t, w, before+5_000) // paid once
	mustVerify(t, f.l)
}

// TestPayoutTheWalletCannotMakeIsReleased: an invoice the wallet cannot
// pay (more than its channels hold) is refused by the wallet; the payout
// is released, the refund stays owed, and the error says what to do.
func TestPayoutTheWalletCannotMakeIsReleased(t *testing.T) {
	w := startWallet(t)
	f := newFixture(t, w, testnet.NWCPlain, w.relay.Open)
	ctx := context.Background()
	const sats = 4_200_000 // above the vendor's side of its channel, below LND's largest invoice
	inv, _ := customerInvoice(t, w, sats)
	r := owedRefund(t, f, sats, inv)
	before := customerBalance(t, w)
	_, _, err := payer(t, f, nwc.PayerConfig{}).PayRefund(ctx, r.ID, "")
	if !errors.Is(err, nwc.ErrInsufficientBalance) && !errors.Is(err, nwc.ErrPaymentFailed) {
		t.Fatalf("an unpayable invoice: %v", err)
	}
	t.Log(err)
	if !strings.Contains(err.Error(), "nothing was paid") {
		t.Fatalf("the error does not say nothing was paid: %v", err)
	}
	all, _ := f.l.Payouts(ctx, true)
	if len(all) != 1 || all[0].State != vend.PayoutReleased {
		t.Fatalf("payouts %+v", all)
	}
	if got, _ := f.l.RefundByID(ctx, r.ID); got.State != vend.RefundOwed {
		t.Fatalf("refund %s", got.State)
	}
	if after := customerBalance(t, w); after != before {
		t.Fatalf("the customer's balance moved by %d", after-before)
	}
	mustVerify(t, f.l)
}
