package upstream

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/vend"
)

// envServeLegacy, with envServe, makes the stdio test server offer only
// protocol 2025-11-25, so that it elicits with elicitation/create.
const envServeLegacy = "CAPVEND_UPSTREAM_TEST_LEGACY"

// addAskTool adds "ask": it asks for a name (input_required, answered by
// mcp-go's client loop or, for an old client, turned by mcp-go into an
// elicitation/create) and returns the answer it got as JSON text.
func addAskTool(s *server.MCPServer) {
	s.AddTool(mcp.NewTool("ask"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if ans := server.ElicitationResponse(r.Params.InputResponses, "who"); ans != nil {
			b, _ := json.Marshal(ans.ElicitationResponse)
			return mcp.NewToolResultText(string(b)), nil
		}
		return server.NewInputRequestBuilder("upstream-state").Elicit("who", mcp.ElicitationParams{
			Message: "your name?",
			RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}}},
		}).ToolResult(), nil
	})
}

// stdioStreams returns the stdio test server's input and output. As an
// old-protocol server (envServeLegacy) it answers server/discover with
// "method not found" itself, as a server before 2026-07-28 does, so that
// mcp-go's client falls back to initialize and 2025-11-25.
func stdioStreams() (io.Reader, io.Writer) {
	if os.Getenv(envServeLegacy) == "" {
		return os.Stdin, os.Stdout
	}
	out := &stdinWriter{w: nopCloser{os.Stdout}}
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(sc.Bytes(), &msg) == nil && msg.Method == string(mcp.MethodServerDiscover) {
				b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": msg.ID,
					"error": map[string]any{"code": mcp.METHOD_NOT_FOUND, "message": "Method not found"}})
				_, _ = out.Write(append(b, '\n'))
				continue
			}
			if _, err := pw.Write(append(sc.Bytes(), '\n')); err != nil {
				return
			}
		}
		pw.Close()
	}()
	return pr, out
}

// answering returns an ElicitFunc accepting with name, recording the
// params it got.
func answering(name string, got *atomic.Value) vend.ElicitFunc {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		got.Store(string(params))
		return json.Marshal(map[string]any{"action": "accept", "content": map[string]any{"name": name}})
	}
}

func TestElicitation(t *testing.T) {
	modern := newTestServer("modern")
	hm := startHTTP(t, modern)
	old := newTestServer("old")
	ho := startHTTP(t, old, server.WithStreamableHTTPProtocolVersions(mcp.ProtocolVersion20251125))
	legacyStdio := stdioConfig(t, "oldstdio", "os_")
	legacyStdio.Env = append(legacyStdio.Env, envServeLegacy+"=1")
	e := newEvents()
	cfg := e.config(
		ServerConfig{Name: "web", Prefix: "w_", URL: hm.url()},
		ServerConfig{Name: "old", Prefix: "o_", URL: ho.url()},
		stdioConfig(t, "local", "l_"),
		legacyStdio,
	)
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "w_ask", "o_ask", "l_ask", "os_ask")
	// Both eras are exercised: the old upstreams elicit with
	// elicitation/create, the others with input_required. ("upstream
	// connected" is logged just after an upstream's tools are listed, so
	// it may still be on its way when waitTools returns.)
	deadline := time.Now().Add(10 * time.Second)
	for _, want := range []string{
		"upstream=web protocol=" + mcp.LATEST_PROTOCOL_VERSION,
		"upstream=local protocol=" + mcp.LATEST_PROTOCOL_VERSION,
		"upstream=old protocol=" + mcp.ProtocolVersion20251125,
		"upstream=oldstdio protocol=" + mcp.ProtocolVersion20251125,
	} {
		for !strings.Contains(logs.String(), want) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the log:\n%s", want, logs)
		}
	}

	for _, name := range []string{"w_ask", "o_ask", "l_ask", "os_ask"} {
		t.Run(name, func(t *testing.T) {
			var got atomic.Value
			ctx := vend.WithElicit(context.Background(), answering("ada", &got))
			body, err := m.CallTool(ctx, tool(t, m, name), nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if txt := text(t, body); txt != `{"action":"accept","content":{"name":"ada"}}` {
				t.Errorf("tool saw %s", txt)
			}
			var params struct {
				Message         string
				RequestedSchema map[string]any
			}
			s, _ := got.Load().(string)
			if err := json.Unmarshal([]byte(s), &params); err != nil || params.Message != "your name?" || params.RequestedSchema["type"] != "object" {
				t.Errorf("Elicit got params %s", s)
			}
		})
		t.Run(name+"/no elicit: declined", func(t *testing.T) {
			body, err := m.CallTool(context.Background(), tool(t, m, name), nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if txt := text(t, body); txt != `{"action":"decline"}` {
				t.Errorf("tool saw %s", txt)
			}
		})
		t.Run(name+"/elicit fails: cancelled", func(t *testing.T) {
			ctx := vend.WithElicit(context.Background(), func(context.Context, json.RawMessage) (json.RawMessage, error) {
				return nil, errors.New("client gone")
			})
			body, err := m.CallTool(ctx, tool(t, m, name), nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if txt := text(t, body); txt != `{"action":"cancel"}` {
				t.Errorf("tool saw %s", txt)
			}
		})
	}
}

// Concurrent calls each get their own answers where mcp-go hands the
// handler the call's context (protocol 2026-07-28, and Streamable HTTP
// before it): each Elicit waits until both calls are asking, so an
// elicitation routed by anything but its context would be declined (two
// calls in flight) and the wait would not end.
func TestElicitationConcurrentCalls(t *testing.T) {
	modern := newTestServer("modern")
	hm := startHTTP(t, modern)
	old := newTestServer("old")
	ho := startHTTP(t, old, server.WithStreamableHTTPProtocolVersions(mcp.ProtocolVersion20251125))
	e := newEvents()
	m, err := New(e.config(
		ServerConfig{Name: "web", Prefix: "w_", URL: hm.url()},
		ServerConfig{Name: "old", Prefix: "o_", URL: ho.url()},
		stdioConfig(t, "local", "l_"),
	))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "w_ask", "o_ask", "l_ask")
	for _, name := range []string{"w_ask", "o_ask", "l_ask"} {
		t.Run(name, func(t *testing.T) {
			ask := tool(t, m, name)
			var asking sync.WaitGroup
			asking.Add(2)
			both := make(chan struct{})
			go func() { asking.Wait(); close(both) }()
			type outcome struct {
				who  string
				body json.RawMessage
				err  error
			}
			results := make(chan outcome, 2)
			for _, who := range []string{"ada", "bob"} {
				go func() {
					elicit := func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
						asking.Done()
						select {
						case <-both:
						case <-time.After(waitLimit):
							return nil, errors.New("the other call never asked")
						}
						return json.Marshal(map[string]any{"action": "accept", "content": map[string]any{"name": who}})
					}
					body, err := m.CallTool(vend.WithElicit(context.Background(), elicit), ask, nil, nil, nil)
					results <- outcome{who, body, err}
				}()
			}
			got := map[string]bool{}
			for range 2 {
				o := <-results
				if o.err != nil {
					t.Fatalf("%s: %v", o.who, o.err)
				}
				got[o.who+": "+text(t, o.body)] = true
			}
			for _, who := range []string{"ada", "bob"} {
				if want := who + `: {"action":"accept","content":{"name":"` + who + `"}}`; !got[want] {
					t.Errorf("no %q in %v", want, got)
				}
			}
		})
	}
}
