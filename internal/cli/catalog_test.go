package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
)

// TestServePassesPromptsAndResourcesThrough runs `capvend serve` in-process
// over example-tools (free tools only, no payment backend) and lists, gets
// and reads its prompt and resource through an mcp-go client.
func TestServePassesPromptsAndResourcesThrough(t *testing.T) {
	cfg, listen := capvendtest.FreeToolsConfig(t, "ex_")
	startCapvend(t, cfg)
	ctx := context.Background()
	// A bound on waiting for the upstream: a deadlock guard.
	deadline := time.Now().Add(60 * time.Second)
	c, err := client.NewStreamableHttpClient("http://" + listen + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init, err := c.Initialize(ctx, capvendtest.PayingInit())
	if err != nil {
		t.Fatal(err)
	}
	if init.Capabilities.Prompts == nil || init.Capabilities.Resources == nil {
		t.Fatalf("capabilities %+v", init.Capabilities)
	}

	// The upstream may still be connecting.
	var prompts []mcp.Prompt
	for {
		res, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if prompts = res.Prompts; len(prompts) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no prompts listed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(prompts) != 1 || prompts[0].Name != "ex_summarize" || len(prompts[0].Arguments) != 1 ||
		prompts[0].Arguments[0].Name != "text" || !prompts[0].Arguments[0].Required {
		t.Fatalf("prompts %+v", prompts)
	}
	tl, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil || len(tl.Tools) != 5 {
		t.Fatalf("tools %+v %v", tl, err)
	}

	req := mcp.GetPromptRequest{}
	req.Params.Name = "ex_summarize"
	req.Params.Arguments = map[string]string{"text": "capvend sells tool calls"}
	gp, err := c.GetPrompt(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(gp.Messages) != 1 || gp.Messages[0].Role != mcp.RoleUser ||
		!strings.HasSuffix(gp.Messages[0].Content.(mcp.TextContent).Text, "\n\ncapvend sells tool calls") {
		t.Fatalf("prompt %+v", gp)
	}
	req.Params.Arguments = nil // the upstream refuses: an upstream error
	if _, err := c.GetPrompt(ctx, req); err == nil || !strings.Contains(err.Error(), "Upstream server failed") {
		t.Fatalf("prompt without text: %v", err)
	}

	res, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Resources) != 1 || res.Resources[0].URI != "example://readme" || res.Resources[0].MIMEType != "text/plain" {
		t.Fatalf("resources %+v", res.Resources)
	}
	rr := mcp.ReadResourceRequest{}
	rr.Params.URI = "example://readme"
	read, err := c.ReadResource(ctx, rr)
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Contents) != 1 || !strings.Contains(read.Contents[0].(mcp.TextResourceContents).Text, "word_count") {
		t.Fatalf("readme %+v", read.Contents)
	}
}
