// Package exampletools is the small MCP server shipped with capvend to sell
// in the demo and the tests: word_count (a free tool), sha256 (the priced
// one in the examples), slow_count (reports progress), always_fails (fails
// after payment, to show refunds) and confirm (asks the user to confirm,
// an elicitation), plus a prompt (summarize) and a resource
// (example://readme), which capvend passes through for free.
// cmd/example-tools serves it as a program; `capvend demo` runs it
// in-process.
package exampletools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// readmeURI is example-tools' one resource; readme its text.
const (
	readmeURI = "example://readme"
	readme    = "example-tools: word_count, sha256, slow_count and always_fails; prompt summarize(text).\n"
)

// NewServer returns the example MCP server: tools word_count, sha256,
// slow_count, always_fails and confirm, prompt summarize and resource
// example://readme. Serve it with mcp-go (stdio or Streamable HTTP).
func NewServer() *server.MCPServer {
	s := server.NewMCPServer("example-tools", "1.0.0", server.WithToolCapabilities(true),
		server.WithPromptCapabilities(true), server.WithResourceCapabilities(false, true))
	s.AddPrompt(mcp.NewPrompt("summarize",
		mcp.WithPromptDescription("Ask for a short summary of a text."),
		mcp.WithArgument("text", mcp.RequiredArgument(), mcp.ArgumentDescription("the text to summarize")),
	), func(ctx context.Context, r mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		text := r.Params.Arguments["text"]
		if text == "" {
			return nil, fmt.Errorf("argument text is required")
		}
		return mcp.NewGetPromptResult("Summarize a text", []mcp.PromptMessage{
			mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Summarize the following text in one sentence:\n\n"+text)),
		}), nil
	})
	s.AddResource(mcp.NewResource(readmeURI, "readme",
		mcp.WithResourceDescription("What example-tools offers."), mcp.WithMIMEType("text/plain"),
	), func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: readmeURI, MIMEType: "text/plain", Text: readme}}, nil
	})
	s.AddTool(mcp.NewTool("word_count",
		mcp.WithDescription("Count the words, lines and characters of a text."),
		mcp.WithString("text", mcp.Required(), mcp.MaxLength(1<<20), mcp.Description("the text")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, err := r.RequireString("text")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		lines := strings.Count(text, "\n")
		if text != "" && !strings.HasSuffix(text, "\n") {
			lines++
		}
		return mcp.NewToolResultText(fmt.Sprintf("%d words, %d lines, %d characters",
			len(strings.Fields(text)), lines, len([]rune(text)))), nil
	})
	s.AddTool(mcp.NewTool("sha256",
		mcp.WithDescription("The SHA-256 digest of a text, in hex."),
		mcp.WithString("text", mcp.Required(), mcp.MaxLength(1<<20), mcp.Description("the text to hash")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, err := r.RequireString("text")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		sum := sha256.Sum256([]byte(text))
		return mcp.NewToolResultText(hex.EncodeToString(sum[:])), nil
	})
	s.AddTool(mcp.NewTool("slow_count",
		mcp.WithDescription("Count to n, one step per 50 ms, reporting progress."),
		mcp.WithNumber("n", mcp.Required(), mcp.Min(1), mcp.Max(100), mcp.Description("how far to count")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		n, err := r.RequireInt("n")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		var token mcp.ProgressToken
		if r.Params.Meta != nil {
			token = r.Params.Meta.ProgressToken
		}
		srv := server.ServerFromContext(ctx)
		for i := 1; i <= n; i++ {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			if token != nil && srv != nil {
				srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
					"progressToken": token, "progress": i, "total": n,
				})
			}
		}
		return mcp.NewToolResultText(fmt.Sprintf("counted to %d", n)), nil
	})
	s.AddTool(mcp.NewTool("always_fails",
		mcp.WithDescription("Always fails: shows that a paid call whose tool fails is refunded."),
		mcp.WithString("text", mcp.Description("ignored")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultError("this tool always fails"), nil
	})
	s.AddTool(mcp.NewTool("confirm",
		mcp.WithDescription("Ask the user to confirm (an elicitation); returns confirmed or declined."),
		mcp.WithString("question", mcp.MaxLength(1000), mcp.Description("what to ask (default: Proceed?)")),
	), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// The answer comes back on a retry of the call (protocol
		// 2026-07-28; mcp-go does the same for older clients with
		// elicitation/create).
		if ans := server.ElicitationResponse(r.Params.InputResponses, "confirm"); ans != nil {
			content, _ := ans.Content.(map[string]any)
			if ans.Action == mcp.ElicitationResponseActionAccept && content["confirm"] == true {
				return mcp.NewToolResultText("confirmed"), nil
			}
			return mcp.NewToolResultText("declined"), nil
		}
		return server.NewInputRequestBuilder("").Elicit("confirm", mcp.ElicitationParams{
			Message: r.GetString("question", "Proceed?"),
			RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"confirm": map[string]any{"type": "boolean"}},
				"required":   []string{"confirm"}},
		}).ToolResult(), nil
	})
	return s
}
