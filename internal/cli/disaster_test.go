package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/exampletools"
	"github.com/capvend/capvend/vend"
)

// accountUnattributed is the liability a payment whose quote was lost
// with the ledger is booked to.
const accountUnattributed = ledger.AccountUnattributed

// drillPrices are the prices of the drill's configuration, in msat.
const (
	drillHoldPrice  = 21_000 // t_sha256, paid by a hold invoice (the client waits for its invoice)
	drillPlainPrice = 13_000 // t_word_count, paid by a plain invoice (explicit gating)
	drillSlowPrice  = 5_000  // t_slow_count (5 s at n=100), paid by a hold invoice, killed while it runs
)

// drillCall is one priced call of the drill: what the customer paid
// (bolt11) for which run of the upstream (key: its text argument, unique,
// or the tool's name for t_slow_count, called once).
type drillCall struct {
	label  string // "A-hold", "B-plain", ...: batch and kind
	tool   string
	key    string
	args   map[string]any
	bolt11 string
	amount int64 // msat, as quoted
	token  string
}

// TestDisasterDrill is the disaster drill of issue 30 on real parts: the
// capvend binary serving MCP over HTTP on the regtest stack (LND hold and
// plain invoices, Cashu mint quotes on the stack's mint), a customer
// paying from its own LND node, the example-tools upstream logging each
// run, and Litestream (the pinned release, with the configuration
// `capvend ledger litestream-config` writes) replicating the ledger to a
// file:// replica beside serve, as an operator runs it. lnd.hold_invoices
// is the backend's, not a tool's: a call waiting for its invoice
// (payment notifications) gets a hold invoice, an explicit-gating call a
// plain one, so the drill pays t_sha256 and t_slow_count the first way
// and t_word_count the second.
//
//  1. Batch A, one paid call of each kind (a hold invoice: t_sha256; a
//     plain invoice: t_word_count, paid and repeated with its payment
//     token; a Cashu mint quote: t_sha256 with _meta
//     capvend/invoice_from cashu), each run and answered; the replica
//     catches up with the ledger.
//  2. Batch B: the same three calls, a second plain one and a hold-paid
//     t_slow_count are quoted (their payments in the ledger, open) and the
//     replica catches up: the last replicated change the restore keeps.
//     Litestream stops. Then the customer pays: the hold invoice is
//     settled by serve after its run, the mint quote minted into
//     capvend's wallet, the first plain call repeated and run, the second
//     never repeated (its client gone). Batch C: a plain quote made after
//     Litestream stopped, paid and run: its quote is lost with the
//     ledger. Last, t_slow_count is paid: its hold invoice is locked in
//     and its call running when
//  3. serve is SIGKILLed. The ledger, its -wal, -shm and Litestream's
//     folder are deleted; `capvend ledger restore --to capvend.db` brings
//     back the money records of the replicated point, B's five calls
//     (awaiting payment there) ended as canceled so that none runs.
//  4. serve and Litestream start again. The backends' catching up and
//     serve's reconciliation book every payment of B that LND and the
//     mint settled meanwhile (owed back: the books lost their runs), and
//     the locked-in hold invoice is canceled (the customer's money goes
//     back). Repeating B's and C's calls with their payment tokens runs
//     nothing.
//  5. With serve stopped, `capvend reconcile` finds the books in
//     agreement with LND, the mint and the Cashu wallet (its ecash checked
//     at the mint), `capvend ledger verify` passes, and the replica
//     catches up with the restored ledger.
//
// It proves: every payment of A and B the customer made is booked
// settled (the one returned, canceled); no call ran twice (the upstream's
// own log: one run per call that ran, none after the kill; the ledger
// counts A's runs and no more); and what the customer's node paid for A
// and B (its succeeded payments, mint quotes included) equals the books'
// assets (assets:lightning:lnd and assets:cashu:*) to the msat, with B's
// settled payments owed back in liabilities:refunds. With
// C's payments (an LND invoice and a Cashu mint quote, their quotes lost
// with the ledger) are booked too: the assets hold them, and
// liabilities:unattributed owes them.
func TestDisasterDrill(t *testing.T) {
	s, ls := drillParts(t)
	ctx := context.Background()
	start := time.Now()
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	callsLog := filepath.Join(dir, "calls.jsonl")
	listen := capvendtest.FreeAddr(t)
	config := writeDrillConfig(t, s, dir, listen, ls, callsLog)
	cfg, err := loadConfig(config, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	lsr, err := cfg.Ledger.litestream("")
	if err != nil {
		t.Fatal(err)
	}
	capvendIn(t, dir, nil, "ledger", "litestream-config", "--out", "litestream.yml")
	lsConfig := filepath.Join(dir, "litestream.yml")

	serve := startCapvend(t, config, capvendtest.Options{Process: true})
	stopLitestream := capvendtest.Replicating(t, ls, lsConfig)
	url := "http://" + listen + "/mcp"
	d := &drill{t: t, s: s, url: url}
	d.waitTools()

	// Batch A: paid, run and answered; replicated.
	a := []*drillCall{
		d.notified("A-hold", "t_sha256", nil, nil, false).wait(t),
		d.explicit("A-plain", "t_word_count").pay().repeat(),
		d.notified("A-cashu", "t_sha256", map[string]any{vend.MetaInvoiceFrom: "cashu"}, nil, false).wait(t),
	}
	replicated(t, lsr, db)
	t.Logf("batch A paid, run and replicated (%s)", time.Since(start).Round(time.Millisecond))

	// Batch B: quoted and replicated; then Litestream stops, and the
	// customer pays.
	gate := make(chan struct{})
	bHold := d.notified("B-hold", "t_sha256", nil, gate, false)
	bCashu := d.notified("B-cashu", "t_sha256", map[string]any{vend.MetaInvoiceFrom: "cashu"}, gate, false)
	lockGate := make(chan struct{})
	bLocked := d.notified("B-hold-locked", "t_slow_count", nil, lockGate, true)
	bPlain := d.explicit("B-plain", "t_word_count")
	bUnclaimed := d.explicit("B-plain-unclaimed", "t_word_count")
	b := []*drillCall{bHold.call, bCashu.call, bPlain.drillCall, bUnclaimed.drillCall}
	locked := bLocked.call
	d.waitState(db, "awaiting_payment", append(slices.Clone(b), locked)...)
	last := replicated(t, lsr, db)
	stopLitestream()
	t.Logf("batch B quoted and replicated, Litestream stopped (%s)", time.Since(start).Round(time.Millisecond))
	close(gate)
	bPlain.pay().repeat()
	bUnclaimed.pay() // the client never comes back for its call
	bHold.wait(t)
	bCashu.wait(t)

	// Batch C: quoted after the last replicated change, paid and run.
	c := d.explicit("C-plain", "t_word_count").pay().repeat()
	cCashu := d.notified("C-cashu", "t_sha256", map[string]any{vend.MetaInvoiceFrom: "cashu"}, nil, false).wait(t)
	d.waitState(db, "settled", append(slices.Clone(b), c, cCashu)...)
	// The last of B: its hold invoice locked in and its call running
	// (5 s) when serve is killed.
	close(lockGate)
	d.waitState(db, "accepted", locked)
	d.waitRun(callsLog, locked)
	ran := d.runs(callsLog)
	for _, dc := range slices.Concat(a, b, []*drillCall{locked, c, cCashu}) {
		want := 1
		if dc == bUnclaimed.drillCall {
			want = 0
		}
		if ran[dc.key] != want {
			t.Fatalf("before the kill, the upstream ran %s %d times, want %d", dc.label, ran[dc.key], want)
		}
	}
	t.Logf("batches B and C paid and run (%s)", time.Since(start).Round(time.Millisecond))

	// The disaster: serve dies, the ledger is lost with everything beside
	// it; the replica is all that is left.
	serve.Signal(syscall.SIGKILL)
	if code := serve.Wait(); code != capvendtest.ExitKilled {
		t.Fatalf("serve did not die by SIGKILL: exit %d", code)
	}
	for _, p := range []string{db, db + "-wal", db + "-shm", filepath.Join(dir, ".capvend.db-litestream")} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	out := capvendIn(t, dir, nil, "ledger", "restore", "--to", "capvend.db")
	if !strings.Contains(out, "5 canceled, 0 refunded, 0 failed (serve refunds them), 0 with a locked-in hold invoice") ||
		!strings.Contains(out, "checks passed") {
		t.Fatalf("restore:\n%s", out)
	}
	if diff := capvendtest.LineDiff(last, moneyRecords(t, db, false)); !restoreEndedOnly(diff, len(b)+1) {
		t.Fatalf("the restored money records differ from the last replicated point by more than B's %d calls ended:\n%s", len(b)+1, diff)
	}
	for _, dc := range []*drillCall{c, cCashu} {
		if p := d.booked(db, dc); p.found {
			t.Fatalf("%s's quote is in the restored books (%+v): it was made after the last replicated change", dc.label, p)
		}
	}
	lastRun := d.lastReconcileRun(db)
	t.Logf("restored the replicated point (%s)", time.Since(start).Round(time.Millisecond))

	// Serve again, Litestream beside it: what LND and the mint settled
	// meanwhile is booked.
	serve = startCapvend(t, config, capvendtest.Options{Process: true})
	capvendtest.Replicating(t, ls, lsConfig)
	d.waitReconciled(db, lastRun)
	d.waitState(db, "settled", b...)
	// The hold invoice locked in at the kill is canceled: the customer's
	// money goes back, nothing is booked but the cancellation.
	select {
	case <-bLocked.paid:
	case <-time.After(120 * time.Second):
		t.Fatal("B-hold-locked: the customer's payment is still in flight 120 s after serve started again")
	}
	d.waitState(db, "canceled", locked)
	// Repeating a call whose run the books lost runs nothing: B's (its
	// call canceled by the restore) and C's (its token lost).
	// B's tokens say the call was canceled and the payment is owed
	// back, not "expired unpaid, pay again".
	for _, dc := range []*drillCall{bPlain.drillCall, bUnclaimed.drillCall, c} {
		res, err := d.repeatOnce(dc)
		if err == nil && !res.IsError && d.answer(res) == "" {
			t.Fatalf("repeating %s after the restore was answered by the tool: %s", dc.label, capvendtest.Text(res))
		}
		t.Logf("repeating %s after the restore: %v %s", dc.label, err, drillResult(res))
		if dc != c && (err == nil || !strings.Contains(err.Error(), "canceled") || !strings.Contains(err.Error(), "owed back")) {
			t.Errorf("repeating %s (paid, its call canceled by the restore): %v; want the call canceled and its payment owed back", dc.label, err)
		}
	}
	if n := d.unrepaired(db); n != 0 {
		t.Errorf("serve's reconciliation after the restore recorded %d differences it did not repair; want none (the backends caught up first)", n)
	}
	serve.Stop()
	t.Logf("served again, reconciled, stopped (%s)", time.Since(start).Round(time.Millisecond))

	// With serve stopped, reconcile compares the Cashu wallet too.
	if out := capvendIn(t, dir, nil, "reconcile"); !strings.Contains(out, "the books agree") {
		t.Errorf("capvend reconcile:\n%s", out)
	}
	if out := capvendIn(t, dir, nil, "ledger", "verify"); !strings.Contains(out, "checks passed") {
		t.Fatalf("ledger verify:\n%s", out)
	}
	t.Logf("capvend reconcile --last 3:\n%s", capvendIn(t, dir, nil, "reconcile", "--last", "3"))
	// Litestream replicates the restored ledger on.
	replicated(t, lsr, db)

	// No call ran twice: the upstream's own log against the ledger's.
	after := d.runs(callsLog)
	if !maps.Equal(after, ran) {
		t.Errorf("the upstream ran calls after the kill: before %v, after %v", ran, after)
	}
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var booked, executions int64
	for _, dc := range slices.Concat(a, b) {
		p := d.booked(db, dc)
		if p.state != "settled" || p.settled != dc.amount {
			t.Errorf("%s: the books hold its payment %s, %d msat, want settled %d msat", dc.label, p.state, p.settled, dc.amount)
		}
		wantCall, wantRuns := "delivered", int64(1)
		if strings.HasPrefix(dc.label, "B-") {
			wantCall, wantRuns = "canceled", 0 // ended by the restore: its run is not in the books
		}
		if p.call != wantCall || p.executions != wantRuns {
			t.Errorf("%s: call %s with %d executions in the books, want %s with %d (the upstream ran it %d times)",
				dc.label, p.call, p.executions, wantCall, wantRuns, after[dc.key])
		}
		if p.executions > int64(after[dc.key]) {
			t.Errorf("%s: the books count %d executions, the upstream ran it %d times", dc.label, p.executions, after[dc.key])
		}
		booked += p.settled
		executions += p.executions
	}
	if p := d.booked(db, locked); p.state != "canceled" || p.call != "canceled" || p.executions != 0 || after[locked.key] != 1 {
		t.Errorf("%s: the books hold %+v, the upstream ran it %d times; want its payment and call canceled, no execution booked, one run",
			locked.label, p, after[locked.key])
	}
	if n := d.executionsBooked(db); n != executions || n != int64(len(a)) {
		t.Errorf("the books count %d executions (%d of the drill's calls), want %d: A's runs, no more", n, executions, len(a))
	}

	// The customer's payments equal the books' receipts, to the msat.
	paidAB := d.customerPaid(ctx, start, slices.Concat(a, b)...)
	paidC := d.customerPaid(ctx, start, c, cCashu)
	bal, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var assets, unattributed int64
	for _, acc := range bal.Accounts {
		switch {
		case acc.Account == ledger.AccountLND || strings.HasPrefix(acc.Account, "assets:cashu:"):
			assets += int64(acc.Balance)
		case acc.Account == accountUnattributed:
			unattributed = -int64(acc.Balance)
		}
		t.Logf("books: %-50s %12d msat", acc.Account, acc.Balance)
	}
	var owedB int64
	for _, dc := range b {
		owedB += dc.amount
	}
	t.Logf("the customer paid %d msat for A and B, %d for C; the books' assets %d msat, settled payments %d, refunds owed %d",
		paidAB, paidC, assets, booked, bal.Pending.RefundsOwed)
	if paidAB != booked {
		t.Errorf("the customer paid %d msat for A and B, the books settled %d msat", paidAB, booked)
	}
	if int64(bal.Pending.RefundsOwed) != owedB {
		t.Errorf("the books owe %d msat back, want %d (B's payments: their runs were lost)", bal.Pending.RefundsOwed, owedB)
	}
	// C's payments, their quotes lost with the ledger: the LND invoice
	// recognized by the mark of its preimage, the mint quote from the
	// wallet's own store; booked to liabilities:unattributed.
	if assets != paidAB+paidC || unattributed != paidC {
		t.Errorf("assets %d msat, %s %d msat; want %d and %d (C's %d msat booked unattributed)",
			assets, accountUnattributed, unattributed, paidAB+paidC, paidC, paidC)
	}
	if n := d.lostSettlements(db); n != 1 {
		t.Errorf("%d lost settlements recorded by reconciliation, want 1 (C-plain's invoice)", n)
	}
	t.Logf("drill done in %s", time.Since(start).Round(time.Millisecond))
}

// drillParts returns the regtest stack and the Litestream binary, or
// skips the test (fails it under CI) when the regtest binaries are not
// built or Litestream cannot be built.
func drillParts(t *testing.T) (*testnet.Stack, string) {
	t.Helper()
	skip.Short(t, "the disaster drill needs the regtest stack and Litestream")
	dir, err := testnet.DefaultBinDir()
	if err != nil {
		skip.Missing(t, "no cache directory for the regtest binaries: "+err.Error(), "set HOME or XDG_CACHE_HOME")
	}
	for _, bin := range []string{
		filepath.Join(dir, "btcd-"+testnet.BtcdVersion, "btcd"),
		filepath.Join(dir, "lnd-"+testnet.LNDVersion, "lnd"),
	} {
		if _, err := os.Stat(bin); err != nil {
			skip.Missing(t, fmt.Sprintf("the regtest binaries are not built (%s)", bin), "go run ./cmd/capvend testnet build")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := testnet.EnsureLitestream(ctx, dir, t.Logf); err != nil {
		skip.Missing(t, "Litestream "+testnet.LitestreamVersion+" could not be built: "+err.Error(),
			"go install github.com/benbjohnson/litestream/cmd/litestream@"+testnet.LitestreamVersion)
	}
	bin := capvendtest.Litestream(t)
	return needStack(t), bin
}

// writeDrillConfig writes dir/capvend.yaml: the ledger at capvend.db
// replicated to dir/replica, LND with hold invoices, the stack's mint
// (mint quotes), and example-tools as a stdio upstream logging its runs
// to callsLog, selling t_sha256 and t_word_count.
func writeDrillConfig(t *testing.T, s *testnet.Stack, dir, listen, litestreamBin, callsLog string) string {
	t.Helper()
	vendor, _ := s.Node(testnet.Vendor)
	if err := os.Mkdir(filepath.Join(dir, "cashu-wallet"), 0o700); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`ledger:
  path: capvend.db
  replica: file://%s
  litestream: %s
server:
  name: disaster drill
http:
  listen: %s
lnd:
  host: %s
  tls_cert_file: %s
  macaroon_file: %s
  hold_invoices: true
cashu:
  mints: [%s]
  wallet_dir: cashu-wallet
payments:
  ttl: 2m
limits:
  requests_per_minute: 1000
upstreams:
  - name: tools
    command: %s
    args: [--calls-log, %s]
    prefix: t_
    tools:
      sha256: {price_msat: %d}
      word_count: {price_msat: %d}
      slow_count: {price_msat: %d}
`, filepath.Join(dir, "replica"), litestreamBin, listen, vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon,
		s.MintURL, capvendtest.ExampleTools(t), callsLog, drillHoldPrice, drillPlainPrice, drillSlowPrice)
	path := filepath.Join(dir, "capvend.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// drill is the customer's side of the drill.
type drill struct {
	t   *testing.T
	s   *testnet.Stack
	url string
	mu  sync.Mutex
	n   int
}

// client is a new MCP client that declared capvend's payment
// notifications; pay handles each payment_required's bolt11.
func (d *drill) client(pay func(string)) *capvendtest.PayingClient {
	if pay == nil {
		pay = func(string) {}
	}
	return capvendtest.NewPayingClientWith(d.t, d.url, pay)
}

func (d *drill) waitTools() {
	t := d.t
	pc := d.client(nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := pc.ListTools(ctx, mcp.ListToolsRequest{})
		cancel()
		var names []string
		if err == nil {
			for _, tl := range res.Tools {
				names = append(names, tl.Name)
			}
		}
		if slices.Contains(names, "t_sha256") && slices.Contains(names, "t_word_count") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools: %v %v", names, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newCall is a call of tool with arguments no other call has (but
// t_slow_count's, called once).
func (d *drill) newCall(label, tool string) *drillCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	switch tool {
	case "t_slow_count":
		return &drillCall{label: label, tool: tool, key: "slow_count", args: map[string]any{"n": 100}, amount: drillSlowPrice}
	case "t_word_count":
		key := fmt.Sprintf("disaster drill %s %d %d", label, d.n, time.Now().UnixNano())
		return &drillCall{label: label, tool: tool, key: key, args: map[string]any{"text": key}, amount: drillPlainPrice}
	}
	key := fmt.Sprintf("disaster drill %s %d %d", label, d.n, time.Now().UnixNano())
	return &drillCall{label: label, tool: tool, key: key, args: map[string]any{"text": key}, amount: drillHoldPrice}
}

// pay pays bolt11 from the customer node; the payment must succeed, or
// with returned fail (a hold invoice canceled: the money went back).
func (d *drill) pay(label, bolt11 string, returned bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	_, err := d.s.Pay(ctx, bolt11)
	switch {
	case err != nil && !returned:
		d.t.Errorf("%s: the customer's payment failed: %v", label, err)
	case err == nil && returned:
		d.t.Errorf("%s: the customer's payment succeeded; want it returned", label)
	}
}

// flight is a call waiting for its invoice to be paid, over payment
// notifications.
type flight struct {
	call *drillCall
	done chan error    // the call's answer came (res)
	paid chan struct{} // the customer's payment ended
	res  *mcp.CallToolResult
}

// notified starts a call of tool on a client of its own that pays the
// invoice it is notified of once gate is closed (at once if gate is
// nil), and returns once the invoice is known. With returned, the
// payment must fail (its hold invoice canceled).
func (d *drill) notified(label, tool string, meta map[string]any, gate <-chan struct{}, returned bool) *flight {
	t := d.t
	f := &flight{call: d.newCall(label, tool), done: make(chan error, 1), paid: make(chan struct{})}
	invoice := make(chan string, 1)
	pc := d.client(func(bolt11 string) {
		invoice <- bolt11
		if gate != nil {
			<-gate
		}
		d.pay(label, bolt11, returned)
		close(f.paid)
	})
	go func() {
		res, err := pc.CallMeta(t, tool, f.call.args, meta)
		f.res = res
		f.done <- err
	}()
	select {
	case f.call.bolt11 = <-invoice:
	case err := <-f.done:
		t.Fatalf("%s: answered before an invoice: %v %s", label, err, drillResult(f.res))
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: no payment_required in 60 s", label)
	}
	return f
}

// wait waits for the call's answer, which must be the tool's, and for
// the customer's payment to end (a hold invoice's is settled after the
// run).
func (f *flight) wait(t *testing.T) *drillCall {
	t.Helper()
	select {
	case err := <-f.done:
		if err != nil || f.res == nil || f.res.IsError {
			t.Fatalf("%s: %v %s", f.call.label, err, drillResult(f.res))
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("%s: no answer in 120 s", f.call.label)
	}
	select {
	case <-f.paid:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: the customer's payment did not end in 60 s after the answer", f.call.label)
	}
	return f.call
}

// explicitCall is a call quoted by explicit gating: its plain invoice and
// payment token.
type explicitCall struct {
	*drillCall
	d *drill
}

// explicit asks for tool's call with explicit gating: the answer carries
// a plain invoice and the payment token to repeat the call with.
func (d *drill) explicit(label, tool string) *explicitCall {
	t := d.t
	dc := d.newCall(label, tool)
	pc := d.client(nil)
	res, err := pc.CallMeta(t, tool, dc.args,
		map[string]any{mcpfront.MetaPaymentInteraction: mcpfront.ExplicitGating})
	if err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	ans := structured(res)
	dc.bolt11, _ = ans["invoice"].(string)
	dc.token, _ = ans["capvend_payment"].(string)
	if ans["error"] != "payment_required" || dc.bolt11 == "" || dc.token == "" {
		t.Fatalf("%s: explicit-gating answer %s", label, drillResult(res))
	}
	return &explicitCall{drillCall: dc, d: d}
}

func (e *explicitCall) pay() *explicitCall {
	e.d.pay(e.label, e.bolt11, false)
	return e
}

// repeat repeats the paid call with its payment token until it is
// answered by the tool (payment_pending while serve books the payment).
func (e *explicitCall) repeat() *drillCall {
	t := e.d.t
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := e.d.repeatOnce(e.drillCall)
		if err != nil {
			t.Fatalf("%s: repeat: %v", e.label, err)
		}
		if a := e.d.answer(res); a != "payment_pending" {
			if res.IsError || a != "" {
				t.Fatalf("%s: repeat: %s", e.label, drillResult(res))
			}
			return e.drillCall
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still payment_pending after 60 s", e.label)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// repeatOnce repeats dc's call once with its payment token.
func (d *drill) repeatOnce(dc *drillCall) (*mcp.CallToolResult, error) {
	pc := d.client(nil)
	return pc.CallMeta(d.t, dc.tool, dc.args, map[string]any{vend.MetaPaymentToken: dc.token})
}

// answer is a payment answer's error ("payment_required",
// "payment_pending"), "" for any other result.
func (d *drill) answer(res *mcp.CallToolResult) string {
	a, _ := structured(res)["error"].(string)
	return a
}

func structured(res *mcp.CallToolResult) map[string]any {
	if res == nil {
		return nil
	}
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	json.Unmarshal(b, &m)
	return m
}

func drillResult(res *mcp.CallToolResult) string {
	if res == nil {
		return "(no result)"
	}
	b, _ := json.Marshal(res)
	return string(b)
}

// runs counts the upstream's executions of the drill's calls by their
// key (text argument, or tool name), from its calls log.
func (d *drill) runs(path string) map[string]int {
	t := d.t
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := exampletools.ReadCallsLog(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range recs {
		if r.Method != exampletools.MethodTool {
			continue
		}
		var args struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(r.Arguments, &args); err != nil {
			t.Fatalf("calls log: %v: %s", err, r.Arguments)
		}
		if args.Text == "" {
			args.Text = r.Name
		}
		out[args.Text]++
	}
	return out
}

// query runs f on the SQLite ledger at path, opened read-only beside
// the serve that may hold it.
func (d *drill) query(path string, f func(db *sql.DB) error) {
	d.t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		d.t.Fatal(err)
	}
	defer db.Close()
	if err := f(db); err != nil {
		d.t.Fatal(err)
	}
}

// bookedPayment is what the ledger holds of a drill call's payment.
type bookedPayment struct {
	found      bool
	state      string
	settled    int64
	call       string
	executions int64
}

func (d *drill) booked(path string, dc *drillCall) bookedPayment {
	var p bookedPayment
	d.query(path, func(db *sql.DB) error {
		var settled sql.NullInt64
		err := db.QueryRow(`SELECT p.state, p.settled_msat, c.state, c.executions FROM payments p JOIN calls c ON c.id = p.call_id
			WHERE p.bolt11 = ?`, dc.bolt11).Scan(&p.state, &settled, &p.call, &p.executions)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		p.found, p.settled = err == nil, settled.Int64
		return err
	})
	return p
}

// waitRun waits until the upstream's calls log holds dc's run.
func (d *drill) waitRun(path string, dc *drillCall) {
	t := d.t
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for d.runs(path)[dc.key] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the upstream did not start it in 60 s", dc.label)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitState waits until the payments of calls are in state (their calls
// recorded, for awaiting_payment).
func (d *drill) waitState(path, state string, calls ...*drillCall) {
	t := d.t
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var off []string
		for _, dc := range calls {
			p := d.booked(path, dc)
			got := p.state
			if state == "awaiting_payment" {
				got = p.call
			}
			if got != state {
				off = append(off, fmt.Sprintf("%s: %+v", dc.label, p))
			}
		}
		if len(off) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s after 60 s: %s", state, strings.Join(off, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (d *drill) lastReconcileRun(path string) int64 {
	var id int64
	d.query(path, func(db *sql.DB) error {
		return db.QueryRow(`SELECT coalesce(max(id), 0) FROM reconcile_runs`).Scan(&id)
	})
	return id
}

// waitReconciled waits until a reconciliation run after run finished.
func (d *drill) waitReconciled(path string, run int64) {
	t := d.t
	deadline := time.Now().Add(90 * time.Second)
	for {
		var n int
		d.query(path, func(db *sql.DB) error {
			return db.QueryRow(`SELECT count(*) FROM reconcile_runs WHERE id > ? AND finished_at IS NOT NULL`, run).Scan(&n)
		})
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("serve ran no reconciliation in 90 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// executionsBooked is the sum of every call's executions in the ledger.
func (d *drill) executionsBooked(path string) int64 {
	var n int64
	d.query(path, func(db *sql.DB) error {
		return db.QueryRow(`SELECT coalesce(sum(executions), 0) FROM calls`).Scan(&n)
	})
	return n
}

// differences counts the recorded differences of kind.
func (d *drill) unrepaired(path string) int {
	var n int
	d.query(path, func(db *sql.DB) error {
		return db.QueryRow(`SELECT count(*) FROM reconcile_differences WHERE repair = ''`).Scan(&n)
	})
	return n
}

func (d *drill) lostSettlements(path string) int {
	var n int
	d.query(path, func(db *sql.DB) error {
		return db.QueryRow(`SELECT count(*) FROM reconcile_differences
			WHERE kind = 'settled_unbooked' AND ledger = 'lost' AND repair LIKE 'reconcile:%'`).Scan(&n)
	})
	return n
}

// customerPaid is what the customer node's succeeded payments of the
// calls' invoices (made since start) sent, in msat, fees aside.
func (d *drill) customerPaid(ctx context.Context, start time.Time, calls ...*drillCall) int64 {
	t := d.t
	conn, err := d.s.Conn(testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	ln := lnrpc.NewLightningClient(conn)
	want := map[string]bool{}
	for _, dc := range calls {
		req, err := ln.DecodePayReq(ctx, &lnrpc.PayReqString{PayReq: dc.bolt11})
		if err != nil {
			t.Fatal(err)
		}
		want[req.PaymentHash] = true
	}
	var sum int64
	seen := map[string]bool{}
	for offset := uint64(0); ; {
		r, err := ln.ListPayments(ctx, &lnrpc.ListPaymentsRequest{IndexOffset: offset, MaxPayments: 500,
			CreationDateStart: uint64(start.Add(-time.Minute).Unix())})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.Payments {
			if want[p.PaymentHash] && p.Status == lnrpc.Payment_SUCCEEDED {
				sum += p.ValueMsat
				seen[p.PaymentHash] = true
			}
		}
		if len(r.Payments) < 500 {
			break
		}
		offset = r.LastIndexOffset
	}
	if len(seen) != len(want) {
		var missing []string
		for h := range want {
			if !seen[h] {
				missing = append(missing, h)
			}
		}
		t.Fatalf("the customer node has no succeeded payment of %v", missing)
	}
	return sum
}

// restoreEndedOnly reports whether diff (lineDiff of the money records of
// the replicated point and of the restored ledger) is n calls awaiting
// payment, and the same n calls canceled by the restore, and nothing else.
func restoreEndedOnly(diff string, n int) bool {
	var gone, came int
	for _, line := range strings.Split(strings.TrimSpace(diff), "\n") {
		switch {
		case strings.HasPrefix(line, `- calls "`) && strings.Contains(line, "awaiting_payment"):
			gone++
		case strings.HasPrefix(line, `+ calls "`) && strings.Contains(line, "canceled") && strings.Contains(line, "the ledger was restored from"):
			came++
		default:
			return false
		}
	}
	return gone == n && came == n
}
