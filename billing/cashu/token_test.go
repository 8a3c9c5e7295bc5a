package cashu_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	gcashu "github.com/elnosh/gonuts/cashu"

	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

var callSeq atomic.Int64

// priced records a call of sats to pay for.
func priced(t testing.TB, l *ledger.Ledger, sats int64) vend.Call {
	t.Helper()
	n := callSeq.Add(1)
	h := sha256.Sum256([]byte(fmt.Sprint("args ", n)))
	c, _, err := l.RecordCall(context.Background(), vend.NewCall{
		Transport: "test", Client: "token-test", RequestID: fmt.Sprint("req-", n), Server: "suite", Name: "paid_echo",
		ArgsHash: hex.EncodeToString(h[:]), Price: vend.Msat(sats * 1000), Idempotent: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// customerToken mints sats of ecash at the stack's mint for the customer.
func customerToken(t testing.TB, sats uint64) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tok, err := stack.CashuMint(ctx, sats)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func verifyLedger(t testing.TB, l *ledger.Ledger) *ledger.Balance {
	t.Helper()
	r, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Fatalf("ledger verify failed: %+v", r)
	}
	bal, err := l.Balance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return bal
}

func account(bal *ledger.Balance, name string) vend.Msat {
	for _, a := range bal.Accounts {
		if a.Account == name {
			return a.Balance
		}
	}
	return 0
}

func revenue(bal *ledger.Balance) vend.Msat {
	var r vend.Msat
	for _, t := range bal.Tools {
		r += t.Revenue
	}
	return r
}

func TestAcceptToken(t *testing.T) {
	needStack(t)
	t.Parallel() // see "Parallel tests" in main_test.go
	ctx := context.Background()
	l := openLedger(t)
	b := newBackend(t, l, stack.MintURL, t.TempDir())
	t.Cleanup(func() { b.Close() })
	assets := ledger.CashuAccount(stack.MintURL)

	t.Run("Exact", func(t *testing.T) {
		c := priced(t, l, 8)
		r, err := b.AcceptToken(ctx, c.ID, c.Price, customerToken(t, 8))
		if err != nil {
			t.Fatal(err)
		}
		if r.Change != "" || r.Payment.State != vend.PaymentSettled || r.Payment.Kind != vend.KindToken || r.Payment.Settled != 8000 {
			t.Fatalf("receipt %+v", r)
		}
		if cl, _ := l.Call(ctx, c.ID); cl.State != vend.CallPaid {
			t.Fatalf("call is %s", cl.State)
		}
	})
	t.Run("OverpaidGetsChange", func(t *testing.T) {
		before := account(verifyLedger(t, l), assets)
		c := priced(t, l, 21)
		r, err := b.AcceptToken(ctx, c.ID, c.Price-500, customerToken(t, 50)) // price 20.5 sat: 21 kept
		if err != nil {
			t.Fatal(err)
		}
		ch, err := cashu.ParseToken(r.Change)
		if err != nil || ch.Amount != 29 {
			t.Fatalf("change %+v %v", ch, err)
		}
		bal := verifyLedger(t, l)
		if got := account(bal, assets) - before; got != 21_000 {
			t.Fatalf("assets grew by %d msat, want 21000 (only what was kept)", got)
		}
		// The change is real ecash: a fresh wallet can take it; and the
		// wallet that gave it holds exactly what the ledger says.
		lo := openLedger(t)
		wdir := t.TempDir()
		bo := newBackend(t, lo, stack.MintURL, wdir)
		co := priced(t, lo, 7)
		if _, err := bo.AcceptToken(ctx, co.ID, co.Price, customerToken(t, 20)); err != nil {
			t.Fatal(err)
		}
		bo.Close()
		bals, err := cashu.Balances(ctx, filepath.Join(wdir, "wallet"), []string{stack.MintURL}, lo)
		if err != nil {
			t.Fatal(err)
		}
		if bals[0].Wallet != 7_000 || bals[0].Difference() != 0 || bals[0].Pending != 13_000 {
			t.Fatalf("after giving change: %+v", bals[0])
		}
		l2 := openLedger(t)
		b2 := newBackend(t, l2, stack.MintURL, t.TempDir())
		defer b2.Close()
		c2 := priced(t, l2, 29)
		if _, err := b2.AcceptToken(ctx, c2.ID, c2.Price, r.Change); err != nil {
			t.Fatalf("redeeming the change: %v", err)
		}
	})

	bad := func(t *testing.T, tok string, price int64, want error) vend.Call {
		t.Helper()
		bal0 := verifyLedger(t, l)
		c := priced(t, l, price)
		r, err := b.AcceptToken(ctx, c.ID, c.Price, tok)
		if !errors.Is(err, want) {
			t.Fatalf("got %+v, %v; want %v", r, err, want)
		}
		bal := verifyLedger(t, l)
		if revenue(bal) != revenue(bal0) || account(bal, assets) != account(bal0, assets) {
			t.Fatal("a refused token was booked")
		}
		cl, _ := l.Call(ctx, c.ID)
		if cl.State == vend.CallPaid || cl.State == vend.CallExecuting {
			t.Fatalf("refused token left the call %s", cl.State)
		}
		return cl
	}

	t.Run("Replayed", func(t *testing.T) {
		tok := customerToken(t, 4)
		c := priced(t, l, 4)
		if _, err := b.AcceptToken(ctx, c.ID, c.Price, tok); err != nil {
			t.Fatal(err)
		}
		cl := bad(t, tok, 4, cashu.ErrTokenReplayed)
		if cl.State != vend.CallQuoted {
			t.Fatalf("replayed token: call is %s, want quoted (nothing recorded)", cl.State)
		}
		// Refused without contacting the mint: here it is unreachable.
		proxy := billingtest.NewProxy(t, mintHostPort())
		proxy.Cut()
		bDown := newBackend(t, l, "http://"+proxy.Addr(), t.TempDir())
		defer bDown.Close()
		pt, _ := cashu.ParseToken(tok)
		pt.Mint = "http://" + proxy.Addr()
		viaProxy, _ := pt.Serialize()
		c3 := priced(t, l, 4)
		if _, err := bDown.AcceptToken(ctx, c3.ID, c3.Price, viaProxy); !errors.Is(err, cashu.ErrTokenReplayed) {
			t.Fatalf("replay with the mint unreachable: %v", err)
		}
		pt.Proofs = pt.Proofs[:1]
		part, _ := pt.Serialize()
		if _, err := bDown.AcceptToken(ctx, c3.ID, c3.Price-1000, part); !errors.Is(err, cashu.ErrTokenReplayed) {
			t.Fatalf("partial replay with the mint unreachable: %v", err)
		}
		if !errors.Is(cashu.ErrTokenReplayed, vend.ErrProofSpent) {
			t.Fatal("ErrTokenReplayed does not match vend.ErrProofSpent")
		}
	})
	t.Run("PartlyReplayed", func(t *testing.T) {
		tok := customerToken(t, 3) // several proofs
		c := priced(t, l, 3)
		if _, err := b.AcceptToken(ctx, c.ID, c.Price, tok); err != nil {
			t.Fatal(err)
		}
		pt, _ := cashu.ParseToken(tok)
		if len(pt.Proofs) < 2 {
			t.Skip("the token has one proof")
		}
		pt.Proofs = pt.Proofs[:1]
		sub, err := pt.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		cl := bad(t, sub, int64(pt.Proofs[0].Amount), cashu.ErrTokenReplayed)
		if cl.State != vend.CallQuoted {
			t.Fatalf("call is %s, want quoted (nothing recorded)", cl.State)
		}
	})
	t.Run("DoubleSpent", func(t *testing.T) {
		tok := customerToken(t, 5)
		// Spent at another capvend first.
		l2 := openLedger(t)
		b2 := newBackend(t, l2, stack.MintURL, t.TempDir())
		defer b2.Close()
		c2 := priced(t, l2, 5)
		if _, err := b2.AcceptToken(ctx, c2.ID, c2.Price, tok); err != nil {
			t.Fatal(err)
		}
		cl := bad(t, tok, 5, cashu.ErrTokenSpent)
		if cl.State != vend.CallQuoted {
			t.Fatalf("call is %s, want quoted (nothing recorded)", cl.State)
		}
	})
	t.Run("ForeignMint", func(t *testing.T) {
		pt, _ := cashu.ParseToken(customerToken(t, 2))
		pt.Mint = "http://127.0.0.1:9"
		s, _ := pt.Serialize()
		bad(t, s, 2, cashu.ErrUntrustedMint)
	})
	t.Run("WrongUnit", func(t *testing.T) {
		pt, _ := cashu.ParseToken(customerToken(t, 2))
		v4, err := gcashu.NewTokenV4(pt.Proofs, stack.MintURL, gcashu.Sat, false)
		if err != nil {
			t.Fatal(err)
		}
		v4.Unit = "usd"
		s, _ := v4.Serialize()
		bad(t, s, 2, cashu.ErrWrongUnit)
	})
	t.Run("Underpaid", func(t *testing.T) {
		bad(t, customerToken(t, 4), 5, cashu.ErrTokenUnderpaid)
		if !errors.Is(cashu.ErrTokenUnderpaid, vend.ErrUnderpaid) {
			t.Fatal("ErrTokenUnderpaid does not match vend.ErrUnderpaid")
		}
	})
	t.Run("Malformed", func(t *testing.T) {
		for _, s := range []string{"", "cashuB", "cashuBnotbase64!", "lnbcrt10u1..."} {
			bad(t, s, 1, cashu.ErrMalformedToken)
		}
	})
	t.Run("Forged", func(t *testing.T) {
		// Well-formed proofs the mint never signed.
		pt, _ := cashu.ParseToken(customerToken(t, 2))
		for i := range pt.Proofs {
			pt.Proofs[i].Secret += "00"
		}
		s, _ := pt.Serialize()
		bad(t, s, 2, cashu.ErrMintRejected)
	})
}

// TestAcceptTokenConcurrently: one token handed over for eight calls at
// once is accepted exactly once; every other call is refused and nothing
// else is booked.
func TestAcceptTokenConcurrently(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l := openLedger(t)
	b := newBackend(t, l, stack.MintURL, t.TempDir())
	t.Cleanup(func() { b.Close() })
	tok := customerToken(t, 16)
	const n = 8
	calls := make([]vend.Call, n)
	for i := range calls {
		calls[i] = priced(t, l, 16)
	}
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			_, err := b.AcceptToken(ctx, calls[i].ID, calls[i].Price, tok)
			errs <- err
		}()
	}
	ok := 0
	for i := 0; i < n; i++ {
		err := <-errs
		switch {
		case err == nil:
			ok++
		case errors.Is(err, vend.ErrProofSpent): // replayed, or spent at the mint
		default:
			t.Errorf("unexpected refusal: %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d of %d concurrent acceptances succeeded, want 1", ok, n)
	}
	bal := verifyLedger(t, l)
	if revenue(bal) != 16_000 || account(bal, ledger.CashuAccount(stack.MintURL)) != 16_000 {
		t.Fatalf("booked revenue %d, assets %d; want 16 sat once", revenue(bal), account(bal, ledger.CashuAccount(stack.MintURL)))
	}
}
