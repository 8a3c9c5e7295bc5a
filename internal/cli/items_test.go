package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/vend"
)

// TestServeSellsPromptsAndResourcesOverMCPHTTP: example-tools' prompt
// summarize (3 sats) and resource example://readme (1.5 sats) are priced
// on the stdio upstream; a real mcp-go client gets them through `capvend
// serve` over MCP HTTP, the customer node pays each hold invoice from
// payment_required, the same prompt of the HTTP upstream stays free, the
// journal books income:prompts and income:resources, and the ledger
// verifies.
func TestServeSellsPromptsAndResourcesOverMCPHTTP(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{hold: true, items: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	pc := capvendtest.NewPayingClient(t, s, url)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	prices := map[string]any{}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := pc.ListPrompts(ctx, mcp.ListPromptsRequest{})
		if err == nil && len(ps.Prompts) == 2 {
			for _, p := range ps.Prompts {
				if p.Meta != nil {
					prices[p.Name] = p.Meta.AdditionalFields["capvend/price"]
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prompts: %+v %v", ps, err)
		}
		time.Sleep(200 * time.Millisecond) // upstreams connecting
	}
	if fmt.Sprint(prices["t_summarize"]) != "map[amount:3 unit:sats]" || prices["w_summarize"] != nil {
		t.Fatalf("prices in prompts/list: %v", prices)
	}
	rs, err := pc.ListResources(ctx, mcp.ListResourcesRequest{})
	if err != nil || len(rs.Resources) != 1 || rs.Resources[0].Meta == nil ||
		fmt.Sprint(rs.Resources[0].Meta.AdditionalFields["capvend/price"]) != "map[amount:2 unit:sats]" {
		t.Fatalf("resources/list: %+v %v", rs, err)
	}

	// The free prompt: no payment.
	free, err := pc.GetPrompt(ctx, mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "w_summarize", Arguments: map[string]string{"text": "free"}}})
	if err != nil || len(free.Messages) != 1 || len(pc.Methods()) != 0 {
		t.Fatalf("free prompt: %+v %v %v", free, err, pc.Methods())
	}

	before := capvendtest.CustomerBalance(t, s)
	res, err := pc.GetPrompt(ctx, mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "t_summarize", Arguments: map[string]string{"text": "sold for sats"}}})
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("priced prompt: %+v %v (notes %v)", res, err, pc.Methods())
	}
	if tc, ok := res.Messages[0].Content.(mcp.TextContent); !ok || !strings.HasSuffix(tc.Text, "sold for sats") {
		t.Fatalf("priced prompt message %+v", res.Messages[0])
	}
	if err := <-pc.Paid; err != nil {
		t.Fatalf("prompt payment: %v", err)
	}
	read, err := pc.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "example://readme"}})
	if err != nil || len(read.Contents) != 1 {
		t.Fatalf("priced resource: %+v %v (notes %v)", read, err, pc.Methods())
	}
	if tc, ok := read.Contents[0].(mcp.TextResourceContents); !ok || !strings.HasPrefix(tc.Text, "example-tools:") {
		t.Fatalf("priced resource contents %+v", read.Contents[0])
	}
	if err := <-pc.Paid; err != nil {
		t.Fatalf("resource payment: %v", err)
	}
	if got := strings.Join(pc.Methods(), ","); got != "notifications/payment_required,notifications/payment_accepted,notifications/payment_required,notifications/payment_accepted" {
		t.Fatalf("notifications %s", got)
	}
	if spent := before - capvendtest.CustomerBalance(t, s); spent != 4_500 {
		t.Fatalf("customer spent %d msat, want 4500", spent)
	}

	l := ledgerkit.OpenVerified(t, db)
	b, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, tr := range b.Tools {
		got[tr.Account] = int64(tr.Revenue)
	}
	if got["income:prompts:tools:summarize"] != 3_000 || got["income:resources:tools:example---readme"] != 1_500 || len(got) != 2 {
		t.Fatalf("revenue %v", got)
	}
}

// TestContextVMSellsPrompts: the same priced prompt bought over the Nostr
// front (ContextVM) on the stack's relay: prompts/list shows its price,
// payment_required comes first, the customer node pays, the result
// follows; the journal books income:prompts and the ledger verifies.
func TestContextVMSellsPrompts(t *testing.T) {
	s := needStack(t)
	server, nsec := capvendtest.ServerKey(t)
	path, _ := writeServeConfig(t, s, serveOpts{nsecFile: nsec, items: true})
	db := filepath.Join(filepath.Dir(path), "capvend.db")
	startCapvend(t, path)
	c := dialContextVM(t, s.RelayURL, server)
	c.waitReady()

	c.waitNames("prompts/list", "t_summarize") // the upstream may still be connecting
	list := c.until(c.request(`{"jsonrpc":"2.0","id":1,"method":"prompts/list"}`), func(cvmMessage) {})
	if !strings.Contains(string(list.Result), `"capvend/price":{"amount":3,"unit":"sats"}`) {
		t.Fatalf("prompts/list %s", list.Result)
	}

	req := c.request(`{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"t_summarize","arguments":{"text":"paid over nostr"}}}`,
		nostr.Tag{"pmi", vend.PMILightning})
	res, notes, paid := c.untilPaid(s, req)
	if res.Error != nil || !strings.Contains(string(res.Result), "paid over nostr") {
		t.Fatalf("prompts/get: %s %+v (notifications %v)", res.Result, res.Error, notes)
	}
	if len(notes) == 0 || notes[0] != vend.NotifyPaymentRequired {
		t.Fatalf("notifications %v", notes)
	}
	if err := paid(); err != nil {
		t.Fatal(err)
	}

	l := ledgerkit.OpenVerified(t, db)
	b, _ := l.Balance(context.Background())
	if len(b.Tools) != 1 || b.Tools[0].Account != "income:prompts:tools:summarize" || b.Tools[0].Revenue != 3_000 {
		t.Fatalf("revenue %+v", b.Tools)
	}
}
