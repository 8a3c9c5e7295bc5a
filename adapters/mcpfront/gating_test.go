package mcpfront

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
)

// TestCapabilityDecidesTheFlow: a client that declared the capvend/payments
// capability keeps the notifications flow; any other (a stock MCP host)
// gets explicit gating with payment tokens: per session over HTTP before
// protocol 2026-07-28 and over stdio, per request with 2026-07-28. With
// LegacyGatingCode nothing is decided for the client. (Before: every
// client without _meta got the notifications flow, which stock hosts
// ignore: the call waited silently until the quote expired.)
func TestCapabilityDecidesTheFlow(t *testing.T) {
	const declared = `"capabilities":{"experimental":{"capvend/payments":{}}}`
	for _, tc := range []struct {
		name             string
		legacy, paying   bool
		wantExplicit     bool
		wantPaymentToken bool
		via              string // raw (HTTP 2025-11-25 session), modern (mcp-go, 2026-07-28), stdio
	}{
		{"http session, stock", false, false, true, true, "raw"},
		{"http session, declared", false, true, false, true, "raw"},
		{"http 2026-07-28, stock", false, false, true, true, "modern"},
		{"http 2026-07-28, declared", false, true, false, true, "modern"},
		{"stdio, stock", false, false, true, true, "stdio"},
		{"stdio, declared", false, true, false, true, "stdio"},
		{"legacy gating, stock", true, false, false, false, "raw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, fv := newServer(t, Config{LegacyGatingCode: tc.legacy})
			init := mcp.InitializeRequest{}
			if tc.paying {
				init = payingInit()
			}
			switch tc.via {
			case "raw":
				r := &rawSession{t: t, url: startHTTP(t, s)}
				caps := `"capabilities":{}`
				if tc.paying {
					caps = declared
				}
				msgs, resp := r.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",` + caps + `,"clientInfo":{"name":"raw","version":"1"}}}`)
				if len(msgs) != 1 {
					t.Fatalf("initialize: %s", msgs)
				}
				r.sid = resp.Header.Get("Mcp-Session-Id")
				r.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
				r.post(call(`1`, "paid", ``))
			case "modern":
				c, err := client.NewStreamableHttpClient(startHTTP(t, s))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if err := c.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Initialize(context.Background(), init); err != nil || !mcp.IsModernProtocol(c.ProtocolVersion()) {
					t.Fatalf("initialize: %v %s", err, c.ProtocolVersion())
				}
				req := mcp.CallToolRequest{}
				req.Params.Name = "paid"
				c.CallTool(context.Background(), req)
			case "stdio":
				c, stop := startStdio(t, s)
				defer stop()
				if _, err := c.Initialize(context.Background(), init); err != nil {
					t.Fatal(err)
				}
				req := mcp.CallToolRequest{}
				req.Params.Name = "paid"
				c.CallTool(context.Background(), req)
			}
			got := fv.last()
			if got.Name != "paid" || got.Explicit != tc.wantExplicit || got.PaymentTokens != tc.wantPaymentToken {
				t.Fatalf("call request: tool %s explicit %v tokens %v; want explicit %v tokens %v", got.Name, got.Explicit, got.PaymentTokens,
					tc.wantExplicit, tc.wantPaymentToken)
			}
		})
	}
}

// TestPricedToolsListPaymentArg: a priced tool's listed inputSchema gains
// the optional string property capvend_payment, described for the model;
// its own properties and required list stay; free tools, and legacy
// gating, list the schema as the upstream gave it.
func TestPricedToolsListPaymentArg(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		s, _ := newServer(t, Config{LegacyGatingCode: legacy})
		r := newRawSession(t, startHTTP(t, s))
		msgs, _ := r.post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
		var res struct {
			Result struct {
				Tools []struct {
					Name        string
					InputSchema struct {
						Type       string
						Properties map[string]struct{ Type, Description string }
						Required   []string
					}
				}
			}
		}
		if len(msgs) != 1 || json.Unmarshal(msgs[0], &res) != nil || len(res.Result.Tools) != len(fakeTools) {
			t.Fatalf("tools/list: %s", msgs)
		}
		for _, tl := range res.Result.Tools {
			p, has := tl.InputSchema.Properties["capvend_payment"]
			priced := false
			for _, ft := range fakeTools {
				priced = priced || (ft.Name == tl.Name && ft.Price > 0)
			}
			if has != (priced && !legacy) || tl.InputSchema.Type != "object" {
				t.Errorf("legacy %v: %s lists %+v", legacy, tl.Name, tl.InputSchema)
			}
			if has && (p.Type != "string" || !strings.Contains(p.Description, "payment token")) {
				t.Errorf("%s: capvend_payment %+v", tl.Name, p)
			}
			for _, req := range tl.InputSchema.Required {
				if req == "capvend_payment" {
					t.Errorf("%s: capvend_payment required", tl.Name)
				}
			}
			if tl.Name == "free" && (len(tl.InputSchema.Required) != 1 || tl.InputSchema.Properties["text"].Type != "string") {
				t.Errorf("free: %+v", tl.InputSchema)
			}
		}
	}
	// An upstream schema with properties keeps them.
	schema := json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`)
	got := withPaymentArg(schema, false)
	if !strings.Contains(string(got), `"text":{"type":"string"}`) || !strings.Contains(string(got), `"required":["text"]`) ||
		!strings.Contains(string(got), `"additionalProperties":false`) || !strings.Contains(string(got), `"capvend_payment":{"type":"string"`) ||
		strings.Contains(string(got), "capvend_credit") {
		t.Fatalf("%s", got)
	}
	// A server selling credit also offers the credit token argument.
	if got := withPaymentArg(schema, true); !strings.Contains(string(got), `"capvend_credit":{"type":"string"`) {
		t.Fatalf("%s", got)
	}
}

// TestTokenSeedsUseTheToken: the fuzz seeds with payment tokens do reach
// the token path: a stock host's paid call runs exactly once through its
// token, and the reuse and other-arguments retries run nothing.
func TestTokenSeedsUseTheToken(t *testing.T) {
	for _, name := range []string{"token: stock host pays and retries", "token: session-less", "token: other arguments",
		"token: concurrent retries"} {
		t.Run(name, func(t *testing.T) {
			var seq string
			for _, s := range fuzzSeeds {
				if s.name == name {
					seq = s.seq
				}
			}
			h := runSequence(t, seq)
			h.check(t)
			if len(h.calls) == 0 || h.calls[0].token == "" {
				t.Fatal("no token handed out")
			}
			h.tools.mu.Lock()
			defer h.tools.mu.Unlock()
			if len(h.tools.runs) != 1 {
				t.Fatalf("%d executions, want 1: %+v", len(h.tools.runs), h.tools.runs)
			}
		})
	}
}
