package redteam

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Issue 11, "SIGHUP: no false 'restart needed' for prompt/resource price
// changes; a paid explicit-gating grant whose tool became free is
// refunded, not lost."

// gatedInvoice returns the bolt11 of an explicit-gating answer over MCP:
// a tool result with isError whose structuredContent has the invoice.
func gatedInvoice(t *testing.T, m rpcMessage) string {
	t.Helper()
	var r struct {
		IsError           bool `json:"isError"`
		StructuredContent struct {
			Error   string `json:"error"`
			Invoice string `json:"invoice"`
		} `json:"structuredContent"`
	}
	if m.Error != nil || json.Unmarshal(m.Result, &r) != nil || !r.IsError || r.StructuredContent.Error != "payment_required" {
		t.Fatalf("want a payment_required tool result, got %s", m)
	}
	if r.StructuredContent.Invoice == "" {
		t.Fatalf("payment_required without an invoice: %s", m.Result)
	}
	return r.StructuredContent.Invoice
}

// listedPrice returns the tools/list _meta price of tool ("" if none).
func listedPrice(t *testing.T, c *httpClient, sess, tool string) string {
	t.Helper()
	m, err := c.tryRPC(sess, "list", "tools/list", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Tools []struct {
			Name string          `json:"name"`
			Meta json.RawMessage `json:"_meta"`
		} `json:"tools"`
	}
	json.Unmarshal(m.Result, &r)
	for _, tl := range r.Tools {
		if tl.Name == tool {
			var meta map[string]json.RawMessage
			json.Unmarshal(tl.Meta, &meta)
			return string(meta["capvend/price"])
		}
	}
	t.Fatalf("%s not listed", tool)
	return ""
}

// callState returns the state of the ledger's call id.
func callState(t *testing.T, sh *shop, id int64) string {
	t.Helper()
	calls, _ := readLedger(t, sh.db)
	for _, c := range calls {
		if c.id == id {
			return c.state
		}
	}
	return ""
}

// TestSIGHUPPaidGrantBecomesFree pays an explicit-gating grant for sha256,
// then makes sha256 free with SIGHUP. The client repeats the call: it
// gets its answer, and the paid grant ends delivered or refunded; it is
// not left paid, the money kept for nothing.
func TestSIGHUPPaidGrantBecomesFree(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{lnd: plainInvoices})
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	call := callParams("sha256", map[string]any{"text": "grant"}, explicit())
	m, err := c.tryRPC(sess, 1, "tools/call", call, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-payAsync(sh.s, gatedInvoice(t, m)); err != nil {
		t.Fatalf("paying the grant: %v", err)
	}
	waitUntil(t, "the grant paid", func() bool { return callState(t, sh, 1) == "paid" })

	free := *sh.opts.prices
	free.tools = map[string]price{}
	for k, v := range sh.opts.prices.tools {
		if k != "sha256" {
			free.tools[k] = v
		}
	}
	sh.reload(free, func() bool { return listedPrice(t, c, sess, "sha256") == "" })

	m, err = c.tryRPC(sess, 2, "tools/call", call, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m.Result), sha256Hex("grant")) {
		t.Fatalf("the repeated call after sha256 became free: %s", m)
	}
	deadline := time.Now().Add(time.Minute) // a hang guard
	for {
		st := callState(t, sh, 1)
		if st == "delivered" || st == "refunded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the paid grant is still %s after its tool became free and the call was answered: the client's money is kept for nothing", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSIGHUPPromptPriceNoRestartWarning changes a prompt's price with
// SIGHUP: it takes effect, and capvend does not claim a restart is needed.
func TestSIGHUPPromptPriceNoRestartWarning(t *testing.T) {
	t.Parallel()
	p := issuePrices()
	p.prompts = map[string]price{"summarize": {sats: 3}}
	p.resources = map[string]price{"example://readme": {sats: 2}}
	sh := startShop(t, shopOpts{prices: &p})
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	promptPrice := func() string {
		m, err := c.tryRPC(sess, "pl", "prompts/list", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(m.Result)
	}
	if !strings.Contains(promptPrice(), `"capvend/price":{"amount":3`) {
		t.Fatalf("prompts/list before: %s", promptPrice())
	}
	next := issuePrices()
	next.prompts = map[string]price{"summarize": {sats: 4}}
	next.resources = map[string]price{"example://readme": {sats: 5}}
	sh.reload(next, func() bool { return strings.Contains(promptPrice(), `"capvend/price":{"amount":4`) })
	if logs := sh.logs.String(); strings.Contains(logs, "only take effect after a restart") {
		t.Fatalf("a prompt and resource price change with SIGHUP was reported as needing a restart:\n%s", tail(logs, 4000))
	}
}
