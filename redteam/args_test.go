package redteam

import (
	"strconv"
	"strings"
	"testing"
)

// Issue 11, "Arguments are parsed once: duplicate or case-variant keys are
// refused (-32602), and what is priced is exactly what is forwarded."

// codeInvalidParams is JSON-RPC's -32602.
const codeInvalidParams = -32602

// ambiguousArgs are argument objects whose meaning depends on the parser:
// a duplicate key (first or last wins) and a case variant (a
// case-insensitive parser may take either).
var ambiguousArgs = []struct{ name, json string }{
	{"duplicate key", `{"text":"cheap","text":"` + expensive + `"}`},
	{"case variant", `{"text":"cheap","Text":"` + expensive + `"}`},
	{"case variant only", `{"TEXT":"` + expensive + `"}`},
}

// rawCall is a tools/call request whose arguments are the raw JSON args,
// under explicit gating (so an unpaid call is answered at once).
func rawCall(id, tool, args string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + tool +
		`","arguments":` + args + `,"_meta":{"capvend/payment_interaction":"explicit_gating"}}}`
}

// nothingCharged fails the test if the ledger recorded any call or free use.
func nothingCharged(t *testing.T, sh *shop) {
	t.Helper()
	calls, free := readLedger(t, sh.db)
	if len(calls) > 0 || len(free) > 0 {
		t.Errorf("ambiguous arguments were recorded: %d calls, %d free uses", len(calls), len(free))
	}
}

func TestDuplicateArgumentKeys(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, name string, m rpcMessage) {
		t.Helper()
		if m.Error == nil || m.Error.Code != codeInvalidParams {
			t.Errorf("%s: %s, want error %d", name, m, codeInvalidParams)
		}
	}
	t.Run("mcp-http", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{})
		c := newHTTPClient(t, sh)
		sess := c.initialize()
		for i, a := range ambiguousArgs {
			for j, tool := range []string{"sha256", "word_count"} {
				st, err := c.postRaw(sess, rawCall(strconv.Itoa(10*i+j), tool, a.json), nil)
				if err != nil {
					t.Fatal(err)
				}
				m, _ := untilResponse(t, st, nil)
				st.close()
				check(t, tool+" with a "+a.name, m)
			}
		}
		nothingCharged(t, sh)
	})
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		sh, c := startStdioShop(t, shopOpts{})
		for i, a := range ambiguousArgs {
			for j, tool := range []string{"sha256", "word_count"} {
				id := strconv.Itoa(10*i + j)
				c.send(rawCall(`"`+id+`"`, tool, a.json))
				check(t, tool+" with a "+a.name, c.untilResponse(id, nil))
			}
		}
		nothingCharged(t, sh)
	})
	t.Run("contextvm", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{nostr: true})
		c := dialNostr(t, sh)
		c.waitReady()
		for i, a := range ambiguousArgs {
			for j, tool := range []string{"sha256", "word_count"} {
				ev := c.build(ctxvmPlain, nil, "", nil, explicitTag())
				ev.Content = rawCall(strconv.Itoa(10*i+j), tool, a.json)
				if err := ev.Sign(c.sk); err != nil {
					t.Fatal(err)
				}
				id := c.publish(ctxvmPlain, ev)
				m := c.untilResponse(id, nil)
				check(t, tool+" with a "+a.name, m.rpcMessage)
			}
		}
		nothingCharged(t, sh)
	})
}

// TestPricedURITemplate prices resources by the URI template
// "example://{name}": example-tools lists the resource example://readme,
// which matches it, so it must be listed with the price and sold, not
// read for free.
func TestPricedURITemplate(t *testing.T) {
	t.Parallel()
	p := issuePrices()
	p.resources = map[string]price{"example://{name}": {sats: 2}}
	sh := startShop(t, shopOpts{prices: &p})
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	list, err := c.tryRPC(sess, 1, "resources/list", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(list.Result), `"uri":"example://readme"`) {
		t.Fatalf("resources/list: %s", list)
	}
	if !strings.Contains(string(list.Result), `"capvend/price":{"amount":2`) {
		t.Errorf("example://readme matches the priced template example://{name} but is listed without its price: %s", list.Result)
	}
	m, err := c.tryRPC(sess, 2, "resources/read", map[string]any{"uri": "example://readme", "_meta": explicit()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Error == nil || m.Error.Code != 402 {
		t.Fatalf("resources/read example://readme (priced by template, unpaid, explicit gating): %s, want 402", m)
	}
}
