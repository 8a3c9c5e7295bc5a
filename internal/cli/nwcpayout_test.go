package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// nwcRefundOwed serves with the NWC wallet's plain connection (plain
// invoices; pay_invoice granted) and has the customer pay a call of the
// failing tool, giving a 5 sat refund invoice of its node: the refund is
// owed. It returns the configuration, the stop of serve, the refund and
// the customer's invoice.
func nwcRefundOwed(t *testing.T, s *testnet.Stack) (path string, stop func(), refund vend.RefundInfo, inv string) {
	t.Helper()
	w := capvendtest.NWCWallet(t, s, s.RelayURL)
	_, nsec := capvendtest.ServerKey(t) // startCapvend waits for the Nostr front too
	path, listen := writeServeConfig(t, s, serveOpts{noLND: true, nwcURIFile: capvendtest.URIFile(t, w, testnet.NWCPlain), nsecFile: nsec})
	stop = startCapvend(t, path).Stop
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ri, err := s.InvoiceOn(ctx, testnet.Customer, 5, "my refund")
	if err != nil {
		t.Fatal(err)
	}
	res, err := pc.CallMeta(t, "t_always_fails", map[string]any{"text": "y"}, map[string]any{vend.MetaRefundInvoice: ri.PaymentRequest})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatalf("paying the wallet's invoice: %v", err)
	}
	if res == nil || !res.IsError || res.Meta == nil {
		t.Fatalf("want an isError result with _meta, got %+v", res)
	}
	b, _ := json.Marshal(res.Meta.AdditionalFields[vend.MetaRefund])
	if err := json.Unmarshal(b, &refund); err != nil || !refund.Owed || refund.Amount != 5 || refund.Cashu != "" {
		t.Fatalf("the refund of a failed call paid by the wallet's plain invoice: %s", b)
	}
	return path, stop, refund, ri.PaymentRequest
}

// TestNWCRefundsEndToEnd: a seller paid into its wallet by NWC, without a
// Cashu wallet. A priced call paid with the wallet's plain invoice fails:
// its refund is owed to the refund invoice the client gave. `capvend
// refunds pay ID --nwc` (while capvend serves) has the wallet pay the
// customer's invoice: the customer's balance rises by exactly the
// refund, the refund is paid once (a second payment is refused), the
// wallet's account in the books takes back what it paid, and the books
// verify and reconcile.
func TestNWCRefundsEndToEnd(t *testing.T) {
	s := needStack(t)
	path, stop, owed, inv := nwcRefundOwed(t, s)
	db := filepath.Join(filepath.Dir(path), "capvend.db")
	id := fmt.Sprint(owed.ID)

	out, errOut, code := run(t, nil, "refunds", "--config", path)
	if code != 0 || !strings.Contains(out, "1 refund(s) owed, 5.000 sat in all") || !strings.Contains(out, inv[:24]) {
		t.Fatalf("refunds (exit %d, %s):\n%s", code, errOut, out)
	}
	// Refused before anything is paid: a connection that is not
	// configured, an invoice asking more than is owed.
	if _, errOut, code := run(t, nil, "refunds", "pay", id, "--nwc=coinos", "--config", path); code != 2 || !strings.Contains(errOut, "no such NWC connection") {
		t.Fatalf("an unknown connection: exit %d: %s", code, errOut)
	}
	ctx := context.Background()
	big, err := s.InvoiceOn(ctx, testnet.Customer, 6, "too much")
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, nil, "refunds", "pay", id, "--nwc", "--invoice", big.PaymentRequest, "--config", path); code != 1 ||
		!strings.Contains(errOut, "more than the 5.000 sat owed: refused") {
		t.Fatalf("an invoice for more than owed: exit %d: %s", code, errOut)
	}

	before := capvendtest.CustomerBalance(t, s)
	out, errOut, code = run(t, nil, "refunds", "pay", id, "--nwc", "--config", path)
	if code != 0 || !strings.Contains(out, "paid: 5.000 sat") || !strings.Contains(out, "from the wallet of nwc") || !strings.Contains(out, "preimage") {
		t.Fatalf("refunds pay --nwc (exit %d, %s):\n%s", code, errOut, out)
	}
	capvendtest.WaitCustomerGot(t, s, before, 5_000)
	if _, errOut, code := run(t, nil, "refunds", "pay", id, "--nwc", "--config", path); code != 1 || !strings.Contains(errOut, "already paid") {
		t.Fatalf("paid twice? exit %d: %s", code, errOut)
	}
	out, _, _ = run(t, nil, "refunds", "--all", "--config", path)
	if !strings.Contains(out, "paid by bolt11 (5.000) from nwc") {
		t.Fatalf("--all:\n%s", out)
	}
	if out, errOut, code := run(t, nil, "ledger", "verify", "--config", path); code != 0 {
		t.Fatalf("ledger verify: %s %s", out, errOut)
	}
	time.Sleep(time.Second) // no second payment is coming
	if after := capvendtest.CustomerBalance(t, s); after-before != 5_000 {
		t.Fatalf("the customer got %d msat in all, want 5000", after-before)
	}

	stop()
	l := ledgerkit.OpenVerified(t, db)
	acc, err := l.AccountBalances(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	wallet, fees := acc[ledger.NWCAccount(vend.BackendNWC)], acc[ledger.NWCFeeAccount(vend.BackendNWC)]
	if wallet != -fees || acc[ledger.AccountRefunds] != 0 { // 5 sat in, 5 sat and its fee out
		t.Fatalf("the wallet's account %d, its fees %d, refunds owed %d", wallet, fees, acc[ledger.AccountRefunds])
	}
	capvendtest.Chdir(t, filepath.Dir(path))
	if out, errOut, code := run(t, nil, "reconcile", "--config", path); code != 0 || !strings.Contains(out, "the books agree") {
		t.Fatalf("reconcile exit %d:\n%s%s", code, out, errOut)
	}
}

// TestNWCRefundPaidNotBookedSurvivesSIGKILL kills the real capvend binary
// (`refunds pay ID --nwc`, the crash tests' build) after the wallet paid
// the customer's refund invoice and before the payout was booked: the
// payout stays reserved, listed in flight, and no other payer can take
// the refund; the next payout command on the connection learns from the
// wallet that it was paid, books it once, with its fee, and pays
// nothing again; the books verify.
func TestNWCRefundPaidNotBookedSurvivesSIGKILL(t *testing.T) {
	s := needStack(t)
	path, stop, owed, _ := nwcRefundOwed(t, s)
	stop() // the payout commands need no serve; its start would resolve the payout too
	id := fmt.Sprint(owed.ID)
	before := capvendtest.CustomerBalance(t, s)

	pay := startCapvend(t, path, capvendtest.Options{Args: []string{"refunds", "pay", id, "--nwc", "--config", path}, Process: true,
		Failpoint: nwc.FailAfterPayout})
	if code := pay.Wait(); code != capvendtest.ExitKilled {
		t.Fatalf("the payout command was not killed at %s: exit %d\n%s%s", nwc.FailAfterPayout, code, pay.Stdout(), pay.Stderr())
	}
	capvendtest.WaitCustomerGot(t, s, before, 5_000) // the wallet paid

	listed, errOut, code := run(t, nil, "refunds", "--config", path)
	if code != 0 || !strings.Contains(listed, "in flight") || !strings.Contains(listed, "through the NWC wallet") {
		t.Fatalf("refunds after the crash (exit %d, %s):\n%s", code, errOut, listed)
	}
	// The next payout command resolves it from the wallet's word: paid.
	_, errOut, code = run(t, nil, "refunds", "pay", id, "--nwc", "--config", path)
	if code != 1 || !strings.Contains(errOut, "already paid") {
		t.Fatalf("the next payout command: exit %d: %s", code, errOut)
	}
	listed, _, _ = run(t, nil, "refunds", "--all", "--config", path)
	if !strings.Contains(listed, "no refunds owed") && !strings.Contains(listed, "0 refund(s) owed") || strings.Contains(listed, "in flight") ||
		!strings.Contains(listed, "paid by bolt11 (5.000) from nwc") {
		t.Fatalf("refunds after the resolution:\n%s", listed)
	}
	if out, errOut, code := run(t, nil, "ledger", "verify", "--config", path); code != 0 {
		t.Fatalf("ledger verify: %s %s", out, errOut)
	}
	time.Sleep(time.Second)
	if after := capvendtest.CustomerBalance(t, s); after-before != 5_000 {
		t.Fatalf("the customer got %d msat in all, want 5000 (paid once)", after-before)
	}
}

// TestNWCCreditRefund: what is left of a credit account bought through
// the NWC wallet is paid back from it with `credit refund ACCOUNT --nwc
// --invoice`, exactly, once; an invoice asking more than the balance is
// refused before anything is paid; a connection that may not pay is
// refused, naming pay_invoice.
func TestNWCCreditRefund(t *testing.T) {
	s := needStack(t)
	w := capvendtest.NWCWallet(t, s, s.RelayURL)
	_, nsec := capvendtest.ServerKey(t)
	path, listen := writeServeConfig(t, s, serveOpts{noLND: true, credit: true, nwcURIFile: capvendtest.URIFile(t, w, testnet.NWCPlain), nsecFile: nsec})
	stop := startCapvend(t, path).Stop
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(11)) // the ten tools and capvend_topup
	// 30 sat of credit, paid into the wallet.
	res, err := pc.CallMeta(t, vend.TopUpTool, map[string]any{"sats": 30}, nil)
	if err != nil || res.IsError {
		t.Fatalf("top-up: %+v %v", res, err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatal(err)
	}
	credit := capvendtest.CreditMeta(t, res)
	stop()
	ctx := context.Background()
	big, err := s.InvoiceOn(ctx, testnet.Customer, 31, "too much")
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, nil, "credit", "refund", credit.Account, "--nwc", "--invoice", big.PaymentRequest, "--config", path); code != 1 ||
		!strings.Contains(errOut, "more than the 30.000 sat left: refused") {
		t.Fatalf("an invoice for more than the balance: exit %d: %s", code, errOut)
	}
	if _, errOut, code := run(t, nil, "credit", "refund", credit.Account, "--nwc", "--config", path); code != 2 || !strings.Contains(errOut, "--invoice") {
		t.Fatalf("no invoice: exit %d: %s", code, errOut)
	}
	// A receive-only connection may not pay.
	receive := strings.Replace(path, "capvend.yaml", "receive.yaml", 1)
	cfg, _ := os.ReadFile(path)
	uri := capvendtest.URIFile(t, w, testnet.NWCReceive)
	if err := os.WriteFile(receive, []byte(strings.Replace(string(cfg), "nwc:\n  uri_file: ", "nwc:\n  wallets:\n    - name: receive\n      uri_file: "+uri+"\n  uri_file: ", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	inv, err := s.InvoiceOn(ctx, testnet.Customer, 0, "my credit back") // no amount: the whole balance
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, nil, "credit", "refund", credit.Account, "--nwc=receive", "--invoice", inv.PaymentRequest, "--config", receive); code != 1 ||
		!strings.Contains(errOut, "pay_invoice") {
		t.Fatalf("a connection without pay_invoice: exit %d: %s", code, errOut)
	}
	before := capvendtest.CustomerBalance(t, s)
	out, errOut, code := run(t, nil, "credit", "refund", credit.Account, "--nwc", "--invoice", inv.PaymentRequest, "--config", path)
	if code != 0 || !strings.Contains(out, "refunded: 30.000 sat") {
		t.Fatalf("credit refund --nwc (exit %d, %s):\n%s", code, errOut, out)
	}
	capvendtest.WaitCustomerGot(t, s, before, 30_000)
	if _, _, code := run(t, nil, "credit", "refund", credit.Account, "--nwc", "--invoice", inv.PaymentRequest, "--config", path); code == 0 {
		t.Fatal("an empty account was paid out again")
	}
	if out, errOut, code := run(t, nil, "ledger", "verify", "--config", path); code != 0 {
		t.Fatalf("ledger verify: %s %s", out, errOut)
	}
}
