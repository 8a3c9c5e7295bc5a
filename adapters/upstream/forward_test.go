package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/server"
)

// TestCallToolForwardsTheArgumentsBytes: CallTool sends the arguments
// vend gives it as they are (vend parsed, priced and hashed exactly these
// bytes), not a re-parse of them: key order and the spelling of numbers
// reach the upstream unchanged.
func TestCallToolForwardsTheArgumentsBytes(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	mcp := server.NewStreamableHTTPServer(newTestServer("capture"))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		mcp.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e := newEvents()
	m, err := New(e.config(ServerConfig{Name: "cap", Prefix: "c_", URL: ts.URL + "/mcp"}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "c_echo")
	const args = `{"big":123456789012345678901234567890,"n":1.50,"text":"hi","z":[1e3,{"b":null,"a":true}]}`
	body, err := m.CallTool(context.Background(), tool(t, m, "c_echo"), json.RawMessage(args), nil, nil)
	if err != nil || text(t, body) != "capture:hi" {
		t.Fatalf("%s %v", body, err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bodies {
		if strings.Contains(b, `"tools/call"`) {
			if !strings.Contains(b, `"arguments":`+args) {
				t.Fatalf("the upstream got %s, want the arguments %s as they are", b, args)
			}
			return
		}
	}
	t.Fatalf("no tools/call sent: %q", bodies)
}
