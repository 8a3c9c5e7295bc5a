package cashu_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/teststack"
	"github.com/capvend/capvend/vend"
)

// stack is the regtest stack these tests share with the other test
// binaries of the run (teststack), attached by the first test that needs
// it; with CAPVEND_TEST_STACK=DIR, the stack already running in DIR.
var stack *testnet.Stack

var (
	verbose = flag.Bool("cashu.log", false, "log the backends' lines to stderr")
	nut17   = flag.Bool("cashu.nut17", true, "also run the conformance suite with NUT-17 subscriptions (the stack's mint serves them behind a guard: testnet/mintws.go)")
)

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		crashChild() // a crash test's child process: see swap_test.go
	}
	// The conformance suite's parallel subtests mostly wait (on the mint,
	// on payments, on expiries): more of them at once than the cores.
	teststack.Parallel(16)
	os.Exit(teststack.Run(m))
}

// needStack attaches the shared stack to stack (skipping t in -short
// mode). Tests run one at a time, so the one write happens before any
// goroutine that reads stack starts.
func needStack(t testing.TB) {
	t.Helper()
	s := teststack.Need(t)
	if stack == nil {
		stack = s
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if *verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newBackend opens a backend on mintURL with its wallet in dir.
// holdingEcash starts a backend with its wallet in a fresh directory
// (returned) and has it take a customer's token for a call priced at each
// of sats: the wallet holds that ecash, booked in l. The backend stays
// open.
func holdingEcash(t testing.TB, l *ledger.Ledger, sats ...int64) (*cashu.Backend, string) {
	t.Helper()
	dir := t.TempDir()
	b := newBackend(t, l, stack.MintURL, dir)
	for _, s := range sats {
		c := priced(t, l, s)
		if _, err := b.AcceptToken(context.Background(), c.ID, c.Price, customerToken(t, uint64(s))); err != nil {
			t.Fatal(err)
		}
	}
	return b, filepath.Join(dir, "wallet")
}

func newBackend(t testing.TB, l cashu.Ledger, mintURL, dir string, opts ...func(*cashu.Config)) *cashu.Backend {
	t.Helper()
	cfg := cashu.Config{
		Mints:        []string{mintURL},
		WalletDir:    filepath.Join(dir, "wallet"),
		AcceptTokens: true,
		MintQuotes:   true,
		PollInterval: 100 * time.Millisecond,
		MaxBackoff:   time.Second,
		Log:          testLogger(t),
	}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := cashu.New(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pay(ctx context.Context, bolt11 string) error {
	_, err := stack.Pay(ctx, bolt11)
	return err
}

func customerBalance(ctx context.Context) (int64, error) {
	return stack.Balance(ctx, testnet.Customer)
}

func mintHostPort() string {
	return stack.Info.Mint.Listen
}

// TestConformance runs the shared backend suite: as configured by default
// (polling), and with NUT-17 subscriptions too (-cashu.nut17=false skips
// that). gonuts v0.4.2's mint panics when a subscriber's connection is cut
// while it sends (ConnectionDropped cuts it): the stack's mint is guarded
// against that (testnet/mintws.go), an operator's gonuts mint is not, which
// is why capvend does not subscribe by default.
func TestConformance(t *testing.T) {
	needStack(t)
	variants := map[string]func(*cashu.Config){"Poll": func(*cashu.Config) {}}
	if *nut17 {
		variants["NUT17"] = func(c *cashu.Config) { c.Websocket = true }
	}
	for name, opt := range variants {
		t.Run(name, func(t *testing.T) {
			// The variants share nothing but the mint and the customer's
			// node: each subtest has its own ledger, proxy and wallet.
			// They run in parallel, which billingtest.Run allows because
			// a Cashu backend has no hold invoices (the balance-measuring
			// hold test skips).
			t.Parallel()
			billingtest.Run(t, billingtest.Harness{
				Open: func(t *testing.T, l *ledger.Ledger, addr, dir string) vend.PaymentBackend {
					b := newBackend(t, l, "http://"+addr, dir, opt)
					t.Cleanup(func() { b.Close() })
					return b
				},
				Server:          mintHostPort(),
				Pay:             pay,
				CustomerBalance: customerBalance,
				Expiry:          2 * time.Second,
				Done:            checkedAgain,
			})
		})
	}
}

// Parallel tests: TestBalanceAndMelt, TestRecoversLostMintAnswer,
// TestQuoteMintedBySomeoneElse, TestStartsWithMintDown,
// TestTransientMintErrorKeepsTheToken and TestAcceptToken wait on the mint
// (polls, expiries, retries) and run in parallel with each other once the
// package's other tests are done (needStack first: it writes stack). Each
// has its own ledger, wallet directory, backend and proxies, and gets its
// ecash from a fresh wallet (Stack.CashuMint); none measures the customer's
// balance, which TestPayOwedRefunds does and so stays serial.

func openLedger(t testing.TB) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

var _ = fmt.Sprint

// checkedAgain is the conformance suite's Harness.Done for Cashu: a check
// of each quote that began after the call (or the backend no longer
// watches it, so nothing checks it again).
func checkedAgain(t *testing.T, _ *ledger.Ledger, b vend.PaymentBackend, refs ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a hang guard
	defer cancel()
	for _, ref := range refs {
		if err := b.(*cashu.Backend).CheckNow(ctx, ref); err != nil {
			t.Fatalf("quote %s was not checked again: %v", ref, err)
		}
	}
}
