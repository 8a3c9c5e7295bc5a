package main

import (
	"context"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
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
	cfg, listen := freeToolsConfig(t, "t_")
	serveInProcess(t, cfg, listen)
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
			if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
				t.Fatal(err)
			}
			if tc.version != "" && c.ProtocolVersion() != tc.version {
				t.Fatalf("protocol %s", c.ProtocolVersion())
			}
			waitTool(t, c, "t_confirm")
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

// waitTool waits (bounded) until c lists name: the upstream may still be
// connecting.
func waitTool(t *testing.T, c *client.Client, name string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		tl, err := c.ListTools(context.Background(), mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range tl.Tools {
			if tool.Name == name {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listed", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
