package redteam

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	_ "github.com/mattn/go-sqlite3"
	"github.com/yosida95/uritemplate/v3"

	"github.com/capvend/capvend/testnet/exampletools"
	"github.com/capvend/capvend/vend"
)

// execution is one request the upstream executed, as capvend's ledger
// names it: kind, the name its price is looked up by, the canonical hash
// of the request capvend would have quoted for it.
type execution struct {
	rec  exampletools.Record
	kind vend.ItemKind
	key  string // price book key: tool name, "prompt:<name>", "resource:<uri or template>"
	hash string
	// rule is the price in force when it ran; priced says whether there
	// was one.
	rule   price
	priced bool
}

// readExecutions reads the shop's calls log (every example-tools process
// capvend started appends to it).
func readExecutions(t *testing.T, sh *shop) ([]execution, []exampletools.Record) {
	t.Helper()
	f, err := os.Open(sh.callsLog)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := exampletools.ReadCallsLog(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []execution
	var starts []exampletools.Record
	for _, r := range recs {
		if r.Method == exampletools.MethodStart {
			starts = append(starts, r)
			continue
		}
		out = append(out, classify(t, sh, r))
	}
	return out, starts
}

// classify names an executed request the way capvend quotes it: the hash
// is vend.CanonicalHash of the JSON-RPC method and params {name,
// arguments} (tools, prompts) or {uri} (resources), with the exposed name
// (the shop's upstream has no prefix, so it is the upstream's name).
func classify(t *testing.T, sh *shop, r exampletools.Record) execution {
	t.Helper()
	e := execution{rec: r}
	p := sh.pricesAt(r.Time)
	args := r.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	var params json.RawMessage
	var err error
	switch r.Method {
	case exampletools.MethodTool:
		e.kind, e.key = vend.ItemTool, r.Name
		e.rule, e.priced = p.tools[r.Name]
		params, err = json.Marshal(map[string]any{"name": r.Name, "arguments": args})
	case exampletools.MethodGet:
		e.kind, e.key = vend.ItemPrompt, "prompt:"+r.Name
		e.rule, e.priced = p.prompts[r.Name]
		params, err = json.Marshal(map[string]any{"name": r.Name, "arguments": args})
	case exampletools.MethodRead:
		e.kind, e.key = vend.ItemResource, "resource:"+r.Name
		e.rule, e.priced = p.resources[r.Name]
		if !e.priced {
			// A listed URI matching a priced URI template is priced
			// (issue 11).
			for tpl, rule := range p.resources {
				if ut, terr := uritemplate.New(tpl); terr == nil && ut.Regexp().MatchString(r.Name) {
					e.key, e.rule, e.priced = "resource:"+tpl, rule, true
					break
				}
			}
		}
		params, err = json.Marshal(map[string]any{"uri": r.Name})
	default:
		t.Fatalf("calls log: unknown method %q", r.Method)
	}
	if err != nil {
		t.Fatal(err)
	}
	method := r.Method
	e.hash, err = vend.CanonicalHash(method, params)
	if err != nil {
		// Arguments capvend could not hash: it cannot have quoted
		// them either.
		e.hash = "unhashable: " + err.Error()
	}
	e.priced = e.priced && e.rule.sats > 0
	return e
}

// ledgerCall is a row of the ledger's calls with its payments.
type ledgerCall struct {
	id                         int64
	kind, server, tool, hash   string
	transport, client, request string
	price                      int64
	state                      string
	executions                 int
	payments                   []ledgerPayment
	// drawn is what the call drew from a credit account (its price),
	// 0 if it was not paid from credit.
	drawn int64
}

type ledgerPayment struct {
	kind, state string
	settled     int64
}

type freeUse struct {
	transport, client, request, server, tool string
	hash                                     string // "" before the ledger had free_uses.args_hash
}

// openLedger opens the shop's ledger read-only.
func openLedger(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_query_only=1&_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func readLedger(t *testing.T, path string) ([]ledgerCall, []freeUse) {
	t.Helper()
	db := openLedger(t, path)
	rows, err := db.Query(`SELECT id, kind, server, tool, args_hash, transport, client, request_id, price_msat, state, executions FROM calls ORDER BY id`)
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	var calls []ledgerCall
	byID := map[int64]int{}
	for rows.Next() {
		var c ledgerCall
		if err := rows.Scan(&c.id, &c.kind, &c.server, &c.tool, &c.hash, &c.transport, &c.client, &c.request, &c.price, &c.state, &c.executions); err != nil {
			t.Fatal(err)
		}
		byID[c.id] = len(calls)
		calls = append(calls, c)
	}
	rows.Close()
	rows, err = db.Query(`SELECT call_id, kind, state, coalesce(settled_msat, 0) FROM payments ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var p ledgerPayment
		if err := rows.Scan(&id, &p.kind, &p.state, &p.settled); err != nil {
			t.Fatal(err)
		}
		if i, ok := byID[id]; ok {
			calls[i].payments = append(calls[i].payments, p)
		}
	}
	rows.Close()
	// Draws of prepaid credit (schema 13 on).
	if rows, err = db.Query(`SELECT call_id, -amount_msat FROM credit_moves WHERE kind = 'draw'`); err == nil {
		for rows.Next() {
			var id, drawn int64
			if err := rows.Scan(&id, &drawn); err != nil {
				t.Fatal(err)
			}
			if i, ok := byID[id]; ok {
				calls[i].drawn += drawn
			}
		}
		rows.Close()
	}
	// free_uses.args_hash comes with the fix of issue 11's hole 3.
	hashCol := "''"
	if cols, err := db.Query(`SELECT name FROM pragma_table_info('free_uses') WHERE name = 'args_hash'`); err == nil {
		if cols.Next() {
			hashCol = "args_hash"
		}
		cols.Close()
	}
	rows, err = db.Query(`SELECT transport, client, request_id, server, tool, coalesce(` + hashCol + `, '') FROM free_uses ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var free []freeUse
	for rows.Next() {
		var u freeUse
		if err := rows.Scan(&u.transport, &u.client, &u.request, &u.server, &u.tool, &u.hash); err != nil {
			t.Fatal(err)
		}
		free = append(free, u)
	}
	rows.Close()
	return calls, free
}

// checkInvariant holds the upstream's executions against the ledger: for
// every execution of a priced item there is exactly one ledger call of
// that kind, name and argument hash, quoted at least the configured
// price, with exactly one settled payment, for at least its quote (a call
// that failed may instead have had its hold invoice canceled: the money
// went back); each call covers as many executions as the ledger counts,
// no more, and a delivered call must have run. An execution within a daily free quota must match a free_uses row
// of that tool (and argument hash, once the ledger records it). Free
// items are exempt. Every violation is reported with t.Errorf.
func checkInvariant(t *testing.T, sh *shop) {
	t.Helper()
	execs, _ := readExecutions(t, sh)
	calls, free := readLedger(t, sh.db)

	// What each call may cover: its ledger executions, if its payment
	// holds.
	type cover struct {
		call *ledgerCall
		left int
	}
	byKey := map[string][]*cover{}
	var problems []string
	for i := range calls {
		c := &calls[i]
		if c.executions == 0 {
			continue
		}
		if why := paymentProblem(c); why != "" {
			problems = append(problems, fmt.Sprintf("call %d (%s %s/%s, %d msat, %s): %s", c.id, c.kind, c.server, c.tool, c.price, c.state, why))
			continue
		}
		k := c.kind + " " + c.hash
		byKey[k] = append(byKey[k], &cover{call: c, left: c.executions})
	}
	freeLeft := map[string]int{} // by tool key (and hash when recorded)
	for _, u := range free {
		freeLeft[u.tool+" "+u.hash]++
	}
	for _, e := range execs {
		if !e.priced {
			continue // a free item
		}
		covered := false
		for _, c := range byKey[string(e.kind)+" "+e.hash] {
			if c.left == 0 {
				continue
			}
			if c.call.server != "ex" {
				continue
			}
			if c.call.price < e.rule.msat() {
				problems = append(problems, fmt.Sprintf("%s %s %s ran on call %d quoted %d msat, below its price %d msat",
					e.rec.Method, e.rec.Name, e.rec.Arguments, c.call.id, c.call.price, e.rule.msat()))
			}
			c.left--
			covered = true
			break
		}
		if covered {
			continue
		}
		if e.rule.freePerDay > 0 {
			for _, k := range []string{e.key + " " + e.hash, e.key + " "} {
				if freeLeft[k] > 0 {
					freeLeft[k]--
					covered = true
					break
				}
			}
			if covered {
				continue
			}
		}
		problems = append(problems, fmt.Sprintf("%s %s %s (at %s) ran with no paid call of that kind, name and argument hash (%.12s…) and no free use",
			e.rec.Method, e.rec.Name, e.rec.Arguments, e.rec.Time.Format("15:04:05.000"), e.hash))
	}
	// The other way: a call the ledger says was delivered must have run
	// upstream (a paid call is never lost behind a stored answer).
	for _, covers := range byKey {
		for _, c := range covers {
			if c.call.server == "capvend" { // a top-up: credited by the ledger, nothing runs upstream
				continue
			}
			if c.call.state == "delivered" && c.left == c.call.executions {
				problems = append(problems, fmt.Sprintf("call %d (%s %s/%s) is delivered but the upstream never ran a request of its hash", c.call.id, c.call.kind, c.call.server, c.call.tool))
			}
		}
	}
	if len(problems) > 0 {
		var b strings.Builder
		for _, c := range calls {
			fmt.Fprintf(&b, "  call %d %s %s/%s hash %.12s… %d msat %s executions %d (%s %s %s) payments %+v\n",
				c.id, c.kind, c.server, c.tool, c.hash, c.price, c.state, c.executions, c.transport, c.client, c.request, c.payments)
		}
		for _, u := range free {
			fmt.Fprintf(&b, "  free use %s/%s hash %.12s (%s %s %s)\n", u.server, u.tool, u.hash, u.transport, u.client, u.request)
		}
		for _, e := range execs {
			fmt.Fprintf(&b, "  executed %s %s %s hash %.12s… priced %v\n", e.rec.Method, e.rec.Name, e.rec.Arguments, e.hash, e.priced)
		}
		t.Errorf("money invariant violated:\n  %s\nledger and upstream:\n%s", strings.Join(problems, "\n  "), b.String())
	}
}

// paymentProblem says why a call that ran is not covered by its payment,
// or "".
func paymentProblem(c *ledgerCall) string {
	settled := 0
	for _, p := range c.payments {
		if p.state == "settled" {
			settled++
		}
	}
	if settled > 1 {
		return fmt.Sprintf("%d settled payments for one call (payments %+v)", settled, c.payments)
	}
	for _, p := range c.payments {
		if p.state == "settled" && p.settled >= c.price {
			return ""
		}
	}
	if c.drawn > 0 {
		if len(c.payments) > 0 || c.drawn != c.price {
			return fmt.Sprintf("drew %d msat of credit for a %d msat call, beside payments %+v", c.drawn, c.price, c.payments)
		}
		return ""
	}
	if c.state == "failed" || c.state == "refunded" {
		for _, p := range c.payments {
			if p.kind == "hold_invoice" && p.state == "canceled" {
				return "" // the tool failed; the hold invoice returned the money
			}
		}
	}
	return fmt.Sprintf("ran without a settled payment covering it (payments %+v)", c.payments)
}
