package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// needL402Client skips the test when the stock L402 client of
// testdata/l402 cannot run, saying what to install; in CI, which installs
// it, it fails instead.
func needL402Client(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		skip.Missing(t, "stock L402 client not run: node is not installed", "apt-get install nodejs npm")
	}
	for _, pkg := range []string{"@getalby/lightning-tools", "@modelcontextprotocol/sdk"} {
		if _, err := os.Stat(filepath.Join("testdata", "l402", "node_modules", pkg)); err != nil {
			skip.Missing(t, "stock L402 client not run: its npm packages are not installed", "(cd cmd/capvend/testdata/l402 && npm ci)")
		}
	}
}

// TestStockL402ClientBuys: the official MCP TypeScript SDK client, its
// fetch wrapped by @getalby/lightning-tools' fetchWithL402 whose wallet
// pays through the customer LND's REST API, calls a priced tool of
// `capvend serve` (payments.http_402) with no capvend-specific code: the
// 402's L402 challenge is paid and the retry gets the result. The ledger
// holds one delivered call, run once, paid by one settled invoice whose
// amount is what the customer node sent for that payment hash; `ledger
// verify` passes.
func TestStockL402ClientBuys(t *testing.T) {
	needL402Client(t)
	s := needStack(t)
	url, db := serving(t, s, serveOpts{http402: true})
	customer, _ := s.Node(testnet.Customer)

	var out []byte
	for attempt := 0; ; attempt++ { // the upstream may still be connecting
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
		cmd := exec.CommandContext(ctx, "node", "client.mjs", url, "t_sha256", `{"text":"bought with L402"}`,
			customer.RESTHost, customer.AdminMacaroon)
		cmd.Dir = filepath.Join("testdata", "l402")
		cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+customer.TLSCert)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		var err error
		out, err = cmd.Output()
		cancel()
		if err == nil {
			break
		}
		if attempt == 20 || strings.Contains(string(out), "PREIMAGE") || strings.Contains(stderr.String(), "402:") {
			t.Fatalf("node client.mjs: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
		}
		time.Sleep(250 * time.Millisecond)
	}
	lines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		word, rest, _ := strings.Cut(l, " ")
		lines[word] = append(lines[word], rest)
	}
	want := fmt.Sprintf("%x", sha256.Sum256([]byte("bought with L402")))
	if len(lines["RESULT"]) != 1 || !strings.Contains(lines["RESULT"][0], want) || len(lines["PREIMAGE"]) != 1 {
		t.Fatalf("client output:\n%s", out)
	}
	pre, err := hex.DecodeString(lines["PREIMAGE"][0])
	if err != nil || len(pre) != 32 {
		t.Fatalf("preimage %q", lines["PREIMAGE"][0])
	}
	sum := sha256.Sum256(pre)
	hash := hex.EncodeToString(sum[:])

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := s.Conn(testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	pays, err := lnrpc.NewLightningClient(conn).ListPayments(ctx, &lnrpc.ListPaymentsRequest{Reversed: true, MaxPayments: 200})
	if err != nil {
		t.Fatal(err)
	}
	var sent *lnrpc.Payment
	for _, p := range pays.Payments {
		if p.PaymentHash == hash {
			sent = p
		}
	}
	if sent == nil || sent.Status != lnrpc.Payment_SUCCEEDED {
		t.Fatalf("the customer node has no succeeded payment %s: %+v", hash, sent)
	}

	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := l.Payment(ctx, hash)
	if err != nil {
		t.Fatalf("the ledger has no payment %s: %v", hash, err)
	}
	c, err := l.Call(ctx, p.CallID)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != vend.PaymentSettled || int64(p.Settled) != sent.ValueMsat || c.Price != 21_000 || c.State != vend.CallDelivered ||
		c.Executions != 1 {
		t.Fatalf("ledger: payment %s settled %d msat (customer sent %d + fee %d), call %s price %d, %d executions",
			p.State, p.Settled, sent.ValueMsat, sent.FeeMsat, c.State, c.Price, c.Executions)
	}
	calls, err := l.CallsIn(ctx, vend.CallStates()...)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range calls {
		ran += c.Executions
	}
	if ran != 1 {
		t.Fatalf("%d executions in the ledger, want 1", ran)
	}
	if stdout, stderr, code := run(t, nil, "ledger", "verify", "--config", filepath.Join(filepath.Dir(db), "capvend.yaml")); code != 0 {
		t.Fatalf("ledger verify: exit %d\n%s%s", code, stdout, stderr)
	}
}
