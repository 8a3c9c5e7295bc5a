package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/exampletools"
	"github.com/capvend/capvend/vend"
)

// The load of TestMultiInstanceUnderLoad: 300 calls, every other one of
// the workers' paid.
const (
	loadHTTPWorkers  = 6  // MCP HTTP clients (mcp-go), two per instance
	loadHTTPCalls    = 25 // calls of each
	loadNostrWorkers = 6  // goroutines sending the calls of one Nostr client
	loadNostrCalls   = 23 // calls of each
	loadSDKClients   = 3  // stock @contextvm/sdk clients after the kill: a free and a paid call each
	loadHeld         = 5  // paid calls on the victim whose invoices are paid after the kill
	// loadBeforeKill is how many calls the victim delivers before it is
	// killed: the kill lands in the middle of the load.
	loadBeforeKill = 12
	loadNostrWait  = 45 * time.Second // a Nostr client's wait for an answer
	// loadLostAfter is how long after the victim's death (its process
	// reaped) a Nostr client stops waiting for the answer to a request
	// the victim claimed: whatever it published before it died has
	// reached the relay, and nobody else answers the request unless it
	// is sent again (replayLost). Without it the client waits
	// loadNostrWait.
	loadLostAfter = 10 * time.Second
)

// loadCall is one call of the load and what its client saw.
type loadCall struct {
	front  string // "http", "nostr", "held" (paid after the kill), "slow" (killed while running)
	on     int    // the instance an HTTP call went to; -1 over Nostr
	text   string // its arguments' text, unique (slow: "")
	paid   bool   // a priced tool
	event  string // a Nostr request's event id
	ev     *nostr.Event
	payReq string // the invoice it was asked to pay
	payErr error  // the customer's payment of it
	err    error  // nil: the client got the tool's result
	result string // the result's text
}

// load runs the calls of TestMultiInstanceUnderLoad and pays their
// invoices from the stack's customer node.
type load struct {
	s     *testnet.Stack
	tag   string // in every call's text: the test's calls are its own, though tests run at once
	mu    sync.Mutex
	calls []*loadCall
	pays  sync.WaitGroup
	// hold, while set, gets the invoices of the "held" calls instead of
	// paying them.
	hold chan *loadCall
	// paidHashes are the payment hashes the customer paid.
	paidHashes map[string]bool
	// dead is closed once the victim is dead (killed: when), whose
	// claims of Nostr requests are in db under its instance name victim.
	dead   chan struct{}
	killed time.Time
	db     *sql.DB
	victim string
}

// lost cancels the wait of a Nostr request, event id ev, once it is lost
// with the victim: the victim is dead, it holds the request's claim, and
// loadLostAfter has passed since its death. Stop it when the answer came.
func (ld *load) lost(ev string, cancel context.CancelFunc) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ld.dead:
		case <-done:
			return
		}
		var holder string
		ld.db.QueryRow("SELECT holder FROM request_claims WHERE request_key = $1", "nostr:"+ev).Scan(&holder)
		if holder != ld.victim {
			return // a live instance's, or not claimed: it is answered, or the wait ends at loadNostrWait
		}
		select {
		case <-time.After(time.Until(ld.killed.Add(loadLostAfter))):
			cancel()
		case <-done:
		}
	}()
	return func() { close(done) }
}

func (ld *load) add(c *loadCall) *loadCall {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.calls = append(ld.calls, c)
	return c
}

// pay pays c's invoice payReq from the customer node in a goroutine (a
// held or slow call's goes to ld.hold instead).
func (ld *load) pay(c *loadCall, payReq string) {
	ld.mu.Lock()
	c.payReq = payReq
	ld.mu.Unlock()
	if c.front == "held" || c.front == "slow" {
		ld.hold <- c
		return
	}
	ld.payNow(c, payReq)
}

func (ld *load) payNow(c *loadCall, payReq string) {
	ld.pays.Add(1)
	go func() {
		defer ld.pays.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		r, err := ld.s.Pay(ctx, payReq)
		ld.mu.Lock()
		defer ld.mu.Unlock()
		c.payErr = err
		if err == nil {
			ld.paidHashes[r.PaymentHash] = true
		}
	}()
}

func (ld *load) done(c *loadCall, result string, err error) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	c.result, c.err = result, err
}

// httpCall makes c over MCP HTTP with pc (whose payments go to cur's call).
func (ld *load) httpCall(pc *capvendtest.PayingClient, cur *atomic.Pointer[loadCall], c *loadCall) error {
	cur.Store(c)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tool, args := "t_word_count", map[string]any{"text": c.text}
	switch {
	case c.front == "slow":
		tool, args = "t_slow_count", map[string]any{"n": 100}
	case c.paid:
		tool = "t_sha256"
	}
	r, err := pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: tool, Arguments: args}})
	if err == nil && r.IsError {
		err = fmt.Errorf("tool error: %s", capvendtest.Text(r))
	}
	var out string
	if err == nil {
		out = capvendtest.Text(r)
	}
	ld.done(c, out, err)
	return err
}

// httpClients makes, in the test's goroutine, a paying MCP HTTP client on
// each listen address, all paying for the call in cur.
func (ld *load) httpClients(t *testing.T, cur *atomic.Pointer[loadCall], listens ...string) []*capvendtest.PayingClient {
	t.Helper()
	var out []*capvendtest.PayingClient
	for _, l := range listens {
		out = append(out, capvendtest.NewPayingClientWith(t, "http://"+l+"/mcp", func(payReq string) { ld.pay(cur.Load(), payReq) }))
	}
	return out
}

// httpWorker makes loadHTTPCalls calls, alternately paid and free, with
// clients[0] on instance on; once a call fails it goes on with the next
// client (another instance), as a client of a dead instance would.
func (ld *load) httpWorker(w, on int, clients []*capvendtest.PayingClient, cur *atomic.Pointer[loadCall]) {
	for i := range loadHTTPCalls {
		c := ld.add(&loadCall{front: "http", on: on, text: fmt.Sprintf("%s http %d-%d", ld.tag, w, i), paid: i%2 == 0})
		if ld.httpCall(clients[0], cur, c) != nil && len(clients) > 1 && on == 0 {
			clients, on = clients[1:], 1+w%2
		}
	}
}

// nostrWorker makes loadNostrCalls calls over Nostr with cl, alternately
// paid and free.
func (ld *load) nostrWorker(w int, cl *ctxvmclient.Client) {
	for i := range loadNostrCalls {
		c := ld.add(&loadCall{front: "nostr", on: -1, text: fmt.Sprintf("%s nostr %d-%d", ld.tag, w, i), paid: i%2 == 1})
		tool, tags := "t_word_count", nostr.Tags(nil)
		if c.paid {
			tool, tags = "t_sha256", nostr.Tags{{"pmi", vend.PMILightning}}
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": w*1000 + i, "method": "tools/call",
			"params": map[string]any{"name": tool, "arguments": map[string]any{"text": c.text}}})
		ev, err := cl.Event(ctxvmclient.KindMessage, string(body), tags...)
		if err != nil {
			ld.done(c, "", err)
			continue
		}
		ld.mu.Lock()
		c.event, c.ev = ev.ID, ev
		ld.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), loadNostrWait)
		stop := ld.lost(ev.ID, cancel)
		m, _, err := cl.Roundtrip(ctx, ev, nil, func(m ctxvmclient.Message) error {
			if m.Method == vend.NotifyPaymentRequired {
				var p vend.PaymentOption
				json.Unmarshal(m.Params, &p)
				ld.pay(c, p.PayReq)
			}
			return nil
		})
		stop()
		cancel()
		var res struct {
			IsError bool `json:"isError"`
		}
		switch {
		case err != nil:
		case m.Error != nil:
			err = m.Error
		case json.Unmarshal(m.Result, &res) != nil || res.IsError:
			err = fmt.Errorf("tool error: %s", m.Result)
		}
		ld.done(c, string(m.Result), err)
	}
}

// victimOf returns the instance name and run id of process pid (from its
// run lease in the ledger db).
func victimOf(t *testing.T, db *sql.DB, pid int) (instance, run string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a deadlock guard
	for {
		err := db.QueryRow("SELECT holder, substr(name, 5) FROM leases WHERE name LIKE 'run:%' AND holder LIKE $1",
			fmt.Sprintf("%%/%d/%%", pid)).Scan(&instance, &run)
		if err == nil {
			return instance, run
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run lease of process %d: %v", pid, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMultiInstanceUnderLoad runs three real `capvend serve` processes on
// one PostgreSQL ledger, the regtest vendor LND and relay, all with the
// same Nostr key, each selling example-tools with a calls log of its own.
// 300 priced and free calls go to them at once: mcp-go clients over HTTP
// (two per instance), a Go ContextVM client over Nostr (claimed by any
// instance) and, after the kill, stock @contextvm/sdk clients. Once the
// first instance (the work lease holder) has delivered loadBeforeKill
// calls, is running a paid slow_count and has issued the invoices of
// loadHeld more paid calls, it is SIGKILLed with the load still coming;
// the held invoices are paid after its death. Then every call is checked
// (load.check): a call whose client got no answer was on the dead instance
// and was either delivered once by another instance (recovery) or its
// money is not taken (unpaid, refunded), and the customer node paid
// exactly the delivered calls and the refunds owed.
//
// It runs twice at once (most of its time is the wait for the dead
// instance's leases to expire, and for its Nostr clients' requests lost
// with it): on plain invoices, where a paid call the
// kill interrupted is run by another instance or refunded, and on LND
// hold invoices, where it is canceled at LND instead (the customer's
// payment fails) and the held calls' invoices, paid after the kill, are
// canceled by the recovering instance, not run.
func TestMultiInstanceUnderLoad(t *testing.T) {
	t.Parallel() // with the other multi-instance tests, after the serial ones
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			t.Parallel()
			testMultiLoad(t, hold)
		})
	}
}

func testMultiLoad(t *testing.T, hold bool) {
	s := needStack(t)
	dsn := capvendtest.Postgres(t)
	server, nsec := capvendtest.ServerKey(t)
	var paths, listens, logs []string
	for i := range 3 {
		log := filepath.Join(t.TempDir(), fmt.Sprintf("calls-%d.jsonl", i))
		p, l := writeServeConfig(t, s, serveOpts{nsecFile: nsec, callsLog: log, hold: hold})
		capvendtest.OnPostgres(t, p, dsn)
		capvendtest.EditConfig(t, p, "  driver: postgres\n", fastTakeover)
		// The unpaid limits count a client by its address across the
		// instances, and every MCP HTTP client here comes from 127.0.0.1:
		// one client to the limits, with the dead instance's unpaid
		// quotes counted until they end. Room for all of them.
		capvendtest.EditConfig(t, p, "limits:\n", "limits:\n  max_unpaid_per_client: 100\n")
		paths, listens, logs = append(paths, p), append(listens, l), append(logs, log)
	}
	db := capvendtest.OpenPG(t, dsn)
	victim := startCapvend(t, paths[0], capvendtest.Options{Process: true})
	instance, run := victimOf(t, db, victim.Pid())
	capvendtest.WaitLedger(t, db, "the victim's work lease", time.Minute, func(n int) bool { return n == 1 },
		"SELECT count(*) FROM leases WHERE name = $1 AND holder = $2", vend.LeaseWork, instance)
	procs := []*capvendtest.Capvend{startCapvend(t, paths[1], capvendtest.Options{Process: true}), startCapvend(t, paths[2], capvendtest.Options{Process: true})}
	start := time.Now()

	ld := &load{s: s, tag: fmt.Sprintf("hold=%v", hold), hold: make(chan *loadCall, loadHeld+1), paidHashes: map[string]bool{},
		dead: make(chan struct{}), db: db, victim: instance}
	cl := dialContextVM(t, s.RelayURL, server)
	answers := countAnswers(t, s.RelayURL, server, cl.c.SecretKey)
	cl.waitReady()
	cl.waitNames("tools/list", "t_sha256", "t_word_count")
	var workers sync.WaitGroup
	for w := range loadHTTPWorkers {
		on := w % 3
		cur := &atomic.Pointer[loadCall]{}
		addrs := []string{listens[on]}
		if on == 0 {
			addrs = append(addrs, listens[1+w%2]) // where it goes once the victim is dead
		}
		clients := ld.httpClients(t, cur, addrs...)
		workers.Add(1)
		go func() { defer workers.Done(); ld.httpWorker(w, on, clients, cur) }()
	}
	for w := range loadNostrWorkers {
		workers.Add(1)
		go func() { defer workers.Done(); ld.nostrWorker(w, cl.c) }()
	}

	// The kill: once the victim has delivered loadBeforeKill calls, a
	// slow paid call and loadHeld paid calls whose invoices wait.
	capvendtest.WaitLedger(t, db, "calls the victim delivered", 2*time.Minute, func(n int) bool { return n >= loadBeforeKill },
		"SELECT count(*) FROM calls WHERE run_id = $1 AND state = 'delivered'", run)
	var victimCalls sync.WaitGroup
	special := []*loadCall{{front: "slow", on: 0, paid: true}}
	for i := range loadHeld {
		special = append(special, &loadCall{front: "held", on: 0, text: fmt.Sprintf("%s held %d", ld.tag, i), paid: true})
	}
	for _, c := range special {
		cur := &atomic.Pointer[loadCall]{}
		pc := ld.httpClients(t, cur, listens[0])[0]
		ld.add(c)
		victimCalls.Add(1)
		go func() { defer victimCalls.Done(); ld.httpCall(pc, cur, c) }()
	}
	var held []*loadCall
	for range special {
		select {
		case c := <-ld.hold:
			if c.front == "slow" {
				ld.payNow(c, c.payReq)
			} else {
				held = append(held, c)
			}
		case <-time.After(2 * time.Minute): // a deadlock guard
			t.Fatalf("only %d of the victim's %d invoices issued", len(held), len(special))
		}
	}
	capvendtest.WaitLedger(t, db, "the slow call executing", 2*time.Minute, func(n int) bool { return n == 1 },
		"SELECT count(*) FROM calls WHERE run_id = $1 AND tool LIKE '%slow_count' AND state = 'executing'", run)
	victim.Signal(syscall.SIGKILL)
	if code := victim.Wait(); code != capvendtest.ExitKilled {
		t.Fatalf("the victim did not die by SIGKILL: exit %d", code)
	}
	killed := time.Now()
	ld.killed = killed
	close(ld.dead)
	ld.logVictimStates(t, run, "at the kill")
	for _, c := range held {
		ld.payNow(c, c.payReq) // the dead instance's invoices, paid
	}

	// The stock client, on the live instances, while the load goes on.
	var sdkPaid atomic.Int64
	var sdk sync.WaitGroup
	for i := range loadSDKClients {
		sdk.Add(1)
		go func() {
			defer sdk.Done()
			t.Run(fmt.Sprintf("stock client %d", i), func(t *testing.T) {
				runSDKClient(t, s, s.RelayURL, server, "optional")
				sdkPaid.Add(1)
			})
		}()
	}
	workers.Wait()
	victimCalls.Wait()
	sdk.Wait()
	t.Logf("load done %s after the start, %s after the kill", time.Since(start).Round(time.Second), time.Since(killed).Round(time.Second))

	// Recovery: the held calls end, and no call is left paid or running.
	if !ld.waitRecovered(t, 3*time.Minute) {
		t.Errorf("calls not ended %s after the kill", time.Since(killed).Round(time.Second))
	}
	t.Logf("the dead instance's calls ended %s after the kill (bound: %s lease + a third of it + recovery)", time.Since(killed).Round(time.Second), testLeaseTTL)
	ld.pays.Wait()
	ld.replayLost(t, cl.c, db, instance, killed)
	ld.logVictimStates(t, run, "at the end")
	for _, p := range procs {
		p.Stop()
	}
	counts := answers.settle(t, cl, cl.c.PublicKey)
	ld.check(t, loadLedger(t, db, logs), loadState{counts: counts, victim: instance, run: run, killed: killed,
		hold: hold, sdkPaid: int(sdkPaid.Load()), customer: capvendtest.CustomerPayments(t, s, start.Add(-time.Minute))})
	capvendtest.CheckInvoicesAtLND(t, s, db)
	checkLedgerVerifies(t, paths[1])
}

// replayLost sends again, testClaimTakeover after the kill (the claims'
// ledger.claim_takeover, also the live instances' memory of the events),
// the Nostr requests the dead instance claimed and never answered whose
// call is free or was delivered by recovery: another instance answers
// each, a paid one with its stored result, asking no payment.
func (ld *load) replayLost(t *testing.T, cl *ctxvmclient.Client, db *sql.DB, victim string, killed time.Time) {
	t.Helper()
	var lost []*loadCall
	for _, c := range ld.calls {
		var holder, state string
		if c.ev == nil || c.err == nil {
			continue
		}
		db.QueryRow("SELECT holder FROM request_claims WHERE request_key = $1", "nostr:"+c.event).Scan(&holder)
		db.QueryRow(`SELECT c.state FROM calls c JOIN call_arguments a ON a.call_id = c.id
			WHERE convert_from(a.arguments, 'UTF8')::jsonb->>'text' = $1`, c.text).Scan(&state)
		if holder == victim && (!c.paid || state == "delivered") {
			lost = append(lost, c)
		}
	}
	if len(lost) == 0 {
		return
	}
	// Every claim of the dead instance is over claim_takeover old then,
	// and the live instances no longer drop the events as copies of ones
	// they let in (they forget them after claim_takeover too).
	after := testClaimTakeover
	time.Sleep(time.Until(killed.Add(after + time.Second)))
	for _, c := range lost {
		ctx, cancel := context.WithTimeout(context.Background(), loadNostrWait)
		m, _, err := cl.Roundtrip(ctx, c.ev, nil, func(m ctxvmclient.Message) error {
			if m.Method == vend.NotifyPaymentRequired {
				return errors.New("a payment asked again")
			}
			return nil
		})
		cancel()
		if err == nil && m.Error != nil {
			err = m.Error
		}
		ld.done(c, string(m.Result), err)
		if err != nil {
			t.Errorf("Nostr call %q of the dead instance, sent again: %v", c.text, err)
		}
	}
	t.Logf("%d Nostr requests of the dead instance sent again %s after the kill: answered by the live instances", len(lost), after)
}

// waitRecovered waits until no call is paid or executing and the held
// calls (paid after the kill) have ended; after guard it logs those left
// and returns false.
func (ld *load) waitRecovered(t *testing.T, guard time.Duration) bool {
	t.Helper()
	db := ld.db
	const left = `FROM calls c JOIN call_arguments a ON a.call_id = c.id WHERE c.state IN ('paid', 'executing')
		OR (convert_from(a.arguments, 'UTF8') LIKE '%held%' AND c.state = 'awaiting_payment')`
	deadline := time.Now().Add(guard) // a deadlock guard
	for {
		var n int
		if err := db.QueryRow("SELECT count(*) " + left).Scan(&n); err == nil && n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			capvendtest.Query(t, db, "SELECT c.id, c.state, c.run_id, c.tool, convert_from(a.arguments, 'UTF8') "+left, func(r *sql.Rows) error {
				var id int64
				var state, run, tool, args string
				err := r.Scan(&id, &state, &run, &tool, &args)
				t.Logf("call %d (run %s) %s %s is still %s", id, run, tool, args, state)
				return err
			})
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logVictimStates logs how many calls of run are in each state.
func (ld *load) logVictimStates(t *testing.T, run, when string) {
	t.Helper()
	db := ld.db
	rows, err := db.Query("SELECT state, count(*) FROM calls WHERE run_id = $1 GROUP BY state ORDER BY state", run)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var state string
		var n int
		rows.Scan(&state, &n)
		fmt.Fprintf(&b, " %s %d", state, n)
	}
	t.Logf("the dead instance's paid calls %s:%s", when, b.String())
}

// ledgerCall is a call of the ledger as load.check sees it.
type ledgerCall struct {
	id         int64
	state      string
	executions int
	price      int64
	run        string
	idempotent bool
	text       string
	tool       string
	hash       string // its last LND payment's
	payState   string
	settled    int64
	refund     int64 // owed or paid back
	started    []time.Time
	who        string // transport, client, request id, created_at
}

// loadBooks is what load.check reads after the load: the ledger's calls by
// their arguments' text, the Nostr claims, and each instance's upstream
// executions by text.
type loadBooks struct {
	calls    map[string][]*ledgerCall
	all      []*ledgerCall
	claims   map[string]string // event id: holder
	upstream []map[string]int  // by instance
}

func loadLedger(t *testing.T, db *sql.DB, logs []string) loadBooks {
	t.Helper()
	b := loadBooks{calls: map[string][]*ledgerCall{}, claims: map[string]string{}}
	byID := map[int64]*ledgerCall{}
	rows, err := db.Query(`SELECT c.id, c.state, c.executions, c.price_msat, c.run_id, c.idempotent, c.tool,
		coalesce(convert_from(a.arguments, 'UTF8'), '{}'), coalesce(r.amount_msat, 0),
		c.transport || ' ' || c.client || ' ' || c.request_id || ' at ' || c.created_at FROM calls c
		LEFT JOIN call_arguments a ON a.call_id = c.id LEFT JOIN refunds r ON r.call_id = c.id ORDER BY c.id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		c := &ledgerCall{}
		var idem int
		var args string
		if err := rows.Scan(&c.id, &c.state, &c.executions, &c.price, &c.run, &idem, &c.tool, &args, &c.refund, &c.who); err != nil {
			t.Fatal(err)
		}
		c.idempotent = idem == 1
		var a struct{ Text string }
		json.Unmarshal([]byte(args), &a)
		c.text = a.Text
		b.calls[c.text] = append(b.calls[c.text], c)
		b.all = append(b.all, c)
		byID[c.id] = c
	}
	rows.Close()
	capvendtest.Query(t, db, "SELECT call_id, ref, state, coalesce(settled_msat, 0) FROM payments WHERE backend = 'lnd' ORDER BY id", func(r *sql.Rows) error {
		var id int64
		var hash, state string
		var settled int64
		err := r.Scan(&id, &hash, &state, &settled)
		if c := byID[id]; c != nil {
			c.hash, c.payState, c.settled = hash, state, settled
		}
		return err
	})
	capvendtest.Query(t, db, "SELECT call_id, started_at FROM executions ORDER BY call_id, seq", func(r *sql.Rows) error {
		var id, at int64
		err := r.Scan(&id, &at)
		if c := byID[id]; c != nil {
			c.started = append(c.started, time.UnixMilli(at))
		}
		return err
	})
	capvendtest.Query(t, db, "SELECT substr(request_key, 7), holder FROM request_claims WHERE request_key LIKE 'nostr:%'", func(r *sql.Rows) error {
		var ev, holder string
		err := r.Scan(&ev, &holder)
		b.claims[ev] = holder
		return err
	})
	for _, path := range logs {
		n := map[string]int{}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := exampletools.ReadCallsLog(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			var a struct{ Text string }
			json.Unmarshal(r.Arguments, &a)
			if r.Method == exampletools.MethodTool {
				n[r.Name+" "+a.Text]++
			}
		}
		b.upstream = append(b.upstream, n)
	}
	return b
}

// loadState is what load.check holds the books against.
type loadState struct {
	counts   map[string]int // answers on the relay, by request event id
	victim   string         // the dead instance
	run      string         // its run id
	killed   time.Time
	hold     bool // hold invoices
	sdkPaid  int  // stock clients' paid calls delivered
	customer map[string]*lnrpc.Payment
}

// check holds every call of the load against the books (see
// TestMultiInstanceUnderLoad), and the customer's payments against the
// delivered calls.
func (ld *load) check(t *testing.T, b loadBooks, st loadState) {
	t.Helper()
	var paid, free, failed, recovered int
	for _, c := range ld.calls {
		onVictim := c.on == 0 || (c.event != "" && b.claims[c.event] == st.victim)
		if c.event != "" {
			if n := st.counts[c.event]; n > 1 || (n == 0 && !onVictim) {
				t.Errorf("Nostr call %q was answered %d times (claimed by %q)", c.text, n, b.claims[c.event])
			}
		}
		if c.err != nil {
			failed++
			if !onVictim {
				t.Errorf("%s call %q on a live instance failed: %v", c.front, c.text, c.err)
			}
		}
		if !c.paid {
			free++
			continue
		}
		paid++
		if c.front == "slow" {
			b.checkSlowCall(t, st)
			continue
		}
		if b.checkPaidCall(t, c, st, onVictim) {
			recovered++
		}
	}
	mine := map[string]bool{"hi": true} // and the stock clients'
	for _, c := range ld.calls {
		mine[c.text] = true
	}
	for _, lc := range b.all {
		if !mine[lc.text] && !strings.HasSuffix(lc.tool, "slow_count") {
			t.Errorf("call %d (%s %q) is none the test made", lc.id, lc.tool, lc.text)
		}
	}
	sdk := b.calls["hi"]
	if len(sdk) != st.sdkPaid || st.sdkPaid > 0 && b.upstream[1]["sha256 hi"]+b.upstream[2]["sha256 hi"] != st.sdkPaid {
		t.Errorf("%d stock clients' paid calls delivered, the ledger has %d, the upstreams ran %d", st.sdkPaid, len(sdk),
			b.upstream[1]["sha256 hi"]+b.upstream[2]["sha256 hi"])
	}
	t.Logf("%d calls (%d paid, %d free) and %d stock clients' pairs; %d calls failed at their client, %d paid calls of the dead instance delivered by another",
		len(ld.calls), paid, free, st.sdkPaid, failed, recovered)
	if recovered < loadHeld && !st.hold {
		t.Errorf("%d of the dead instance's paid calls delivered by another instance, want at least the %d held ones", recovered, loadHeld)
	}
	ld.checkCustomerPaid(t, b, st)
}

// checkPaidCall checks one paid call of the workers or a held one, and
// says whether another instance delivered it for the dead one.
func (b loadBooks) checkPaidCall(t *testing.T, c *loadCall, st loadState, onVictim bool) (recovered bool) {
	t.Helper()
	lcs := b.calls[c.text]
	if len(lcs) > 1 {
		t.Errorf("%s call %q (error %v) is %d calls in the ledger:", c.front, c.text, c.err, len(lcs))
		for _, lc := range lcs {
			t.Logf("  call %d %s, run %s, %s, paid %s (customer: %v)", lc.id, lc.state, lc.run, lc.who, lc.payState, st.customer[lc.hash] != nil)
		}
		return false
	}
	if len(lcs) == 0 {
		if c.payReq != "" || c.err == nil {
			t.Errorf("%s call %q is not in the ledger (invoice %q, error %v)", c.front, c.text, c.payReq, c.err)
		}
		return false
	}
	lc := lcs[0]
	key := "sha256 " + c.text
	ran := b.upstream[0][key] + b.upstream[1][key] + b.upstream[2][key]
	cust := st.customer[lc.hash]
	if cust == nil {
		cust = &lnrpc.Payment{}
	}
	custPaid := cust.Status == lnrpc.Payment_SUCCEEDED
	switch {
	case c.err == nil && (lc.state != "delivered" || !strings.Contains(c.result, capvendtest.SHA256Hex(c.text))):
		t.Errorf("%s call %q answered %q, the ledger has it %s", c.front, c.text, c.result, lc.state)
	case lc.state == "delivered" && (!custPaid || cust.ValueMsat != lc.price || lc.settled != lc.price):
		t.Errorf("%s call %q delivered for %d msat settled; the customer's payment is %s, %d msat", c.front, c.text, lc.settled, cust.Status, cust.ValueMsat)
	case lc.state == "delivered" && (lc.executions != 1 || ran != 1) && !b.reranInterrupted(lc, st, key):
		t.Errorf("%s call %q delivered after %d executions (the upstreams ran it %d times)", c.front, c.text, lc.executions, ran)
	case lc.state == "delivered" && lc.executions != 1:
		t.Logf("%s call %q, cut short by the kill while it ran, ran again on another instance (idempotent)", c.front, c.text)
	case lc.state != "delivered" && custPaid && lc.refund != lc.price:
		t.Errorf("%s call %q is %s (error %v) although the customer paid it, and no refund (%d msat)", c.front, c.text, lc.state, c.err, lc.refund)
	case lc.state != "delivered" && !onVictim:
		t.Errorf("%s call %q on a live instance ended %s (error %v, payment %v)", c.front, c.text, lc.state, c.err, c.payErr)
	}
	// A held call, paid after the kill, is run by another instance; on
	// a hold invoice, canceled.
	if c.front == "held" && ((lc.state == "delivered") == st.hold || custPaid == st.hold || b.upstream[0][key] != 0) {
		t.Errorf("held call %q, paid after the kill, is %s (customer's payment %s), run by the dead instance's upstream %d times",
			c.text, lc.state, cust.Status, b.upstream[0][key])
	}
	return lc.run == st.run && lc.state == "delivered" && b.upstream[1][key]+b.upstream[2][key] == 1
}

// reranInterrupted says whether lc is an idempotent call the kill cut
// short while it ran on the dead instance, run once more by another
// (Recover runs interrupted idempotent calls again).
func (b loadBooks) reranInterrupted(lc *ledgerCall, st loadState, key string) bool {
	if lc.run != st.run || !lc.idempotent || lc.executions != 2 || len(lc.started) != 2 ||
		!lc.started[0].Before(st.killed) || lc.started[1].Before(st.killed) ||
		b.upstream[0][key] > 1 || b.upstream[1][key]+b.upstream[2][key] != 1 {
		return false
	}
	return true
}

// checkSlowCall checks the slow_count call the kill interrupted: not
// idempotent, so it is not run again but refunded in full, or, on a hold
// invoice, canceled (the customer's payment failed).
func (b loadBooks) checkSlowCall(t *testing.T, st loadState) {
	t.Helper()
	var slow *ledgerCall
	for _, lc := range b.all {
		if strings.HasSuffix(lc.tool, "slow_count") {
			slow = lc
		}
	}
	key := "slow_count "
	if slow == nil || slow.state == "delivered" || slow.executions != 1 || b.upstream[1][key]+b.upstream[2][key] != 0 {
		t.Fatalf("the slow call the kill interrupted: %+v; want it not delivered, run once (upstreams: %d %d %d)", slow,
			b.upstream[0][key], b.upstream[1][key], b.upstream[2][key])
	}
	p := st.customer[slow.hash]
	paid := p != nil && p.Status == lnrpc.Payment_SUCCEEDED
	if paid == st.hold || (paid && slow.refund != slow.price) || (!paid && slow.refund != 0) {
		t.Errorf("the slow call the kill interrupted is %s, refund %d msat; the customer's payment %v", slow.state, slow.refund, p)
	}
}

// checkCustomerPaid checks that the customer node paid, for the ledger's
// invoices, exactly the prices of the delivered calls plus the refunds
// owed, and that every invoice the test paid is the ledger's.
func (ld *load) checkCustomerPaid(t *testing.T, b loadBooks, st loadState) {
	t.Helper()
	var delivered, refunds, paid int64
	invoices := map[string]bool{}
	for _, lc := range b.all {
		if lc.state == "delivered" {
			delivered += lc.price
		}
		refunds += lc.refund
		if lc.hash == "" {
			continue
		}
		invoices[lc.hash] = true
		if p := st.customer[lc.hash]; p != nil && p.Status == lnrpc.Payment_SUCCEEDED {
			paid += p.ValueMsat
		}
	}
	for h := range ld.paidHashes {
		if !invoices[h] {
			t.Errorf("the customer paid %s, no invoice of the ledger", h)
		}
	}
	if paid != delivered+refunds {
		t.Errorf("the customer paid %d msat for %d msat of delivered calls and %d msat of refunds", paid, delivered, refunds)
	}
	t.Logf("the customer paid %d msat: %d msat of delivered calls, %d msat of refunds owed", paid, delivered, refunds)
}
