package cashu_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// stack is the regtest stack of this test binary: started by TestMain, or,
// with CAPVEND_TEST_STACK=DIR, a stack already running in DIR (started with
// `capvend testnet up --dir DIR`), which is left running.
var stack *testnet.Stack

var (
	verbose = flag.Bool("cashu.log", false, "log the backends' lines to stderr")
	nut17   = flag.Bool("cashu.nut17", true, "also run the conformance suite with NUT-17 subscriptions (the stack's mint serves them behind a guard: testnet/mintws.go)")
)

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		crashChild() // a crash test's child process: see swap_test.go
	}
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // stack tests skip themselves
	}
	ctx := context.Background()
	if dir := os.Getenv("CAPVEND_TEST_STACK"); dir != "" {
		s, err := testnet.Load(dir, os.Stderr)
		if err != nil {
			log.Fatal(err)
		}
		stack = s
		code := m.Run()
		s.Release()
		os.Exit(code)
	}
	tmp, err := os.MkdirTemp("", "capvend-cashu-it-")
	if err != nil {
		log.Fatal(err)
	}
	exe, err := testnet.BuildCapvend(ctx, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		log.Fatal(err)
	}
	stack, err = testnet.Start(ctx, testnet.Options{Dir: filepath.Join(tmp, "stack"), Executable: exe, Progress: os.Stderr})
	if err != nil {
		os.RemoveAll(tmp)
		log.Fatal(err)
	}
	code := m.Run()
	if err := stack.Close(); err != nil {
		log.Print(err)
	}
	os.RemoveAll(tmp)
	os.Exit(code)
}

func needStack(t testing.TB) {
	t.Helper()
	if stack == nil {
		t.Skip("needs the regtest stack (not with -short)")
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if *verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newBackend opens a backend on mintURL with its wallet in dir.
func newBackend(t testing.TB, l vend.Ledger, mintURL, dir string, opts ...func(*cashu.Config)) *cashu.Backend {
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
	return stack.ChannelBalance(ctx, testnet.Customer)
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
			})
		})
	}
}

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
