package cli

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/exampletools"
	"github.com/capvend/capvend/vend"
)

// TestNWCConfig: the nwc section, several wallets and payments.prefer are
// checked, the URI file is a secret, and backends are ordered by prefer.
func TestNWCConfig(t *testing.T) {
	dir := t.TempDir()
	uri := "nostr+walletconnect://" + strings.Repeat("ab", 32) + "?relay=wss%3A%2F%2Frelay.example&secret=" + strings.Repeat("01", 32)
	for _, name := range []string{"nwc.uri", "hub.uri"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(uri+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, yaml, bad string // bad: a field the error names, "" when valid
	}{
		{"one wallet", "nwc:\n  uri_file: nwc.uri\n", ""},
		{"several, preferred", "nwc:\n  uri_file: nwc.uri\n  wallets:\n    - {name: hub, uri_file: hub.uri, hold_invoices: false}\npayments:\n  prefer: [nwc:hub, nwc]\n", ""},
		{"bad name", "nwc:\n  wallets:\n    - {name: My Hub, uri_file: hub.uri}\n", "nwc.wallets[0].name"},
		{"twice", "nwc:\n  wallets:\n    - {name: hub, uri_file: hub.uri}\n    - {name: hub, uri_file: nwc.uri}\n", "nwc.wallets[1].name"},
		{"the URI itself", "nwc:\n  uri_file: \"" + uri + "\"\n", "nwc.uri_file"},
		{"prefer an unconfigured backend", "nwc:\n  uri_file: nwc.uri\npayments:\n  prefer: [lnd]\n", "payments.prefer[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "capvend.yaml")
			cfg, err := parseConfig(path, []byte(tc.yaml), func(string) string { return "" })
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad+":")):
				t.Fatalf("want an error naming %s, got %v", tc.bad, err)
			case err != nil && strings.Contains(err.Error(), strings.Repeat("01", 32)):
				t.Fatalf("the error shows the URI's secret: %v", err)
			}
		})
	}

	// The URI file is a secret: readable by others, serve refuses it,
	// naming the file and the fix, never its content.
	os.Chmod(filepath.Join(dir, "hub.uri"), 0o644)
	cfg, err := parseConfig(filepath.Join(dir, "capvend.yaml"), []byte("nwc:\n  wallets:\n    - {name: hub, uri_file: hub.uri}\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.checkSecrets()
	if err == nil || !strings.Contains(err.Error(), "nwc.wallets[0].uri_file") || !strings.Contains(err.Error(), "chmod 600") ||
		strings.Contains(err.Error(), strings.Repeat("01", 32)) {
		t.Fatalf("a world-readable URI file: %v", err)
	}

	// preferred: the named first, in order; the rest in default order.
	lnd, hub, cashu := namedBackend{name: vend.BackendLND}, namedBackend{name: vend.NWCBackend("hub")}, namedBackend{name: vend.BackendCashu}
	got := preferred([]vend.PaymentBackend{lnd, hub, cashu}, []string{"cashu", "nwc:hub"})
	if len(got) != 3 || got[0] != cashu || got[1] != hub || got[2] != lnd {
		t.Fatalf("preferred order %v", got)
	}
}

// namedBackend is a PaymentBackend that only has a name.
type namedBackend struct {
	vend.PaymentBackend
	name vend.Backend
}

func (b namedBackend) Name() vend.Backend { return b.name }

// TestDoctorNWC: doctor connects to each wallet, says what it was
// granted and whether hold invoices are available, passes a receive-only
// connection and warns of one that may pay invoices (capvend pays
// refunds from it with --nwc), saying to give it a budget.
func TestDoctorNWC(t *testing.T) {
	s := needStack(t)
	w := capvendtest.NWCWallet(t, s, s.RelayURL)
	dir := t.TempDir()
	capvendtest.Chdir(t, dir)
	cfg := "ledger:\n  path: capvend.db\nnwc:\n  uri_file: " + capvendtest.URIFile(t, w, testnet.NWCReceive) + "\n  wallets:\n" +
		"    - {name: spender, uri_file: " + capvendtest.URIFile(t, w, testnet.NWCHold) + "}\n" +
		"    - {name: plain, uri_file: " + capvendtest.URIFile(t, w, testnet.NWCPlain) + "}\n"
	if err := os.WriteFile("capvend.yaml", []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, _ := run(t, nil, "doctor")
	lines := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		status, rest, _ := strings.Cut(sc.Text(), "  ")
		name, _, _ := strings.Cut(strings.TrimSpace(rest), ": ")
		lines[name] = status + " " + rest
	}
	for name, want := range map[string][]string{
		"nwc":         {"ok ", "hold invoices available", "make_hold_invoice"},
		"nwc:spender": {"WARN ", "may pay invoices (pay_invoice)", "give the connection a budget"},
		"nwc:plain":   {"WARN ", "no hold invoices (grant make_hold_invoice"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[name], w) {
				t.Errorf("doctor's %s line %q lacks %q", name, lines[name], w)
			}
		}
	}
	if strings.Contains(out, "secret=") && !strings.Contains(out, "secret=(hidden)") {
		t.Fatalf("doctor shows a URI's secret:\n%s", out)
	}
}

// TestNWCEndToEnd sells into the seller's wallet through NWC (the receive
// connection, hold invoices) on the stack's relay: an MCP client and the
// stock ContextVM client each pay a priced call, which runs once; a
// failing tool's hold invoice is canceled through the wallet and the
// customer's balance returns to the msat; the wallet received exactly
// the delivered prices; the ledger verifies and reconcile agrees.
func TestNWCEndToEnd(t *testing.T) {
	s := needStack(t)
	w := capvendtest.NWCWallet(t, s, s.RelayURL)
	server, nsec := capvendtest.ServerKey(t)
	calls := filepath.Join(t.TempDir(), "calls.log")
	path, listen := writeServeConfig(t, s, serveOpts{noLND: true, nwcURIFile: capvendtest.URIFile(t, w, testnet.NWCReceive), nsecFile: nsec, callsLog: calls})
	db := filepath.Join(filepath.Dir(path), "capvend.db")
	stop := startCapvend(t, path).Stop

	// An MCP client pays a priced call.
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_sha256", Arguments: map[string]any{"text": "hi"}}})
	if err != nil || res.IsError || !strings.Contains(mcp.GetTextFromContent(res.Content[0]), sha256Hi) {
		t.Fatalf("paid call: %+v %v", res, err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatal(err)
	}

	// A failing tool: its hold invoice is canceled through the wallet,
	// and the customer has its money back, to the msat.
	before, err := s.Balance(ctx, testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	res, err = pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_always_fails", Arguments: map[string]any{}}})
	if err == nil && !res.IsError {
		t.Fatalf("a failing tool succeeded: %+v", res)
	}
	if err := <-pc.Paid; err == nil {
		t.Fatal("the payment of the failed call's hold invoice succeeded")
	}
	after, err := s.Balance(ctx, testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("the customer's balance moved by %d msat over a failed call", before-after)
	}

	// The stock ContextVM client pays a priced call over the Nostr front.
	runSDKClient(t, s, s.RelayURL, server, "optional")

	// Each paid call ran once (the failing one once, refunded by
	// Lightning itself).
	f, err := os.Open(calls)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := exampletools.ReadCallsLog(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, r := range recs {
		if r.Method == exampletools.MethodTool {
			ran[r.Name]++
		}
	}
	if ran["sha256"] != 2 || ran["always_fails"] != 1 {
		t.Errorf("executions %v, want sha256 twice and always_fails once", ran)
	}

	// The wallet received exactly the delivered prices: 2 × 21 sat.
	u, _ := nwc.ParseURI(w.URIs[testnet.NWCReceive])
	c, err := nwc.NewClient(u, nwc.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Transactions []nwc.Transaction `json:"transactions"`
	}
	if err := c.Do(ctx, nwc.MethodListTransactions, map[string]any{"limit": 100}, &list); err != nil {
		t.Fatal(err)
	}
	var received int64
	for _, tx := range list.Transactions {
		if tx.State == "settled" {
			received += tx.Amount
		}
	}
	if received != 42_000 {
		t.Fatalf("the wallet received %d msat, want 42000: %+v", received, list.Transactions)
	}

	stop()
	l := ledgerkit.OpenVerified(t, db)
	b, _ := l.Balance(ctx)
	var revenue int64
	for _, tr := range b.Tools {
		revenue += int64(tr.Revenue)
	}
	if revenue != received || b.Pending.RefundsOwed != 0 {
		t.Fatalf("ledger revenue %d, refunds owed %d; the wallet received %d", revenue, b.Pending.RefundsOwed, received)
	}
	capvendtest.Chdir(t, filepath.Dir(path))
	if out, errOut, code := run(t, nil, "reconcile", "--config", path); code != 0 || !strings.Contains(out, "the books agree") {
		t.Fatalf("reconcile exit %d:\n%s%s", code, out, errOut)
	}
}

// TestNWCRelayCut: the wallet's relay is cut (the test relay's gate)
// while a priced call's payment settles: the hold invoice locks in at the
// wallet, its notification goes to nobody; once the relay is back capvend
// looks the invoice up before it trusts notifications again, runs the
// call once, settles it through the wallet, and books it exactly once.
func TestNWCRelayCut(t *testing.T) {
	s := needStack(t)
	relay := testkit.NewGatedRelay(t)
	w := capvendtest.NWCWallet(t, s, relay.Open) // the wallet stays on its relay; capvend goes through the gate
	u, err := nwc.ParseURI(w.URIs[testnet.NWCReceive])
	if err != nil {
		t.Fatal(err)
	}
	u.Relays = []string{relay.Gated}
	file := filepath.Join(t.TempDir(), "nwc.uri")
	if err := os.WriteFile(file, []byte(u.Encode()), 0o600); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(t.TempDir(), "calls.log")
	_, nsec := capvendtest.ServerKey(t)
	path, listen := writeServeConfig(t, s, serveOpts{noLND: true, nwcURIFile: file, callsLog: calls, nsecFile: nsec})
	db := filepath.Join(filepath.Dir(path), "capvend.db")
	stop := startCapvend(t, path).Stop

	paid := make(chan error, 1)
	pc := capvendtest.NewPayingClientWith(t, "http://"+listen+"/mcp", func(payReq string) {
		relay.Cut()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		go func() { // a hold invoice's payment returns once settled
			defer cancel()
			_, err := s.Pay(ctx, payReq)
			paid <- err
		}()
		time.Sleep(2 * time.Second) // locked in at the wallet, notified to nobody
		relay.Restore()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_sha256", Arguments: map[string]any{"text": "hi"}}})
	if err != nil || res.IsError || !strings.Contains(mcp.GetTextFromContent(res.Content[0]), sha256Hi) {
		t.Fatalf("the call paid across the cut: %+v %v", res, err)
	}
	if err := <-paid; err != nil {
		t.Fatalf("the customer's payment: %v", err)
	}
	stop()
	f, err := os.Open(calls)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := exampletools.ReadCallsLog(f)
	f.Close()
	n := 0
	for _, r := range recs {
		if r.Method == exampletools.MethodTool {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d executions, want 1: %+v", n, recs)
	}
	l := ledgerkit.OpenVerified(t, db)
	b, _ := l.Balance(ctx)
	if len(b.Tools) != 1 || b.Tools[0].Revenue != 21_000 || b.Tools[0].Calls != 1 {
		t.Fatalf("revenue %+v, want 21000 msat booked once", b.Tools)
	}
}
