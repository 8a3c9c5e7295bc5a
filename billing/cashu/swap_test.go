package cashu_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// mintProxy stands in front of the stack's mint and fails as a mint (or
// the way to it) does. Modes:
//
//	""             forward everything
//	"swap503"      answer a swap 503 without passing it on
//	"swapDown"     drop a swap's connection unsent; from then on "down"
//	"swapLost"     pass a swap on, then drop its answer (the mint did it)
//	"swapLostDown" as swapLost; from then on "down"
//	"down"         drop every connection (the mint is unreachable)
type mintProxy struct {
	srv  *httptest.Server
	mode atomic.Value
	rp   *httputil.ReverseProxy
}

func newMintProxy(t *testing.T) *mintProxy {
	t.Helper()
	u, err := url.Parse(stack.MintURL)
	if err != nil {
		t.Fatal(err)
	}
	m := &mintProxy{rp: httputil.NewSingleHostReverseProxy(u)}
	m.set("")
	m.srv = httptest.NewServer(m)
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mintProxy) set(mode string) { m.mode.Store(mode) }
func (m *mintProxy) URL() string     { return m.srv.URL }

func (m *mintProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mode := m.mode.Load().(string)
	swap := r.URL.Path == "/v1/swap"
	switch {
	case mode == "down":
		drop(w)
	case swap && mode == "swap503":
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
	case swap && mode == "swapDown":
		m.set("down")
		drop(w)
	case swap && (mode == "swapLost" || mode == "swapLostDown"):
		m.rp.ServeHTTP(httptest.NewRecorder(), r) // the mint swaps
		if mode == "swapLostDown" {
			m.set("down")
		}
		drop(w) // and its answer never arrives
	default:
		m.rp.ServeHTTP(w, r)
	}
}

func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// via rewrites a token of the stack's mint as one of mint (the same
// proofs, another URL).
func via(t *testing.T, token, mint string) string {
	t.Helper()
	pt, err := cashu.ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	pt.Mint = mint
	s, err := pt.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func callState(t *testing.T, l *ledger.Ledger, id vend.CallID) vend.CallState {
	t.Helper()
	c, err := l.Call(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c.State
}

// reconciled closes b and checks the wallet holds exactly what the ledger
// says it holds at mint.
func reconciled(t *testing.T, b *cashu.Backend, l *ledger.Ledger, wdir, mint string) cashu.MintBalance {
	t.Helper()
	b.Close()
	bals, err := cashu.Balances(context.Background(), wdir, []string{mint}, l)
	if err != nil {
		t.Fatal(err)
	}
	if bals[0].Difference() != 0 {
		t.Fatalf("wallet and ledger differ at %s: %+v", mint, bals[0])
	}
	verifyLedger(t, l)
	return bals[0]
}

// TestTransientMintErrorKeepsTheToken: a mint that fails a swap never
// burns the client's token nor leaves ecash the books do not know: the
// token is accepted again once the mint is back (its proofs were never
// spent), a swap the mint did although its answer was lost is booked, and
// a token really spent is still refused.
func TestTransientMintErrorKeepsTheToken(t *testing.T) {
	needStack(t)
	t.Parallel() // see "Parallel tests" in main_test.go
	ctx := context.Background()
	l := openLedger(t)
	mp := newMintProxy(t)
	dir := t.TempDir()
	b := newBackend(t, l, mp.URL(), dir, func(c *cashu.Config) { c.SafetyPoll = 200 * time.Millisecond })
	t.Cleanup(func() { b.Close() })
	assets := ledger.CashuAccount(mp.URL())
	retryable := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, cashu.ErrMintUnavailable) || !errors.Is(err, vend.ErrMintUnavailable) {
			t.Fatalf("want a retryable mint failure, got %v", err)
		}
	}
	swapping := func(t *testing.T, want int) {
		t.Helper()
		sw, err := l.SwappingTokens(ctx, nil)
		if err != nil || len(sw) != want {
			t.Fatalf("%d swaps of unknown outcome (%v), want %d", len(sw), err, want)
		}
	}

	t.Run("Swap503", func(t *testing.T) {
		tok := via(t, customerToken(t, 8), mp.URL())
		c1 := priced(t, l, 8)
		mp.set("swap503")
		_, err := b.AcceptToken(ctx, c1.ID, c1.Price, tok)
		mp.set("")
		retryable(t, err)
		if s := callState(t, l, c1.ID); s != vend.CallCanceled {
			t.Fatalf("call %s", s)
		}
		swapping(t, 0) // the mint said unspent: released at once
		c2 := priced(t, l, 8)
		if _, err := b.AcceptToken(ctx, c2.ID, c2.Price, tok); err != nil {
			t.Fatalf("the same token once the mint is back: %v", err)
		}
		if s := callState(t, l, c2.ID); s != vend.CallPaid {
			t.Fatalf("call %s", s)
		}
	})
	t.Run("SwapFailsAndMintDown", func(t *testing.T) {
		tok := via(t, customerToken(t, 8), mp.URL())
		c1 := priced(t, l, 8)
		mp.set("swapDown")
		_, err := b.AcceptToken(ctx, c1.ID, c1.Price, tok)
		retryable(t, err)
		swapping(t, 1) // nobody can tell yet whether it happened
		mp.set("")
		c2 := priced(t, l, 8)
		if _, err := b.AcceptToken(ctx, c2.ID, c2.Price, tok); err != nil {
			t.Fatalf("the same token once the mint is back: %v", err)
		}
		swapping(t, 0)
		if s := callState(t, l, c1.ID); s != vend.CallCanceled {
			t.Fatalf("first call %s", s)
		}
	})
	t.Run("AnswerLost", func(t *testing.T) {
		before := account(verifyLedger(t, l), assets)
		tok := via(t, customerToken(t, 8), mp.URL())
		c := priced(t, l, 8)
		mp.set("swapLost")
		r, err := b.AcceptToken(ctx, c.ID, c.Price, tok)
		mp.set("")
		if err != nil || r.Payment.State != vend.PaymentSettled {
			t.Fatalf("a swap the mint did must settle: %+v %v", r, err)
		}
		if got := account(verifyLedger(t, l), assets) - before; got != 8_000 {
			t.Fatalf("assets grew %d", got)
		}
	})
	t.Run("AnswerLostAndMintDown", func(t *testing.T) {
		tok := via(t, customerToken(t, 8), mp.URL())
		c := priced(t, l, 8)
		mp.set("swapLostDown")
		_, err := b.AcceptToken(ctx, c.ID, c.Price, tok)
		retryable(t, err)
		swapping(t, 1)
		mp.set("")
		// Run asks the mint again: the swap happened, so it is booked,
		// and as the call never ran its money is owed back.
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- b.Run(rctx, nil) }()
		deadline := time.Now().Add(60 * time.Second)
		var r vend.Refund
		for {
			if r, err = l.CallRefund(ctx, c.ID); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no refund booked: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		swapping(t, 0)
		if r.State != vend.RefundOwed || r.Amount != 8_000 || callState(t, l, c.ID) != vend.CallCanceled {
			t.Fatalf("refund %+v, call %s", r, callState(t, l, c.ID))
		}
		// The same token now: it was spent (by that swap).
		c2 := priced(t, l, 8)
		if _, err := b.AcceptToken(ctx, c2.ID, c2.Price, tok); !errors.Is(err, vend.ErrProofSpent) {
			t.Fatalf("a token the mint swapped: %v", err)
		}
		// The refund is paid back as real ecash.
		paid, err := b.PayRefund(ctx, r)
		if err != nil || paid.State != vend.RefundPaid || paid.Token == "" {
			t.Fatalf("pay refund: %+v %v", paid, err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
		lo := openLedger(t)
		bo := newBackend(t, lo, stack.MintURL, t.TempDir())
		defer bo.Close()
		co := priced(t, lo, 8)
		if _, err := bo.AcceptToken(ctx, co.ID, co.Price, via(t, paid.Token, stack.MintURL)); err != nil {
			t.Fatalf("the refund token is not spendable: %v", err)
		}
	})
	t.Run("ReallySpent", func(t *testing.T) {
		tok := customerToken(t, 5)
		lo := openLedger(t)
		bo := newBackend(t, lo, stack.MintURL, t.TempDir())
		defer bo.Close()
		co := priced(t, lo, 5)
		if _, err := bo.AcceptToken(ctx, co.ID, co.Price, tok); err != nil {
			t.Fatal(err)
		}
		c := priced(t, l, 5)
		if _, err := b.AcceptToken(ctx, c.ID, c.Price, via(t, tok, mp.URL())); !errors.Is(err, cashu.ErrTokenSpent) {
			t.Fatalf("a spent token: %v", err)
		}
	})
	reconciled(t, b, l, filepath.Join(dir, "wallet"), mp.URL())
}

// The crash tests run capvend's backend in a child process (this test
// binary again) that SIGKILLs itself at a failpoint, on the real mint.
const crashEnv = "CAPVEND_CASHU_CRASH" // the failpoint step; the child's inputs in crashArgs

// crashChild is the child's side: it never returns.
func crashChild() {
	step := os.Getenv(crashEnv)
	var in struct {
		Ledger, Dir, Mint, Token string
		Call                     int64
		Price                    int64
		Op                       string // FailAfterPayout: the payout to make (payoutCrash)
		Refund                   int64
	}
	if err := json.Unmarshal([]byte(os.Getenv(crashEnv+"_ARGS")), &in); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	l, err := ledger.Open(ctx, in.Ledger, ledger.Options{MustExist: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	b, err := cashu.New(cashu.Config{Mints: []string{in.Mint}, WalletDir: in.Dir, AcceptTokens: true, MintQuotes: true,
		PollInterval: 100 * time.Millisecond, Failpoint: func(s string) {
			if s == step {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}}, l)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	switch step {
	case cashu.FailAfterSwap:
		_, err = b.AcceptToken(ctx, vend.CallID(in.Call), vend.Msat(in.Price), in.Token)
	case cashu.FailAfterMint:
		ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		err = b.Run(ctx, nil)
	case cashu.FailAfterPayout:
		err = payoutCrash(ctx, b, l, in.Op, in.Dir, in.Mint, vend.RefundID(in.Refund), func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
	}
	fmt.Fprintln(os.Stderr, "the failpoint was not reached:", err)
	os.Exit(3)
}

// crash runs the child until it kills itself at step.
func crash(t *testing.T, step string, args any) {
	t.Helper()
	raw, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+step, crashEnv+"_ARGS="+string(raw))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child did not die at %s by SIGKILL: %v\n%s", step, err, stderr.String())
	}
}

// TestCrashBetweenSwapAndRecordIsBooked: capvend is killed after the mint
// swapped a client's token and before the settlement was recorded. At the
// next start the mint says the proofs are spent: the settlement is booked
// and, the call never having run, its money is a refund owed to the
// client; the wallet and the ledger agree (no silent gain).
func TestCrashBetweenSwapAndRecordIsBooked(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "capvend.db")
	l, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	wdir := filepath.Join(dir, "wallet")
	c := priced(t, l, 8)
	crash(t, cashu.FailAfterSwap, map[string]any{"Ledger": path, "Dir": wdir, "Mint": stack.MintURL,
		"Token": customerToken(t, 8), "Call": c.ID, "Price": c.Price})
	if sw, _ := l.SwappingTokens(ctx, nil); len(sw) != 1 || sw[0].Payment.State != vend.PaymentOpen {
		t.Fatalf("before the restart: %+v", sw)
	}

	b := newBackend(t, l, stack.MintURL, dir)
	ev := newEvents()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(rctx, ev.report) }()
	deadline := time.Now().Add(60 * time.Second)
	var r vend.Refund
	for {
		if r, err = l.CallRefund(ctx, c.ID); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no settlement booked after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.State != vend.RefundOwed || r.Amount != 8_000 || r.Client != "token-test" {
		t.Fatalf("refund %+v", r)
	}
	ps, _ := l.CallPayments(ctx, c.ID)
	if len(ps) != 1 || ps[0].State != vend.PaymentSettled || callState(t, l, c.ID) != vend.CallCanceled {
		t.Fatalf("payment %+v, call %s", ps, callState(t, l, c.ID))
	}
	// The owed refund is paid as ecash from the swapped proofs.
	if paid, err := b.PayRefund(ctx, r); err != nil || paid.State != vend.RefundPaid {
		t.Fatalf("pay refund: %+v %v", paid, err)
	}
	cancel()
	<-done
	bal := reconciled(t, b, l, wdir, stack.MintURL)
	if bal.Ledger != 0 {
		t.Fatalf("after paying the refund the wallet should be empty: %+v", bal)
	}
}

// TestCrashBetweenMintAndRecordIsBooked: the mint-quote path. capvend is
// killed after minting a paid quote's ecash and before recording it; at the
// next start the quote is ISSUED at the mint and in the wallet: settled.
func TestCrashBetweenMintAndRecordIsBooked(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "capvend.db")
	l, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	wdir := filepath.Join(dir, "wallet")
	b1 := newBackend(t, l, stack.MintURL, dir)
	c := priced(t, l, 6)
	p, err := b1.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b1.Close()
	if err := pay(ctx, p.Bolt11); err != nil {
		t.Fatal(err)
	}
	crash(t, cashu.FailAfterMint, map[string]any{"Ledger": path, "Dir": wdir, "Mint": stack.MintURL})
	if got, _ := l.Payment(ctx, p.Ref); got.State != vend.PaymentOpen {
		t.Fatalf("before the restart the payment is %s", got.State)
	}
	b2 := newBackend(t, l, stack.MintURL, dir)
	ev := newEvents()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b2.Run(rctx, ev.report) }()
	ev.wait(t, p.Ref, vend.PaymentSettled, 60*time.Second)
	cancel()
	<-done
	if bal := reconciled(t, b2, l, wdir, stack.MintURL); bal.Ledger != 6_000 {
		t.Fatalf("booked %+v", bal)
	}
}

// failTools is one tool, "demo_fail", whose upstream is unreachable.
type failTools struct{}

func (failTools) Tools() []vend.Item {
	return []vend.Item{{Name: "demo_fail", Server: "demo", UpstreamName: "fail", InputSchema: json.RawMessage(`{"type":"object"}`)}}
}
func (failTools) CallTool(context.Context, vend.Item, json.RawMessage, json.RawMessage, func(json.RawMessage)) (json.RawMessage, error) {
	return nil, errors.New("connection refused")
}

// TestFailedTokenCallGetsEcashBack: a call paid with a Cashu token whose
// tool fails gets its money back at once as a Cashu token made by the
// wallet, in the error; the payout is booked; the token is real ecash.
func TestFailedTokenCallGetsEcashBack(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l := openLedger(t)
	dir := t.TempDir()
	b := newBackend(t, l, stack.MintURL, dir)
	book, err := pricing.NewBook(map[string]map[string]pricing.Rule{"demo": {"fail": {Price: 5_000}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := vend.New(vend.Config{Ledger: l, Backends: []vend.PaymentBackend{b}, Tools: failTools{}, Prices: book, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- v.Run(rctx) }()
	_, err = v.CallItem(ctx, vend.CallRequest{Transport: "test", Client: "alice", RequestID: "1", Name: "demo_fail",
		Arguments: json.RawMessage(`{}`), CashuToken: customerToken(t, 5)})
	var re *vend.RefundError
	if !errors.As(err, &re) || !errors.Is(err, vend.ErrUpstream) || re.Refund.Owed || re.Refund.Amount != 5 || re.Refund.Cashu == "" {
		t.Fatalf("want a refund paid as ecash, got %v", err)
	}
	owed, _ := l.Refunds(ctx, false)
	all, _ := l.Refunds(ctx, true)
	if len(owed) != 0 || len(all) != 1 || all[0].Method != vend.RefundCashu || all[0].Client != "alice" {
		t.Fatalf("refunds %+v", all)
	}
	cancel()
	<-done
	reconciled(t, b, l, filepath.Join(dir, "wallet"), stack.MintURL)

	lo := openLedger(t)
	bo := newBackend(t, lo, stack.MintURL, t.TempDir())
	defer bo.Close()
	co := priced(t, lo, 5)
	if _, err := bo.AcceptToken(ctx, co.ID, co.Price, re.Refund.Cashu); err != nil {
		t.Fatalf("the refund token is not spendable: %v", err)
	}
}

// owedLND books a failed call paid by a plain LND invoice: its refund is
// owed to the client, to invoice if it gave one.
func owedLND(t *testing.T, l *ledger.Ledger, sats int64, invoice string) vend.Refund {
	t.Helper()
	ctx := context.Background()
	n := callSeq.Add(1)
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "bob", RequestID: fmt.Sprint("lnd-", n),
		Server: "suite", Name: "paid_echo", ArgsHash: strings.Repeat("ab", 32), Price: vend.Msat(sats * 1000), RefundInvoice: invoice})
	if err != nil {
		t.Fatal(err)
	}
	ref := fmt.Sprintf("%064x", n)
	if _, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref,
		Amount: c.Price, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: c.Price}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "tool failed"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, c.ID, "tool failed"); err != nil {
		t.Fatal(err)
	}
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPayOwedRefunds: refunds owed for LND payments are paid from the Cashu
// wallet, once: to the bolt11 the client gave (a melt; the customer's node
// receives it), never one asking more than owed, or as a token.
func TestPayOwedRefunds(t *testing.T) {
	needStack(t)
	ctx := context.Background()
	l := openLedger(t)
	b, wdir := holdingEcash(t, l, 40)
	b.Close()
	mints := []string{stack.MintURL}

	inv, err := stack.InvoiceOn(ctx, testnet.Customer, 5, "refund")
	if err != nil {
		t.Fatal(err)
	}
	r1 := owedLND(t, l, 5, inv.PaymentRequest)
	big, _ := stack.InvoiceOn(ctx, testnet.Customer, 6, "too much")
	if _, _, err := cashu.PayRefundInvoice(ctx, wdir, mints, "", r1.ID, big.PaymentRequest, l); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("an invoice above the refund: %v", err)
	}
	before, err := customerBalance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paid, res, err := cashu.PayRefundInvoice(ctx, wdir, mints, "", r1.ID, "", l)
	if err != nil || paid.State != vend.RefundPaid || paid.Method != vend.RefundBolt11 || res.Preimage == "" || paid.Paid != 5_000 {
		t.Fatalf("pay to the client's invoice: %+v %+v %v", paid, res, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, _ := customerBalance(ctx) // msat
		if after-before == 5_000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the customer's node got %d msat, want 5000", after-before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, _, err := cashu.PayRefundInvoice(ctx, wdir, mints, "", r1.ID, "", l); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("paid twice: %v", err)
	}

	r2 := owedLND(t, l, 3, "")
	if _, _, err := cashu.PayRefundInvoice(ctx, wdir, mints, "", r2.ID, "", l); !errors.Is(err, cashu.ErrNoRefundInvoice) {
		t.Fatalf("no invoice: %v", err)
	}
	tokPaid, err := cashu.PayRefundToken(ctx, wdir, mints, "", r2.ID, l)
	if err != nil || tokPaid.State != vend.RefundPaid || tokPaid.Token == "" {
		t.Fatalf("pay as a token: %+v %v", tokPaid, err)
	}
	if _, err := cashu.PayRefundToken(ctx, wdir, mints, "", r2.ID, l); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("token paid twice: %v", err)
	}
	if owed, _ := l.Refunds(ctx, false); len(owed) != 0 {
		t.Fatalf("owed %+v", owed)
	}
	bals, err := cashu.Balances(ctx, wdir, mints, l)
	if err != nil || bals[0].Difference() != 0 {
		t.Fatalf("balances %+v %v", bals, err)
	}
	verifyLedger(t, l)

	lo := openLedger(t)
	bo := newBackend(t, lo, stack.MintURL, t.TempDir())
	defer bo.Close()
	co := priced(t, lo, 3)
	if _, err := bo.AcceptToken(ctx, co.ID, co.Price, tokPaid.Token); err != nil {
		t.Fatalf("the refund token is not spendable: %v", err)
	}
}
