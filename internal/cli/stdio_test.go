package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
)

// TestServeStdio runs `capvend serve --stdio` as a desktop MCP client would
// launch it, speaking MCP over its standard input and output, and lists and
// calls a free tool through it.
func TestServeStdio(t *testing.T) {
	cfg, _ := capvendtest.FreeToolsConfig(t, "ex_")
	inR, inW := io.Pipe()   // client -> capvend stdin
	outR, outW := io.Pipe() // capvend stdout -> client
	sv := startCapvend(t, cfg, capvendtest.Options{Args: []string{"serve", "--stdio", "--config", cfg}, Stdin: inR, Stdout: outW})
	c := client.NewClient(transport.NewIO(outR, inW, io.NopCloser(strings.NewReader(""))))
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ccancel()
	if err := c.Start(cctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(cctx, capvendtest.PayingInit()); err != nil {
		t.Fatal(err)
	}
	// The upstream may still be connecting: a bounded wait.
	for {
		tools, err := c.ListTools(cctx, mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(tools.Tools) == 5 {
			break
		}
		select {
		case <-cctx.Done():
			t.Fatalf("tools: %+v", tools.Tools)
		case <-time.After(20 * time.Millisecond):
		}
	}
	res, err := c.CallTool(cctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "ex_word_count",
		Arguments: map[string]any{"text": "over stdio"}}})
	if err != nil || capvendtest.Text(res) != "2 words, 1 lines, 10 characters" {
		t.Fatalf("call: %v %v", res, err)
	}
	inW.Close() // the client goes away: serve --stdio ends
	if code := sv.Wait(); code != 0 {
		t.Fatalf("serve --stdio exited %d", code)
	}
	outW.Close()
	c.Close()
}
