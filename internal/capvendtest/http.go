package capvendtest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/mcpfront"
)

func Get(t testing.TB, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Post sends one JSON-RPC message to url with the headers and returns the
// status, the response headers and the body.
func Post(t testing.TB, url, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func Text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// PayingInit is the initialize of a capvend-aware client: it declares the
// capvend/payments capability, so it gets the payment notifications (a
// client without it gets explicit gating as a tool result).
func PayingInit() mcp.InitializeRequest {
	var r mcp.InitializeRequest
	r.Params.Capabilities.Experimental = map[string]any{mcpfront.CapabilityPayments: map[string]any{}}
	return r
}

// MCPPost sends one JSON-RPC message on an MCP Streamable HTTP session
// (2025-11-25) and calls each JSON-RPC message of the answer (JSON, or an
// SSE stream) until each returns false or the answer ends. It returns the
// response's session id.
func MCPPost(t testing.TB, url, sid, body string, each func(msg json.RawMessage) bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // closing mid-stream is the client dropping it
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		if len(strings.TrimSpace(string(b))) > 0 {
			each(json.RawMessage(b))
		}
		return resp.Header.Get("Mcp-Session-Id")
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && !each(json.RawMessage(d)) {
			break
		}
	}
	return resp.Header.Get("Mcp-Session-Id")
}
