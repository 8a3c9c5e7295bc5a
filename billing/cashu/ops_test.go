package cashu_test

import (
	"context"
	"errors"
	"testing"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

func TestBalanceAndMelt(t *testing.T) {
	needStack(t)
	t.Parallel() // see "Parallel tests" in main_test.go
	ctx := context.Background()
	l := openLedger(t)
	b, wdir := holdingEcash(t, l, 64, 40)
	// While the backend holds the wallet, the commands refuse to wait.
	if _, err := cashu.Balances(ctx, wdir, []string{stack.MintURL}, l); !errors.Is(err, cashu.ErrWalletBusy) {
		t.Fatalf("balance while the wallet is open: %v", err)
	}
	b.Close()

	bals, err := cashu.Balances(ctx, wdir, []string{stack.MintURL}, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(bals) != 1 || bals[0].Wallet != 104_000 || bals[0].Ledger != 104_000 || bals[0].Difference() != 0 {
		t.Fatalf("balances %+v", bals)
	}

	inv, err := stack.InvoiceOn(ctx, testnet.Customer, 50, "withdrawal")
	if err != nil {
		t.Fatal(err)
	}
	res, err := cashu.Melt(ctx, wdir, stack.MintURL, inv.PaymentRequest, l)
	if err != nil {
		t.Fatal(err)
	}
	if res.Amount != 50_000 || res.Preimage == "" {
		t.Fatalf("melt %+v", res)
	}
	bal := verifyLedger(t, l)
	if got := account(bal, "equity:withdrawals"); got != 50_000 {
		t.Fatalf("withdrawals %d", got)
	}
	if got := account(bal, ledger.CashuFeeAccount(stack.MintURL)); got != res.Fee {
		t.Fatalf("fee account %d, melt fee %d", got, res.Fee)
	}
	bals, err = cashu.Balances(ctx, wdir, []string{stack.MintURL}, l)
	if err != nil {
		t.Fatal(err)
	}
	if bals[0].Difference() != 0 || bals[0].Ledger != 104_000-50_000-res.Fee {
		t.Fatalf("after melt: %+v (fee %d)", bals, res.Fee)
	}
	// Paying the same invoice again is refused and books nothing.
	if _, err := cashu.Melt(ctx, wdir, stack.MintURL, inv.PaymentRequest, l); err == nil {
		t.Fatal("the same invoice was melted twice")
	}
	// More than the wallet holds.
	big, err := stack.InvoiceOn(ctx, testnet.Customer, 10_000, "too much")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cashu.Melt(ctx, wdir, stack.MintURL, big.PaymentRequest, l); !errors.Is(err, cashu.ErrInsufficientFunds) {
		t.Fatalf("melting more than the balance: %v", err)
	}
	if got := account(verifyLedger(t, l), "equity:withdrawals"); got != 50_000 {
		t.Fatalf("withdrawals %d after refused melts", got)
	}
	_ = vend.Msat(0)
}
