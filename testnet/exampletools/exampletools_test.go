package exampletools_test

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/testnet/exampletools"
)

// TestCallsLog executes a tool, a prompt and a resource: each is one
// calls-log line, written before the answer, with what the server got.
func TestCallsLog(t *testing.T) {
	var log syncbuf.Buffer
	c, err := client.NewInProcessClient(exampletools.NewServerWith(exampletools.Options{CallsLog: &log}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	lines := func() []exampletools.Record {
		out, err := exampletools.ReadCallsLog(bytes.NewReader(log.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if _, err := c.ListTools(ctx, mcp.ListToolsRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := len(lines()); n != 0 {
		t.Fatalf("tools/list wrote %d lines: only executions are logged", n)
	}
	if _, err := c.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "sha256", Arguments: map[string]any{"text": "hi"}}}); err != nil {
		t.Fatal(err)
	}
	if got := lines(); len(got) != 1 {
		t.Fatalf("after the call: %+v", got)
	}
	if _, err := c.GetPrompt(ctx, mcp.GetPromptRequest{Params: mcp.GetPromptParams{Name: "summarize", Arguments: map[string]string{"text": "t"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: "example://readme"}}); err != nil {
		t.Fatal(err)
	}
	got := lines()
	if len(got) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(got), got)
	}
	for i, want := range []struct{ method, name, args string }{
		{exampletools.MethodTool, "sha256", `{"text":"hi"}`},
		{exampletools.MethodGet, "summarize", `{"text":"t"}`},
		{exampletools.MethodRead, "example://readme", ``},
	} {
		r := got[i]
		if r.Method != want.method || r.Name != want.name || string(r.Arguments) != want.args || r.Time.IsZero() {
			t.Errorf("line %d: %+v, want %s %s %s", i, r, want.method, want.name, want.args)
		}
	}
}

// TestBulkText: bulk's text is exactly kib KiB of valid UTF-8.
func TestBulkText(t *testing.T) {
	for _, kib := range []int{1, 3, 1024} {
		s := exampletools.BulkText(kib)
		if len(s) != kib*1024 || !utf8.ValidString(s) {
			t.Fatalf("BulkText(%d): %d bytes, valid UTF-8 %v", kib, len(s), utf8.ValidString(s))
		}
	}
}
