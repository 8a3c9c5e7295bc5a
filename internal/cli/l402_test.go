package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// runNodeClient runs `node script args...` in testdata/l402, trusting the
// customer node's TLS certificate, and returns its output lines by their
// first word. It tries again while the upstream may still be connecting
// (no payment made yet), and fails the test on any other error.
func runNodeClient(t *testing.T, customer testnet.NodeInfo, script string, args ...string) map[string][]string {
	t.Helper()
	var out []byte
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
		cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
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
		if attempt == 20 || strings.Contains(string(out), "PREIMAGE") || strings.Contains(string(out), "TOPUP") ||
			strings.Contains(stderr.String(), "402:") {
			t.Fatalf("node %s: %v\nstdout: %s\nstderr: %s", script, err, out, stderr.String())
		}
		time.Sleep(250 * time.Millisecond)
	}
	lines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		word, rest, _ := strings.Cut(l, " ")
		lines[word] = append(lines[word], rest)
	}
	return lines
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
	needNPM(t, "l402")
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{http402: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	customer, _ := s.Node(testnet.Customer)

	lines := runNodeClient(t, customer, "client.mjs", url, "t_sha256", `{"text":"bought with L402"}`, customer.RESTHost, customer.AdminMacaroon)
	want := fmt.Sprintf("%x", sha256.Sum256([]byte("bought with L402")))
	if len(lines["RESULT"]) != 1 || !strings.Contains(lines["RESULT"][0], want) || len(lines["PREIMAGE"]) != 1 {
		t.Fatalf("client output: %q", lines)
	}
	pre, err := hex.DecodeString(lines["PREIMAGE"][0])
	if err != nil || len(pre) != 32 {
		t.Fatalf("preimage %q", lines["PREIMAGE"][0])
	}
	sum := sha256.Sum256(pre)
	hash := hex.EncodeToString(sum[:])

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sent := capvendtest.CustomerPayment(t, s, hash)
	if sent.Status != lnrpc.Payment_SUCCEEDED {
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

// TestStockL402ClientBuysCredit: the same stock client (MCP TypeScript SDK,
// @getalby/lightning-tools' fetchWithL402 paying through the customer
// LND) buys an L402 credit token: capvend_topup for 100 sats is answered
// 402 with a credit macaroon, paid once; the client then passes the
// credential the library returned with every request, and five calls of
// t_sha256 at 21 sats follow with no further Lightning payment: four run,
// their balances counting down, the fifth is told the credit is
// exhausted. The customer's LND paid exactly the top-up; the ledger holds
// that settled invoice, 100 sats credited, four calls drawn and
// delivered, 16 sats left; `ledger verify` passes.
func TestStockL402ClientBuysCredit(t *testing.T) {
	needNPM(t, "l402")
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{http402: true, credit: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	customer, _ := s.Node(testnet.Customer)

	lines := runNodeClient(t, customer, "credit.mjs", url, "100", "t_sha256", "credit", "5", customer.RESTHost, customer.AdminMacaroon)
	if len(lines["TOPUP"]) != 1 || len(lines["PREIMAGE"]) != 1 || len(lines["PAID"]) != 1 || lines["PAID"][0] != "100" {
		t.Fatalf("client output: %q", lines)
	}
	var topUp struct {
		Meta map[string]vend.CreditInfo `json:"_meta"`
	}
	if err := json.Unmarshal([]byte(lines["TOPUP"][0]), &topUp); err != nil || topUp.Meta[vend.MetaCredit].BalanceMsat != 100_000 {
		t.Fatalf("top-up result %s: %v", lines["TOPUP"][0], err)
	}
	account := topUp.Meta[vend.MetaCredit].Account
	if len(lines["RESULT"]) != 4 || len(lines["ERROR"]) != 1 || !strings.Contains(lines["ERROR"][0], "exhausted") {
		t.Fatalf("calls: %q", lines)
	}
	for i, res := range lines["RESULT"] {
		var r struct {
			Meta map[string]vend.CreditInfo `json:"_meta"`
		}
		want := fmt.Sprintf("%x", sha256.Sum256(fmt.Appendf(nil, "credit %d", i)))
		if err := json.Unmarshal([]byte(res), &r); err != nil || !strings.Contains(res, want) ||
			r.Meta[vend.MetaCredit].Account != account || r.Meta[vend.MetaCredit].BalanceMsat != int64(100_000-21_000*(i+1)) {
			t.Fatalf("call %d: %s (%v)", i, res, err)
		}
	}

	// The wallet paid once (one preimage, 100 sats): the customer node's
	// payment of that hash is the top-up, exactly.
	pre, err := hex.DecodeString(lines["PREIMAGE"][0])
	if err != nil || len(pre) != 32 {
		t.Fatalf("preimage %q", lines["PREIMAGE"][0])
	}
	sum := sha256.Sum256(pre)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if sent := capvendtest.CustomerPayment(t, s, hex.EncodeToString(sum[:])); sent.Status != lnrpc.Payment_SUCCEEDED || sent.ValueMsat != 100_000 {
		t.Fatalf("the customer node paid %d msat (%s), want 100000: the top-up only", sent.ValueMsat, sent.Status)
	}
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := l.Payment(ctx, hex.EncodeToString(sum[:]))
	if err != nil {
		t.Fatalf("the ledger has no payment of the top-up: %v", err)
	}
	c, err := l.Call(ctx, p.CallID)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != vend.PaymentSettled || p.Settled != 100_000 || c.Server != vend.CreditServer || c.State != vend.CallDelivered {
		t.Fatalf("top-up: payment %s settled %d msat, call %s/%s %s", p.State, p.Settled, c.Server, c.Name, c.State)
	}
	accts, err := l.CreditAccounts(ctx, account)
	if err != nil {
		t.Fatal(err)
	}
	if a := accts[0]; a.Balance != 16_000 || a.TopUps != 100_000 || a.Draws != 84_000 || a.Calls != 4 || a.GiveBacks != 0 {
		t.Fatalf("credit account %+v", a)
	}
	if stdout, stderr, code := run(t, nil, "ledger", "verify", "--config", filepath.Join(filepath.Dir(db), "capvend.yaml")); code != 0 {
		t.Fatalf("ledger verify: exit %d\n%s%s", code, stdout, stderr)
	}
}
