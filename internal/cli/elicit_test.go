package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/internal/testkit"
)

// confirmer answers elicitations: accept {"confirm": yes}, or decline.
type confirmer struct {
	yes   bool
	asked chan string
}

func (c *confirmer) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	c.asked <- req.Params.Message
	if !c.yes {
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionDecline}}, nil
	}
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
		Action: mcp.ElicitationResponseActionAccept, Content: map[string]any{"confirm": true}}}, nil
}

// TestServeElicitation runs `capvend serve` in-process over example-tools
// and calls its confirm tool, which asks the user, through mcp-go clients
// that answer: on protocol 2026-07-28 and on 2025-11-25, accepting and
// declining. The upstream (a stdio child, protocol 2026-07-28) asks with
// an input_required result; capvend relays it to the client and the
// answer back.
func TestServeElicitation(t *testing.T) {
	cfg, listen := capvendtest.FreeToolsConfig(t, "t_")
	startCapvend(t, cfg)
	for _, tc := range []struct {
		name    string
		version string
		yes     bool
		want    string
	}{
		{"modern accept", "", true, "confirmed"},
		{"modern decline", "", false, "declined"},
		{"legacy accept", mcp.ProtocolVersion20251125, true, "confirmed"},
		{"legacy decline", mcp.ProtocolVersion20251125, false, "declined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			tr, err := transport.NewStreamableHTTP("http://" + listen + "/mcp")
			if err != nil {
				t.Fatal(err)
			}
			h := &confirmer{yes: tc.yes, asked: make(chan string, 10)}
			opts := []client.ClientOption{client.WithElicitationHandler(h)}
			if tc.version != "" {
				opts = append(opts, client.WithProtocolVersion(tc.version))
			}
			c := client.NewClient(tr, opts...)
			defer c.Close()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Initialize(ctx, capvendtest.PayingInit()); err != nil {
				t.Fatal(err)
			}
			if tc.version != "" && c.ProtocolVersion() != tc.version {
				t.Fatalf("protocol %s", c.ProtocolVersion())
			}
			capvendtest.WaitTools(t, c, listed.All("t_confirm"))
			req := mcp.CallToolRequest{}
			req.Params.Name = "t_confirm"
			req.Params.Arguments = map[string]any{"question": "Delete everything?"}
			res, err := c.CallTool(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Content) != 1 || res.IsError {
				t.Fatalf("result %+v", res)
			}
			if txt, _ := res.Content[0].(mcp.TextContent); txt.Text != tc.want {
				t.Errorf("result %q, want %q", txt.Text, tc.want)
			}
			select {
			case q := <-h.asked:
				if q != "Delete everything?" {
					t.Errorf("asked %q", q)
				}
			default:
				t.Error("the client was not asked")
			}
		})
	}
}

// TestContextVMElicitation runs `capvend serve` in-process, Nostr front on
// an in-process relay, over example-tools, and calls its confirm tool
// from a Go ContextVM client that declared the elicitation capability:
// the upstream's question reaches the client as a JSON-RPC
// elicitation/create request of the server (kind 25910, tagged p and e),
// and the client's response (a kind 25910 JSON-RPC response with that id)
// goes back to the upstream. A client that did not declare the capability
// is not asked: the upstream is declined.
func TestContextVMElicitation(t *testing.T) {
	relay := testkit.Relay(t)
	sk := nostr.GeneratePrivateKey()
	server, _ := nostr.GetPublicKey(sk)
	path, _ := capvendtest.NostrToolsConfig(t, relay, sk, "ex_")
	startCapvend(t, path)

	seq := 0
	// ask sends content (its id %d is a new number, so a new event) and
	// returns the answer, failing on notifications.
	ask := func(c *cvmClient, content string) (*nostr.Event, cvmMessage) {
		t.Helper()
		seq++
		req := c.request(fmt.Sprintf(content, seq))
		return req, c.until(req, func(m cvmMessage) { t.Fatalf("unexpected %s %s", m.Method, m.Params) })
	}
	const (
		initialize = `{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}}`
		confirm    = `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ex_confirm","arguments":{"question":"Delete everything?"}}}`
	)
	c := dialContextVM(t, relay, server)
	c.waitReady()
	ask(c, initialize)
	for i := 0; ; i++ { // the upstream may still be connecting
		_, m := ask(c, `{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`)
		if strings.Contains(string(m.Result), `"name":"ex_confirm"`) {
			break
		}
		if i == 300 { // a hang guard
			t.Fatalf("ex_confirm never listed: %s", m.Result)
		}
		time.Sleep(200 * time.Millisecond)
	}

	for _, tc := range []struct {
		answer, want string
	}{
		{`{"action":"accept","content":{"confirm":true}}`, "confirmed"},
		{`{"action":"decline"}`, "declined"},
	} {
		seq++
		req := c.request(fmt.Sprintf(confirm, seq))
		m, ok := c.next(req, 2*time.Minute) // a hang guard
		var p struct {
			Message string `json:"message"`
		}
		var id string
		if !ok || m.Method != "elicitation/create" || json.Unmarshal(m.ID, &id) != nil || len(id) != 64 ||
			json.Unmarshal(m.Params, &p) != nil || p.Message != "Delete everything?" {
			t.Fatalf("not asked: %+v (%s)", m, m.Params)
		}
		c.publish(c.event(`{"jsonrpc":"2.0","id":"` + id + `","result":` + tc.answer + `}`))
		res := c.until(req, func(m cvmMessage) { t.Errorf("notification %s", m.Method) })
		var r struct {
			Content []struct{ Text string } `json:"content"`
			IsError bool                    `json:"isError"`
		}
		if res.Error != nil || json.Unmarshal(res.Result, &r) != nil || len(r.Content) != 1 || r.IsError || r.Content[0].Text != tc.want {
			t.Fatalf("answer %s %+v, want %s", res.Result, res.Error, tc.want)
		}
	}

	// A client without the capability: declined without a question.
	other := dialContextVM(t, relay, server)
	ask(other, strings.Replace(initialize, `"elicitation":{}`, ``, 1))
	if _, m := ask(other, confirm); !strings.Contains(string(m.Result), `"declined"`) {
		t.Fatalf("answer %s %+v", m.Result, m.Error)
	}
}
