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

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// TestRefundsListsWhatIsOwedToWhom: the list, its total (the same as
// ledger balance's), paid refunds with --all, and the pay command's
// refusals, offline.
func TestRefundsListsWhatIsOwedToWhom(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	l, err := ledger.Open(context.Background(), db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	capvendtest.OwedRefund(t, l, 1, "mcp-session-alice", "lnbcrt50n1pjexampleinvoiceforalicexyz")
	paid := capvendtest.OwedRefund(t, l, 2, "npub-bob", "")
	if _, err := l.PayRefund(context.Background(), paid.ID, vend.RefundPayout{Method: vend.RefundCashu, MintURL: "http://mint",
		Paid: 5_000, Token: "cashuBpaid"}); err != nil {
		t.Fatal(err)
	}
	capvendtest.OwedRefund(t, l, 3, "mcp-session-carol", "")
	l.Close()

	out, errOut, code := run(t, nil, "refunds", "--db", db)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"mcp-http mcp-session-alice", "lnbcrt50n1pjexampleinvoi…", "mcp-session-carol", "5.000", "owed",
		"the tool failed", "2 refund(s) owed, 10.000 sat in all"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "npub-bob") || strings.Contains(out, "cashuBpaid") {
		t.Errorf("the list shows a paid refund or a token:\n%s", out)
	}
	out, _, _ = run(t, nil, "refunds", "--db", db, "--all")
	if !strings.Contains(out, "npub-bob") || !strings.Contains(out, "paid by cashu") || strings.Contains(out, "cashuBpaid") {
		t.Errorf("--all:\n%s", out)
	}
	out, _, _ = run(t, nil, "ledger", "balance", "--db", db)
	if !strings.Contains(out, "refunds owed (capvend refunds)") || !strings.Contains(out, "10.000 sat") {
		t.Errorf("ledger balance disagrees with the list:\n%s", out)
	}
	out, _, code = run(t, nil, "ledger", "verify", "--db", db)
	if code != 0 {
		t.Fatalf("verify:\n%s", out)
	}

	for _, args := range [][]string{
		{"refunds", "frob"},
		{"refunds", "pay"},
		{"refunds", "pay", "x"},
		{"refunds", "pay", "1", "2"},
		{"refunds", "pay", "1", "--cashu", "--invoice", "lnbcrt1x"},
		{"refunds", "pay", "1", "--nope"},
	} {
		if _, errOut, code := run(t, nil, args...); code != 2 || !strings.HasPrefix(errOut, "capvend: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	cfg := filepath.Join(dir, "capvend.yaml")
	os.WriteFile(cfg, []byte("ledger:\n  path: capvend.db\ncashu:\n  mints: [\"http://127.0.0.1:9/\"]\n  wallet_dir: wallet\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"refunds", "pay", "99", "--config", cfg}, "not found"},
		{[]string{"refunds", "pay", "3", "--config", cfg}, "the client gave no refund invoice: pass --invoice BOLT11 or --cashu"},
		{[]string{"refunds", "pay", fmt.Sprint(paid.ID), "--config", cfg, "--cashu"}, "refund already paid"},
		{[]string{"refunds", "pay", "1", "--config", cfg, "--invoice", "lnbcrt1junk"}, "invalid invoice"},
		// The mint is unreachable: nothing is paid or booked.
		{[]string{"refunds", "pay", "3", "--config", cfg, "--cashu"}, "cashu: mint unavailable"},
	} {
		_, errOut, code := run(t, nil, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.args, code, errOut, tc.want)
		}
	}
	out, _, _ = run(t, nil, "refunds", "--db", db)
	if !strings.Contains(out, "2 refund(s) owed") {
		t.Errorf("a refused payout changed the list:\n%s", out)
	}
}

// TestRefundsEndToEnd runs the real capvend binary on the regtest stack,
// over MCP HTTP: a failed call paid with a Cashu token gets its money back
// as ecash in the answer; one paid with a plain LND invoice is owed to the
// refund invoice the client gave, listed by `capvend refunds` and paid to
// the customer's node by `capvend refunds pay`, once; the books verify and
// the wallet reconciles.
func TestRefundsEndToEnd(t *testing.T) {
	s := needStack(t)
	ctx := context.Background()
	path, listen := writeServeConfig(t, s, serveOpts{cashu: true}) // LND plain invoices
	proc := startCapvend(t, path, capvendtest.Options{Process: true})
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	mint := func(sats uint64) string {
		tok, err := s.CashuMint(ctx, sats)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	// Ecash in the wallet for the payout below.
	if res, err := pc.CallMeta(t, "t_sha256", map[string]any{"text": "fund"}, map[string]any{"capvend/cashu": mint(21)}); err != nil || res.IsError {
		t.Fatalf("funding call: %v %v", res, err)
	}
	refundOf := func(res *mcp.CallToolResult) vend.RefundInfo {
		t.Helper()
		if res == nil || !res.IsError || res.Meta == nil {
			t.Fatalf("want an isError result with _meta, got %+v", res)
		}
		b, _ := json.Marshal(res.Meta.AdditionalFields[vend.MetaRefund])
		var info vend.RefundInfo
		if err := json.Unmarshal(b, &info); err != nil || info.ID == 0 {
			t.Fatalf("no refund in _meta %+v", res.Meta.AdditionalFields)
		}
		return info
	}
	res, err := pc.CallMeta(t, "t_always_fails", map[string]any{"text": "x"}, map[string]any{"capvend/cashu": mint(5)})
	if err != nil {
		t.Fatal(err)
	}
	if info := refundOf(res); info.Owed || info.Amount != 5 || !strings.HasPrefix(info.Cashu, "cashu") {
		t.Fatalf("Cashu-paid failure: refund %+v", info)
	}

	inv, err := s.InvoiceOn(ctx, testnet.Customer, 5, "my refund")
	if err != nil {
		t.Fatal(err)
	}
	res, err = pc.CallMeta(t, "t_always_fails", map[string]any{"text": "y"}, map[string]any{vend.MetaRefundInvoice: inv.PaymentRequest})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatalf("paying the invoice: %v", err)
	}
	owed := refundOf(res)
	if !owed.Owed || owed.Cashu != "" || owed.Amount != 5 {
		t.Fatalf("invoice-paid failure: refund %+v", owed)
	}
	proc.Stop() // the wallet is free once it stops

	out, errOut, code := run(t, nil, "refunds", "--config", path)
	if code != 0 || !strings.Contains(out, "1 refund(s) owed, 5.000 sat in all") || !strings.Contains(out, "mcp-http ") ||
		!strings.Contains(out, inv.PaymentRequest[:24]) {
		t.Fatalf("refunds (exit %d, %s):\n%s", code, errOut, out)
	}
	before, err := s.Balance(ctx, testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(owed.ID)
	out, errOut, code = run(t, nil, "refunds", "pay", id, "--config", path)
	if code != 0 || !strings.Contains(out, "paid: 5.000 sat") || !strings.Contains(out, "preimage") {
		t.Fatalf("refunds pay (exit %d, %s):\n%s", code, errOut, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, _ := s.Balance(ctx, testnet.Customer)
		if after-before == 5_000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the customer got %d msat, want 5000", after-before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, errOut, code := run(t, nil, "refunds", "pay", id, "--config", path); code != 1 || !strings.Contains(errOut, "already paid") {
		t.Fatalf("paid twice? exit %d: %s", code, errOut)
	}
	out, _, _ = run(t, nil, "refunds", "--config", path)
	if !strings.Contains(out, "no refunds owed") {
		t.Fatalf("after paying:\n%s", out)
	}
	out, _, _ = run(t, nil, "refunds", "--all", "--config", path)
	if strings.Count(out, "paid by ") != 2 {
		t.Fatalf("--all:\n%s", out)
	}
	if out, errOut, code := run(t, nil, "ledger", "verify", "--config", path); code != 0 {
		t.Fatalf("ledger verify: %s %s", out, errOut)
	}
	if out, errOut, code := run(t, nil, "cashu", "balance", "--config", path); code != 0 {
		t.Fatalf("cashu balance does not reconcile: %s %s", out, errOut)
	}
}

// TestServeSurvivesSIGKILLAfterSwap kills the real capvend binary after the
// mint swapped a client's token and before the settlement was recorded:
// at the next start the settlement is booked and, the call never having
// run, its money is a refund owed to the client; nothing is gained
// silently (the wallet reconciles with the ledger).
func TestServeSurvivesSIGKILLAfterSwap(t *testing.T) {
	s := needStack(t)
	ctx := context.Background()
	path, listen := writeServeConfig(t, s, serveOpts{noLND: true, cashu: true})
	db := filepath.Join(filepath.Dir(path), "capvend.db")
	proc := startCapvend(t, path, capvendtest.Options{Process: true, Failpoint: "after_swap"})
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	tok, err := s.CashuMint(ctx, 21)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.CallMeta(t, "t_sha256", map[string]any{"text": "crash"}, map[string]any{"capvend/cashu": tok}); err == nil {
		t.Fatal("the call succeeded although capvend was killed")
	}
	if code := proc.Wait(); code != capvendtest.ExitKilled {
		t.Fatalf("capvend did not die by SIGKILL: exit %d", code)
	}
	restarted := startCapvend(t, path, capvendtest.Options{Process: true})
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := capvendtest.WaitCall(t, l, vend.CallCanceled)
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := l.CallRefund(ctx, c.ID)
		if err == nil {
			if r.State != vend.RefundOwed || r.Amount != 21_000 || c.Executions != 0 {
				t.Fatalf("refund %+v, executions %d", r, c.Executions)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refund after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	restarted.Stop()
	if out, errOut, code := run(t, nil, "ledger", "verify", "--db", db); code != 0 {
		t.Fatalf("ledger verify: %s %s", out, errOut)
	}
	if out, errOut, code := run(t, nil, "cashu", "balance", "--config", path); code != 0 {
		t.Fatalf("cashu balance does not reconcile: %s %s", out, errOut)
	}
	if out, _, _ := run(t, nil, "refunds", "--config", path); !strings.Contains(out, "1 refund(s) owed, 21.000 sat in all") {
		t.Fatalf("refunds:\n%s", out)
	}
}
