package ledger_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// nwcPayout is a payout from the wallet of connection alby, paying a
// bolt11 whose payment hash is hash(h).
func nwcPayout(kind vend.PayoutKind, h string, amount vend.Msat) vend.NewPayout {
	return vend.NewPayout{Kind: kind, Method: vend.RefundBolt11, NWC: vend.NWCBackend("alby"), Wallet: "nwc:0123456789abcdef",
		Amount: amount, Invoice: "lnbcrt210n1" + h, Quote: hash(h)}
}

// TestNWCRefundPayout: a refund paid from an NWC wallet is reserved with
// the invoice's payment hash (one payer: a second is refused), then
// booked in one entry out of the wallet's assets:lightning:<connection>,
// its routing fee an expense of the connection; the refund records what
// paid it.
func TestNWCRefundPayout(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, _ := failRefunded(t, l, 1, "lnbcrt210n1client", 0)
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	np := nwcPayout(vend.PayoutRefund, "r1", 21_000)
	np.Refund = r.ID
	p, err := l.ReservePayout(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	if p.NWC != np.NWC || p.MintURL != "" || p.Quote != np.Quote {
		t.Fatalf("reserved %+v", p)
	}
	if _, err := l.ReservePayout(ctx, np); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("a second payer: %v", err)
	}
	left, err := l.Payouts(ctx, false)
	if err != nil || len(left) != 1 || left[0].NWC != np.NWC || left[0].Wallet != np.Wallet || left[0].From() != "nwc:alby" {
		t.Fatalf("in flight: %+v %v", left, err)
	}
	mustVerify(t, l)
	if p, err = l.BookPayout(ctx, p.ID, 1_000); err != nil || p.State != vend.PayoutBooked || p.Fee != 1_000 {
		t.Fatalf("book: %+v %v", p, err)
	}
	got, _ := l.CallRefund(ctx, c.ID)
	if got.State != vend.RefundPaid || got.Method != vend.RefundBolt11 || got.Ref != np.Quote || got.PaidFrom != "nwc:alby" || got.Fee != 1_000 {
		t.Fatalf("the refund after its payout: %+v", got)
	}
	if a := accountBalance(t, l, ledger.NWCAccount(np.NWC)); a != -22_000 {
		t.Fatalf("%s %s, want -22000", ledger.NWCAccount(np.NWC), a)
	}
	if f := accountBalance(t, l, ledger.NWCFeeAccount(np.NWC)); f != 1_000 || ledger.NWCFeeAccount(np.NWC) != "expenses:fees:nwc:alby" {
		t.Fatalf("%s %s", ledger.NWCFeeAccount(np.NWC), f)
	}
	if a := accountBalance(t, l, ledger.AccountRefunds); a != 0 {
		t.Fatalf("refunds owed %s", a)
	}
	mustVerify(t, l)
}

// TestNWCCreditPayoutReleasedThenPaid: a credit payout from an NWC wallet
// the wallet did not pay is released (the balance comes back); the same
// invoice can then be paid by a new payout, but no payment hash pays two
// payouts in flight or booked.
func TestNWCCreditPayoutReleasedThenPaid(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	np := nwcPayout(vend.PayoutCredit, "c1", 60_000)
	np.Account = acctA
	p, err := l.ReservePayout(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	if got := balance(t, l, acctA); got != 40_000 {
		t.Fatalf("balance in flight %s", got)
	}
	other := np
	other.Amount = 1_000
	if _, err := l.ReservePayout(ctx, other); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("the same payment hash twice in flight: %v", err)
	}
	if _, err := l.ReleasePayout(ctx, p.ID, "INSUFFICIENT_BALANCE"); err != nil {
		t.Fatal(err)
	}
	if got := balance(t, l, acctA); got != 100_000 {
		t.Fatalf("balance after the release %s", got)
	}
	p, err = l.ReservePayout(ctx, np)
	if err != nil {
		t.Fatalf("the released invoice paid again: %v", err)
	}
	if _, err := l.BookPayout(ctx, p.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ReservePayout(ctx, other); !errors.Is(err, vend.ErrPayoutInFlight) {
		t.Fatalf("a booked payment hash reserved again: %v", err)
	}
	if a := creditInfo(t, l, acctA); a.Balance != 40_000 || a.Reserved != 0 {
		t.Fatalf("credit %+v", a)
	}
	if a := accountBalance(t, l, ledger.NWCAccount(np.NWC)); a != -60_000 {
		t.Fatalf("wallet %s", a)
	}
	mustVerify(t, l)
}

// TestNWCPayoutRulesAreSchemaRules: the ledger and the schema refuse an
// NWC payout that is not a bolt11 paid by its payment hash from one
// named connection; verify catches a booked one whose fee was changed
// around the schema.
func TestNWCPayoutRulesAreSchemaRules(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	for _, tc := range []struct {
		name string
		edit func(np *vend.NewPayout)
	}{
		{"a token", func(np *vend.NewPayout) { np.Method = vend.RefundCashu }},
		{"a withdrawal", func(np *vend.NewPayout) { np.Kind = vend.PayoutWithdrawal }},
		{"no payment hash", func(np *vend.NewPayout) { np.Quote = "melt-quote" }},
		{"a bad connection name", func(np *vend.NewPayout) { np.NWC = "nwc:Alby Hub" }},
		{"a mint too", func(np *vend.NewPayout) { np.MintURL = payoutMint }},
		{"no wallet", func(np *vend.NewPayout) { np.Wallet = "" }},
		{"a mint named like a connection", func(np *vend.NewPayout) { np.NWC, np.MintURL = "", "nwc:alby" }},
	} {
		np := nwcPayout(vend.PayoutCredit, tc.name, 1_000)
		np.Account = acctA
		tc.edit(&np)
		if _, err := l.ReservePayout(ctx, np); err == nil {
			t.Errorf("%s: reserved", tc.name)
		}
	}
	c, _ := failRefunded(t, l, 2, "", 0)
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	row := func(kind, conn, wallet, quote string) string {
		q := "NULL"
		if quote != "" {
			q = "'" + quote + "'"
		}
		ref := "NULL"
		if kind == "refund" {
			ref = fmt.Sprint(r.ID)
		}
		return fmt.Sprintf(`INSERT INTO payouts (kind, refund_id, method, mint_url, wallet, amount_msat, invoice, quote, created_at)
			VALUES ('%s', %s, 'bolt11', '%s', '%s', 1000, 'lnbcrt10n1', %s, 0)`, kind, ref, conn, wallet, q)
	}
	for _, tc := range []struct{ name, q string }{
		{"a payment hash that is none", row("refund", "nwc:alby", "w", "melt-quote")},
		{"no payment hash at all", row("refund", "nwc:alby", "w", "")},
		{"an upper-case payment hash", row("refund", "nwc:alby", "w", strings.ToUpper(hash("u")))},
		{"a bad connection name", row("refund", "nwc:A B", "w", hash("x"))},
		{"no wallet", row("refund", "nwc:alby", "", hash("x"))},
		{"a withdrawal from an NWC wallet", row("withdrawal", "nwc", "w", hash("w"))},
	} {
		if err := l.ExecForTest(ctx, tc.q); err == nil {
			t.Errorf("%s: the schema allowed it", tc.name)
		}
	}
	// The same row, well formed, is what ReservePayout writes.
	must(t, l.ExecForTest(ctx, row("refund", "nwc:alby", "w", hash("x"))))
	left, err := l.Payouts(ctx, false)
	if err != nil || len(left) != 1 || left[0].NWC != "nwc:alby" {
		t.Fatalf("the well-formed row: %+v %v", left, err)
	}
	if _, err := l.ReleasePayout(ctx, left[0].ID, "test"); err != nil {
		t.Fatal(err)
	}

	np := nwcPayout(vend.PayoutCredit, "ok", 10_000)
	np.Account = acctA
	p, err := l.ReservePayout(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.BookPayout(ctx, p.ID, 500); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, l)
	must(t, l.BypassForTest(ctx, []string{"payouts_state_machine"}, "UPDATE payouts SET fee_msat = 0 WHERE id = ?", p.ID))
	rep, err := l.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := "each booked NWC payout took its amount and fee out of its connection's wallet, the fee an expense"
	if got := failedChecks(rep); strings.Join(got, "\n") != want {
		t.Fatalf("failed checks %q, want %q", got, want)
	}
}

// TestNWCPayoutsExportBalanced: a ledger whose NWC wallet received a
// payment and paid a refund (with a fee) and a credit payout back exports
// to Beancount and hledger files their own tools accept, balanced.
func TestNWCPayoutsExportBalanced(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	topUp(t, l, acctA, 1, 100)
	// A call paid into the NWC wallet, its tool failed: a refund owed.
	nc := newCall(7)
	c, _, err := l.RecordCall(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	pay := newPayment(7)
	pay.Backend, pay.Kind = vend.NWCBackend("alby"), vend.KindWalletInvoice
	if _, err := l.RecordPayment(ctx, c.ID, pay); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: pay.Ref, Amount: pay.Amount}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	must(t, l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte("{}")}, "tool failed"))
	must(t, l.Refund(ctx, c.ID, "tool failed"))
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	rp := nwcPayout(vend.PayoutRefund, "refund", 20_500) // an invoice for less than owed: the rest stays income
	rp.Refund = r.ID
	credit := nwcPayout(vend.PayoutCredit, "credit", 30_000)
	credit.Account = acctA
	for i, np := range []vend.NewPayout{rp, credit} {
		p, err := l.ReservePayout(ctx, np)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.BookPayout(ctx, p.ID, vend.Msat(1_000+i*7)); err != nil {
			t.Fatal(err)
		}
	}
	mustVerify(t, l)

	dir := t.TempDir()
	export := func(f, name string) string {
		path := filepath.Join(dir, name)
		var b bytes.Buffer
		if err := l.Export(ctx, &b, ledger.ExportOptions{Format: f}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	t.Run("beancount", func(t *testing.T) {
		beanCheck := requireTool(t, "bean-check")
		file := export(ledger.FormatBeancount, "capvend.beancount")
		if out, err := exec.Command(beanCheck, file).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Fatalf("bean-check: %v\n%s", err, out)
		}
	})
	t.Run("hledger", func(t *testing.T) {
		hledger := requireTool(t, "hledger")
		file := export(ledger.FormatHledger, "capvend.journal")
		out, err := exec.Command(hledger, "-f", file, "balance", "--flat", "--no-elide", "-O", "csv").CombinedOutput()
		if err != nil {
			t.Fatalf("hledger balance: %v\n%s", err, out)
		}
		for _, want := range []string{
			// 21 sat received; 20.5 + 1 and 30 + 1.007 paid out.
			fmt.Sprintf(`"%s","-31.507 SAT"`, ledger.NWCAccount(vend.NWCBackend("alby"))),
			`"expenses:fees:nwc:alby","2.007 SAT"`,
			`"total","0"`,
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("hledger balance lacks %s:\n%s", want, out)
			}
		}
	})
}
