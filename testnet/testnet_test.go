package testnet_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/procstat"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/teststack"
	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"
	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/routerrpc"
	"github.com/nbd-wtf/go-nostr"
)

func TestMain(m *testing.M) {
	// TestStack, TestShared and TestStackPostgres run in parallel, all
	// three at once on two cores: they mostly wait on their stacks.
	teststack.Parallel(3)
	os.Exit(skip.Run(m))
}

// logWriter turns progress lines into t.Log lines.
type logWriter struct {
	t  *testing.T
	mu sync.Mutex
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestStack brings the whole regtest stack up and exercises every part of
// it the way capvend's integration tests will: Lightning payments both
// ways, ecash minting and swapping at the mint, a Nostr round trip. It
// then shuts the stack down and checks that no process of it remains.
// A cold run builds btcd and lnd (minutes); run with -timeout 60m.
func TestStack(t *testing.T) {
	skip.Short(t, "starts a regtest stack")
	// Parallel with TestShared and TestStackPostgres: each brings up its
	// own processes in its own directory on ports it reserved, and waits
	// on them (blocks, channel confirmations) most of the time.
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()

	exe, err := testnet.BuildCapvend(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A short dir: the stack's paths end up in logs and error messages.
	dir, err := os.MkdirTemp("", "capvend-testnet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("stack dir kept for inspection: %s", dir)
		}
	})

	start := time.Now()
	s, err := testnet.Start(ctx, testnet.Options{Dir: dir, Executable: exe, Progress: &logWriter{t: t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stack up in %s", time.Since(start).Round(100*time.Millisecond))
	procs := s.Processes()
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close()
		}
	})
	for _, p := range procs {
		t.Logf("%-13s pid %-7d rss %4d MiB", p.Name, p.PID, p.RSSKB/1024)
		if !p.Alive {
			t.Fatalf("%s (pid %d) is not running after Start", p.Name, p.PID)
		}
	}

	t.Run("info file", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(dir, testnet.InfoFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{s.MintURL, s.RelayURL, "admin.macaroon", "invoice.macaroon", "tls.cert"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s lacks %q", testnet.InfoFile, want)
			}
		}
		for _, name := range []string{testnet.Vendor, testnet.Customer, testnet.MintNode} {
			n, ok := s.Node(name)
			if !ok || len(n.Pubkey) != 66 || !strings.HasPrefix(n.RPCHost, "127.0.0.1:") {
				t.Errorf("node %s: %+v", name, n)
			}
		}
		if !strings.HasPrefix(s.MintURL, "http://127.0.0.1:") || !strings.HasPrefix(s.RelayURL, "ws://127.0.0.1:") {
			t.Errorf("endpoints not on loopback: %s %s", s.MintURL, s.RelayURL)
		}
	})

	t.Run("start again is idempotent", func(t *testing.T) {
		again, err := testnet.Start(ctx, testnet.Options{Dir: dir, Executable: exe})
		if err != nil {
			t.Fatal(err)
		}
		defer again.Release()
		if again.Info.Btcd.PID != s.Info.Btcd.PID {
			t.Errorf("second Start replaced btcd: pid %d, want %d", again.Info.Btcd.PID, s.Info.Btcd.PID)
		}
	})

	t.Run("customer pays vendor invoice with SendPaymentV2", func(t *testing.T) {
		inv, err := s.Invoice(ctx, 2100, "test")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := s.Conn(testnet.Customer)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := routerrpc.NewRouterClient(conn).SendPaymentV2(ctx, &routerrpc.SendPaymentRequest{
			PaymentRequest: inv.PaymentRequest, TimeoutSeconds: 30, FeeLimitSat: 100,
		})
		if err != nil {
			t.Fatal(err)
		}
		for {
			p, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if p.Status == lnrpc.Payment_FAILED {
				t.Fatalf("payment failed: %s", p.FailureReason)
			}
			if p.Status == lnrpc.Payment_SUCCEEDED {
				break
			}
		}
		vc, err := s.Conn(testnet.Vendor)
		if err != nil {
			t.Fatal(err)
		}
		got, err := lnrpc.NewLightningClient(vc).LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: inv.RHash})
		if err != nil {
			t.Fatal(err)
		}
		if got.State != lnrpc.Invoice_SETTLED || got.AmtPaidSat != 2100 {
			t.Fatalf("vendor invoice: state %s, paid %d sat", got.State, got.AmtPaidSat)
		}
	})

	t.Run("vendor refunds customer", func(t *testing.T) {
		cc, err := s.Conn(testnet.Customer)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := lnrpc.NewLightningClient(cc).AddInvoice(ctx, &lnrpc.Invoice{Value: 1000, Memo: "refund"})
		if err != nil {
			t.Fatal(err)
		}
		vc, err := s.Conn(testnet.Vendor)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := routerrpc.NewRouterClient(vc).SendPaymentV2(ctx, &routerrpc.SendPaymentRequest{
			PaymentRequest: inv.PaymentRequest, TimeoutSeconds: 30, FeeLimitSat: 100, NoInflightUpdates: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		p, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if p.Status != lnrpc.Payment_SUCCEEDED {
			t.Fatalf("refund: %s %s", p.Status, p.FailureReason)
		}
	})

	t.Run("Pay helper", func(t *testing.T) {
		inv, err := s.Invoice(ctx, 42, "pay helper")
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Pay(ctx, inv.PaymentRequest)
		if err != nil {
			t.Fatal(err)
		}
		if r.PaymentHash != hex.EncodeToString(inv.RHash) || len(r.Preimage) != 64 {
			t.Fatalf("result %+v", r)
		}
		if _, err := s.Pay(ctx, inv.PaymentRequest); err == nil {
			t.Fatal("paying the same invoice twice succeeded")
		}
		// The mint node can pay the customer too (melt path).
		back, err := s.InvoiceOn(ctx, testnet.Customer, 21, "melt")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PayFrom(ctx, testnet.MintNode, back.PaymentRequest); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("mint ecash and swap it at the mint", func(t *testing.T) {
		tok, err := s.CashuMint(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tok, "cashuB") {
			t.Fatalf("token %.20q is not cashuB", tok)
		}
		parsed, err := cashu.DecodeToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		if parsed.Amount() != 100 || parsed.Mint() != s.MintURL {
			t.Fatalf("token: %d sat at %s", parsed.Amount(), parsed.Mint())
		}
		w, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(t.TempDir(), "w"), CurrentMintURL: s.MintURL})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Shutdown()
		got, err := w.Receive(parsed, false) // swaps the proofs at the mint
		if err != nil {
			t.Fatal(err)
		}
		if got != 100 || w.GetBalance() != 100 {
			t.Fatalf("received %d, balance %d; want 100", got, w.GetBalance())
		}
		w2, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(t.TempDir(), "w2"), CurrentMintURL: s.MintURL})
		if err != nil {
			t.Fatal(err)
		}
		defer w2.Shutdown()
		if _, err := w2.Receive(parsed, false); err == nil {
			t.Fatal("the mint accepted a spent token")
		}
	})

	t.Run("relay round trip", func(t *testing.T) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		// go-nostr's Connection and envelopes rather than its Relay:
		// v0.52.3's Relay races with itself when a connection ends
		// (reported by -race), which would fail this test under -race.
		conn, err := nostr.NewConnection(rctx, s.RelayURL, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		send := func(env nostr.Envelope) {
			b, err := env.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.WriteMessage(rctx, b); err != nil {
				t.Fatal(err)
			}
		}
		recv := func() nostr.Envelope {
			var buf bytes.Buffer
			if err := conn.ReadMessage(rctx, &buf); err != nil {
				t.Fatal(err)
			}
			env, err := nostr.NewMessageParser().ParseMessage(buf.String())
			if err != nil {
				t.Fatalf("unparsable relay message %q: %v", buf.String(), err)
			}
			return env
		}

		sk := nostr.GeneratePrivateKey()
		ev := nostr.Event{Kind: 1, CreatedAt: nostr.Now(), Content: "capvend testnet " + strconv.FormatInt(time.Now().UnixNano(), 10), Tags: nostr.Tags{}}
		if err := ev.Sign(sk); err != nil {
			t.Fatal(err)
		}
		send(&nostr.EventEnvelope{Event: ev})
		if ok, _ := recv().(*nostr.OKEnvelope); ok == nil || !ok.OK || ok.EventID != ev.ID {
			t.Fatalf("publish not acknowledged: %+v", ok)
		}
		send(&nostr.ReqEnvelope{SubscriptionID: "rt", Filters: nostr.Filters{{IDs: []string{ev.ID}}}})
		var got []nostr.Event
		for done := false; !done; {
			switch e := recv().(type) {
			case *nostr.EventEnvelope:
				got = append(got, e.Event)
			case *nostr.EOSEEnvelope:
				done = true
			default:
				t.Fatalf("unexpected %T from relay", e)
			}
		}
		if len(got) != 1 || got[0].Content != ev.Content || !got[0].CheckID() {
			t.Fatalf("read back %v", got)
		}
		if ok, err := got[0].CheckSignature(); !ok || err != nil {
			t.Fatalf("signature of read-back event: %v %v", ok, err)
		}
	})

	t.Run("mine", func(t *testing.T) {
		h0, err := s.BlockHeight(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Mine(ctx, 3); err != nil {
			t.Fatal(err)
		}
		h1, err := s.BlockHeight(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if h1 != h0+3 {
			t.Fatalf("height %d after mining 3 on %d", h1, h0)
		}
	})

	t.Run("Load reattaches", func(t *testing.T) {
		l, err := testnet.Load(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		if !l.Running() || l.MintURL != s.MintURL {
			t.Fatalf("loaded stack: running %v, mint %s", l.Running(), l.MintURL)
		}
	})

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, p := range procs {
		if isRunning(p.PID) {
			t.Errorf("%s (pid %d) still running after Close", p.Name, p.PID)
		}
	}
	if left := processesUnder(dir); len(left) > 0 {
		t.Errorf("processes still referring to %s: %v", dir, left)
	}
	if _, err := testnet.Load(dir, nil); !errors.Is(err, testnet.ErrNotRunning) {
		t.Errorf("Load after Close: %v, want ErrNotRunning", err)
	}
}

// isRunning reports whether pid exists and is not a zombie (a container's
// init may never reap the stack's exited processes).
func isRunning(pid int) bool {
	f := procstat.Fields(pid)
	return len(f) > 2 && f[2] != "Z" && f[2] != "X"
}

// processesUnder lists live processes whose command line mentions dir.
func processesUnder(dir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !isRunning(pid) {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if bytes.Contains(cmd, []byte(dir)) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}
