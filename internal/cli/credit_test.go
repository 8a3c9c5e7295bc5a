package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/elnosh/gonuts/cashu"
	"github.com/mark3labs/mcp-go/client"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/vend"
)

// TestCreditOverMCPHTTPAndContextVM is the regtest proof of prepaid
// credit, on MCP HTTP (a credit token) and over ContextVM (the client's
// own pubkey account): each customer buys 100 sats (the customer LND node
// pays a mint quote), makes five calls at 21 sats (four run with no
// payment, the fifth is told to top up), and the operator refunds the 16
// sats left as a Cashu token. The customer's LND balance, the tokens and
// the ledger agree to the msat, and the ledger verifies.
func TestCreditOverMCPHTTPAndContextVM(t *testing.T) {
	s := needStack(t)
	server, nsec := capvendtest.ServerKey(t)
	path, listen := writeServeConfig(t, s, serveOpts{cashu: true, credit: true, nsecFile: nsec})
	stop := startCapvend(t, path).Stop
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(11)) // writeServeConfig's ten and capvend_topup
	before := capvendtest.CustomerBalance(t, s)

	// MCP HTTP, with a credit token.
	info := capvendtest.BuyCredit(t, pc, 100, "")
	if info.BalanceMsat != 100_000 || !strings.HasPrefix(info.Token, "cvc_") {
		t.Fatalf("after the top-up: %+v", info)
	}
	for i := range 5 {
		res, err := pc.CallMeta(t, "t_sha256", map[string]any{"text": fmt.Sprint("credit ", i)}, map[string]any{vend.MetaCredit: info.Token})
		if i == 4 {
			if err == nil || !strings.Contains(err.Error(), "Credit exhausted") {
				t.Fatalf("fifth call: %+v %v", res, err)
			}
			break
		}
		if err != nil || res.IsError {
			t.Fatalf("call %d: %+v %v", i, res, err)
		}
		if got := capvendtest.CreditMeta(t, res); got.BalanceMsat != int64(100_000-21_000*(i+1)) {
			t.Fatalf("call %d: credit %+v", i, got)
		}
	}
	select {
	case err := <-pc.Paid:
		t.Fatalf("a credit call was paid over Lightning (%v)", err)
	default:
	}

	// ContextVM, with the client's own pubkey account.
	c := dialContextVM(t, s.RelayURL, server)
	c.waitReady()
	c.waitNames("tools/list", vend.TopUpTool, "t_sha256")
	topUp := c.request(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"capvend_topup","arguments":{"sats":100},` +
		`"_meta":{"capvend/credit":true,"capvend/invoice_from":"cashu"}}}`)
	m, _, paid := c.untilPaid(s, topUp)
	if err := paid(); err != nil || m.Error != nil {
		t.Fatalf("ContextVM top-up: %s %+v %v", m.Result, m.Error, err)
	}
	var nostrAccount string
	for i := range 5 {
		m := c.until(c.request(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t_sha256",`+
			`"arguments":{"text":"nostr %d"},"_meta":{"capvend/credit":true}}}`, 10+i, i)), func(n cvmMessage) {
			t.Errorf("notification %s on a credit call", n.Method)
		})
		if i == 4 {
			if m.Error == nil || m.Error.Code != -32056 {
				t.Fatalf("fifth ContextVM call: %s %+v", m.Result, m.Error)
			}
			break
		}
		var r struct {
			Meta map[string]vend.CreditInfo `json:"_meta"`
		}
		if m.Error != nil || json.Unmarshal(m.Result, &r) != nil || r.Meta[vend.MetaCredit].BalanceMsat != int64(100_000-21_000*(i+1)) {
			t.Fatalf("ContextVM call %d: %s %+v", i, m.Result, m.Error)
		}
		nostrAccount = r.Meta[vend.MetaCredit].Account
	}
	if nostrAccount != vend.NostrAccount(c.c.PublicKey) {
		t.Fatalf("ContextVM credit account %s", nostrAccount)
	}
	if spent := before - capvendtest.CustomerBalance(t, s); spent != 200_000 {
		t.Fatalf("the customer's LND paid %d msat in all, want 200000 (two top-ups of 100 sats)", spent)
	}

	stop() // the wallet is capvend serve's while it runs
	t.Chdir(filepath.Dir(path))
	for _, acct := range []string{info.Account, nostrAccount} {
		out := capvendIn(t, "", nil, "credit", "show", "--config", path, acct)
		if !strings.Contains(out, "16.000") || !strings.Contains(out, "84.000") {
			t.Fatalf("credit show:\n%s", out)
		}
		out = capvendIn(t, "", nil, "credit", "refund", acct, "--cashu", "--config", path)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		tok, err := cashu.DecodeToken(lines[len(lines)-1])
		if err != nil {
			t.Fatalf("refund token: %v\n%s", err, out)
		}
		if tok.Amount() != 16 {
			t.Fatalf("refund token of %d sats, want 16", tok.Amount())
		}
	}
	out := capvendIn(t, "", nil, "credit", "--config", path)
	if !strings.Contains(out, "2 account(s), 0.000 sat owed in credit") {
		t.Fatalf("after the refunds:\n%s", out)
	}
	out = capvendIn(t, "", nil, "ledger", "balance", "--config", path)
	for _, want := range []string{"income:tools:tools:sha256", "168.000"} {
		if !strings.Contains(out, want) {
			t.Errorf("ledger balance lacks %q:\n%s", want, out)
		}
	}
	if out := capvendIn(t, "", nil, "ledger", "verify", "--config", path); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify:\n%s", out)
	}
}

// BenchmarkCreditCalls measures paid calls per second on regtest, in the
// same run, paid per call (an LND invoice the customer node pays each
// time) and paid from prepaid credit, with 1 and 8 concurrent clients.
// Target: credit >= 20x pay-per-call. Credit makes ten times as many
// calls (creditCalls): 40 of them take a few tens of milliseconds, which
// one scheduling hiccup of a loaded machine doubles.
func BenchmarkCreditCalls(b *testing.B) {
	s := needStack(b)
	path, _ := writeServeConfig(b, s, serveOpts{credit: true})
	url := startCapvend(b, path).URL()
	const calls, creditCalls = 40, 400
	for _, n := range []int{1, 8} {
		pcs := make([]*capvendtest.PayingClient, n)
		clients := make([]*client.Client, n)
		paying := make(map[*client.Client]*capvendtest.PayingClient, n)
		for i := range pcs {
			pcs[i] = capvendtest.NewPayingClient(b, s, url)
			clients[i], paying[pcs[i].Client] = pcs[i].Client, pcs[i]
		}
		capvendtest.WaitTools(b, pcs[0].Client, listed.Count(11))
		var seq atomic.Int64
		call := func(pc *capvendtest.PayingClient, meta map[string]any) error {
			args := map[string]any{"text": fmt.Sprint("bench ", seq.Add(1))}
			res, err := pc.CallMeta(b, "t_sha256", args, meta)
			if err == nil && res.IsError {
				err = fmt.Errorf("isError: %+v", res)
			}
			return err
		}
		perCall := concurrentCalls(b, clients, calls, func(c *client.Client) error {
			pc := paying[c]
			if err := call(pc, nil); err != nil {
				return err
			}
			return <-pc.Paid
		})
		tokens := make(map[*capvendtest.PayingClient]string, n)
		for _, pc := range pcs {
			tokens[pc] = capvendtest.BuyCredit(b, pc, creditCalls*21, "").Token
		}
		credit := concurrentCalls(b, clients, creditCalls, func(c *client.Client) error {
			return call(paying[c], map[string]any{vend.MetaCredit: tokens[paying[c]]})
		})
		perCallRate, creditRate := float64(calls)/perCall.Seconds(), float64(creditCalls)/credit.Seconds()
		b.ReportMetric(perCallRate, fmt.Sprintf("per-call-calls/s-%dc", n))
		b.ReportMetric(creditRate, fmt.Sprintf("credit-calls/s-%dc", n))
		b.ReportMetric(creditRate/perCallRate, fmt.Sprintf("x-%dc", n))
	}
}
