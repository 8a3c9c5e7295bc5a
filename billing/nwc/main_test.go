package nwc_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/internal/racesupp"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/teststack"
	"github.com/capvend/capvend/vend"
)

func TestMain(m *testing.M) {
	racesupp.Reexec() // go-nostr and khatru race inside themselves: see package racesupp
	// The conformance suite's parallel subtests mostly wait (on the
	// wallet, on payments, on expiries): more of them at once than cores.
	teststack.Parallel(8)
	os.Exit(teststack.Run(m))
}

// serviceDir is testnet/nwc with its npm packages, or t skips (fails
// under CI) with the command that installs them.
func serviceDir(t testing.TB) string {
	t.Helper()
	dir, err := testnet.NWCServiceDir()
	if errors.Is(err, testnet.ErrNWCNotInstalled) {
		skip.Missing(t, "the NWC wallet service (node and testnet/nwc's npm packages)", testnet.NWCInstall)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// wallet is an NWC wallet service in front of the shared stack's vendor
// node, listening on a relay of the test's own (the stack is shared: its
// relay carries other tests' events).
type wallet struct {
	*testnet.NWCInfo
	stack *testnet.Stack
	relay *testkit.GatedRelay
}

// startWallet starts a wallet service for t (skipping in -short mode and
// without the service), on a gated relay whose Gated URL is what the
// connections name.
func startWallet(t testing.TB) *wallet {
	t.Helper()
	s := teststack.Need(t)
	dir := serviceDir(t)
	n, ok := s.Node(testnet.Vendor)
	if !ok {
		t.Fatal("no vendor node")
	}
	relay := testkit.NewGatedRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The service listens on the relay's open URL (the wallet stays
	// reachable); capvend reaches it through the gate the test cuts.
	info, err := testnet.StartNWC(ctx, testnet.NWCOptions{Node: n, Relay: relay.Open, Dir: t.TempDir(), ServiceDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := info.Stop(); err != nil {
			t.Log(err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(info.Log)
			t.Logf("the wallet service's log:\n%s", b)
		}
	})
	return &wallet{NWCInfo: info, stack: s, relay: relay}
}

// uri returns connection name's URI with its relay replaced by relay.
func (w *wallet) uri(t testing.TB, name, relay string) nwc.URI {
	t.Helper()
	u, err := nwc.ParseURI(w.URIs[name])
	if err != nil {
		t.Fatal(err)
	}
	u.Relays = []string{relay}
	return u
}

// TestWalletService proves the wallet service the other tests trust as
// capvend's counterpart against Alby's own NWCClient (prove.mjs): plain
// and hold invoices, their notifications, lookups, listing, a NOT_FOUND,
// a payment of the customer's invoice (pay_invoice, found again as an
// outgoing transaction; paying it twice fails), and a connection without
// hold invoices refused them.
func TestWalletService(t *testing.T) {
	w := startWallet(t)
	dir := serviceDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inv, err := w.stack.InvoiceOn(ctx, testnet.Customer, 7, "a refund paid by the wallet service")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "prove.mjs"), w.URIs[testnet.NWCHold], w.URIs[testnet.NWCPlain],
		inv.PaymentRequest, hex.EncodeToString(inv.RHash))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	before, err := w.stack.Balance(ctx, testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	var pays sync.WaitGroup
	var saw []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		word, rest, _ := strings.Cut(sc.Text(), " ")
		saw = append(saw, word)
		t.Log(sc.Text())
		if word == "PAY" {
			bolt11 := strings.Trim(rest, `"`)
			pays.Add(1)
			go func() { // a hold invoice's payment returns once it is settled or canceled
				defer pays.Done()
				w.stack.Pay(ctx, bolt11)
			}()
		}
	}
	err = cmd.Wait()
	pays.Wait()
	if err != nil {
		t.Fatalf("prove.mjs: %v\n%s", err, stderr.String())
	}
	if got := strings.Join(saw, " "); got != "INFO PAY RECEIVED PAY SETTLED PAY CANCELED LISTED NOTFOUND PAID RESTRICTED DONE" {
		t.Fatalf("prove.mjs said %s", got)
	}
	after, err := w.stack.Balance(ctx, testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	// 21 sat plain and 30 sat held and settled left the customer; the
	// canceled 40 sat came back (direct channel: no fee); the wallet paid
	// the customer's 7 sat invoice once.
	if before-after != 44_000 {
		t.Fatalf("customer balance moved by %d msat, want 44000", before-after)
	}
}

// harness runs the conformance suite on connection name of a wallet
// service of its own.
func harness(t *testing.T, name string, hold bool) billingtest.Harness {
	w := startWallet(t)
	return billingtest.Harness{
		// The suite's proxy sits between the backend and the relay:
		// cutting it cuts the wallet's relay connection.
		Server: strings.TrimPrefix(w.relay.Open, "ws://"),
		Open: func(t *testing.T, l *ledger.Ledger, addr, dir string) vend.PaymentBackend {
			c, err := nwc.NewClient(w.uri(t, name, "ws://"+addr), nwc.ClientConfig{Timeout: 20 * time.Second, ConnectTimeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			b, err := nwc.New(context.Background(), c, l, nwc.Config{Hold: hold, Sweep: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Pay: func(ctx context.Context, bolt11 string) error {
			_, err := w.stack.Pay(ctx, bolt11)
			return err
		},
		CustomerBalance: func(ctx context.Context) (int64, error) {
			return w.stack.Balance(ctx, testnet.Customer)
		},
		// Longer than LND's 3 s: a request goes to the wallet through the
		// relay and the wallet service and back, which took over 3 s on a
		// loaded 2-core machine (the invoice had expired when it arrived).
		Expiry: 10 * time.Second,
		Done: func(t *testing.T, l *ledger.Ledger, b vend.PaymentBackend, refs ...string) {
			recorded(t, w, b, refs...)
		},
	}
}

// recorded is the suite's Harness.Done for NWC: once the wallet service
// has published the payment_received notification of each of refs (its
// log says so), a request answered through b's connection after that
// means the notifications were delivered to it (the relay keeps the
// order of what it sends one connection), and the backend takes them
// next.
func recorded(t *testing.T, w *wallet, b vend.PaymentBackend, refs ...string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; { // a hang guard
		log, err := os.ReadFile(w.Log)
		if err != nil {
			t.Fatal(err)
		}
		missing := 0
		for _, ref := range refs {
			if !strings.Contains(string(log), " payment_received "+ref) {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wallet service notified %d of %d settlements in 60 s", len(refs)-missing, len(refs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := b.(*nwc.Backend).Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tx nwc.Transaction
	if err := c.Do(ctx, nwc.MethodLookupInvoice, map[string]any{"payment_hash": refs[len(refs)-1]}, &tx); err != nil &&
		!errors.Is(err, nwc.ErrUnreachable) {
		t.Fatalf("lookup: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the last notification's ledger write
}

func TestConformanceHold(t *testing.T) {
	billingtest.Run(t, harness(t, testnet.NWCHold, true))
}

func TestConformancePlain(t *testing.T) {
	billingtest.Run(t, harness(t, testnet.NWCPlain, true))
}
