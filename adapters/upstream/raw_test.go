package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// progressSeen gets a value each time the test's progress callback ran:
// the tool "progress" waits for it after each notification, so that the
// notification is not lost (mcp-go's server may drop one queued just
// before its handler returns).
var progressSeen = make(chan struct{}, 16)

// addRawTools adds tools whose results mcp-go's client normalises (key
// order, number forms, _meta members) and that send progress, or fail.
func addRawTools(s *server.MCPServer) {
	s.AddTool(mcp.NewTool("rich"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res := mcp.NewToolResultStructured(map[string]any{"n": 1.0, "big": 12345678901234567890.0, "s": "é<&>"}, "text <b>")
		res.Content = append(res.Content, mcp.NewImageContent("aGk=", "image/png"))
		res.Meta = &mcp.Meta{AdditionalFields: map[string]any{"x/extra": []any{1, "two"}}}
		return res, nil
	})
	s.AddTool(mcp.NewTool("progress"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if r.Params.Meta != nil && r.Params.Meta.ProgressToken != nil {
			for i := 1; i <= 2; i++ {
				err := server.ServerFromContext(ctx).SendNotificationToClient(ctx, "notifications/progress",
					map[string]any{"progressToken": r.Params.Meta.ProgressToken, "progress": i, "total": 2, "message": "step"})
				if err != nil {
					return nil, err
				}
				select {
				case <-progressSeen:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		return mcp.NewToolResultText("done"), nil
	})
	s.AddTool(mcp.NewTool("rpcerror"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, errors.New("the handler failed")
	})
	s.AddTool(mcp.NewToolWithRawSchema("headers", "", json.RawMessage(`{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}`)),
		func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("ok"), nil
		})
}

// TestCallToolRawAsCallTool: on an HTTP or stdio upstream of protocol
// 2026-07-28, CallToolRaw gives the bytes CallTool gives (results, tool
// errors, progress with the caller's token put back, JSON-RPC errors as
// ErrUpstream), and hands an upstream's request for input back
// (ErrNotRaw). Older upstreams, and tools of an HTTP upstream mirroring
// arguments into headers, are not raw.
func TestCallToolRawAsCallTool(t *testing.T) {
	hs := newTestServer("web")
	addRawTools(hs)
	h := startHTTP(t, hs)
	old := newTestServer("old")
	ho := startHTTP(t, old, server.WithStreamableHTTPProtocolVersions(mcp.ProtocolVersion20251125))
	e := newEvents()
	m, err := New(e.config(
		ServerConfig{Name: "web", Prefix: "w_", URL: h.url()},
		ServerConfig{Name: "old", Prefix: "o_", URL: ho.url()},
		stdioConfig(t, "local", "l_"),
	))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "w_rich", "w_headers", "o_echo", "l_echo")

	for _, tc := range []struct{ tool string }{{"o_echo"}, {"w_headers"}} {
		if m.CanCallRaw(tool(t, m, tc.tool)) {
			t.Errorf("%s: raw", tc.tool)
		}
	}

	ctx := context.Background()
	for _, tc := range []struct {
		tool, args, token string
	}{
		{"w_echo", `{"text":"hi"}`, ``},
		{"w_echo", `{ "text" : "spaced" }`, ``},
		{"w_fail", `{}`, ``},
		{"w_rich", `{}`, ``},
		{"w_progress", `{}`, `"tok-1"`},
		{"w_progress", `{}`, `7`},
		{"w_progress", `{}`, ``},
		{"w_rpcerror", `{}`, ``},
		{"l_echo", `{"text":"hi"}`, ``},
		{"l_echo", `{"text":1}`, ``},
		{"l_fail", `{}`, ``},
		{"l_pid", `{}`, ``},
	} {
		t.Run(tc.tool+" "+tc.args+" "+tc.token, func(t *testing.T) {
			tl := tool(t, m, tc.tool)
			if !m.CanCallRaw(tl) {
				t.Fatal("not raw")
			}
			var tok json.RawMessage
			if tc.token != "" {
				tok = json.RawMessage(tc.token)
			}
			var mu sync.Mutex
			var rawNotes, notes []string
			record := func(to *[]string) func(json.RawMessage) {
				return func(p json.RawMessage) {
					mu.Lock()
					*to = append(*to, string(p))
					mu.Unlock()
					progressSeen <- struct{}{}
				}
			}
			got, gerr := m.CallToolRaw(ctx, tl, json.RawMessage(tc.args), tok, record(&rawNotes))
			want, werr := m.CallTool(ctx, tl, json.RawMessage(tc.args), tok, record(&notes))
			if string(got) != string(want) || (gerr == nil) != (werr == nil) || errors.Is(gerr, vend.ErrUpstream) != errors.Is(werr, vend.ErrUpstream) {
				t.Errorf("raw: %s %v\nclient: %s %v", got, gerr, want, werr)
			}
			mu.Lock()
			defer mu.Unlock()
			// Both notifications, each as the client path passes it on.
			var sent []string
			if tc.token != "" {
				for i := 1; i <= 2; i++ {
					sent = append(sent, `{"_meta":{},"message":"step","progress":`+strconv.Itoa(i)+`,"progressToken":`+tc.token+`,"total":2}`)
				}
			}
			if !slices.Equal(rawNotes, sent) || !slices.Equal(notes, sent) {
				t.Errorf("progress raw %q\nclient %q\nwant %q", rawNotes, notes, sent)
			}
		})
	}

	t.Run("asks for input", func(t *testing.T) {
		for _, name := range []string{"w_ask", "l_ask"} {
			_, err := m.CallToolRaw(ctx, tool(t, m, name), json.RawMessage(`{}`), nil, nil)
			if !errors.Is(err, vend.ErrNotRaw) {
				t.Fatalf("%s: %v, want ErrNotRaw", name, err)
			}
		}
	})

	t.Run("stdio progress", func(t *testing.T) {
		// l_slow sends two notifications, then waits for l_release.
		slow := func(call func(context.Context, vend.Item, json.RawMessage, json.RawMessage, func(json.RawMessage)) (json.RawMessage, error)) (string, []string) {
			var mu sync.Mutex
			var notes []string
			two := make(chan struct{})
			done := make(chan string, 1)
			go func() {
				body, err := call(ctx, tool(t, m, "l_slow"), nil, json.RawMessage(`7`), func(p json.RawMessage) {
					mu.Lock()
					defer mu.Unlock()
					if notes = append(notes, string(p)); len(notes) == 2 {
						close(two)
					}
				})
				done <- fmt.Sprintf("%s %v", body, err)
			}()
			<-two
			if _, err := m.CallTool(ctx, tool(t, m, "l_release"), nil, nil, nil); err != nil {
				t.Fatal(err)
			}
			got := <-done
			mu.Lock()
			defer mu.Unlock()
			return got, notes
		}
		got, rawNotes := slow(m.CallToolRaw)
		want, notes := slow(m.CallTool)
		if got != want || !slices.Equal(rawNotes, notes) || len(notes) != 2 {
			t.Errorf("raw: %s %q\nclient: %s %q", got, rawNotes, want, notes)
		}
	})

	t.Run("stdio canceled", func(t *testing.T) {
		// Given up before its answer: the caller's error, and the
		// upstream goes on serving.
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := m.CallToolRaw(cctx, tool(t, m, "l_slow"), nil, json.RawMessage(`"c"`), func(json.RawMessage) { cancel() })
			done <- err
		}()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want context.Canceled", err)
		}
		body, err := m.CallToolRaw(ctx, tool(t, m, "l_echo"), json.RawMessage(`{"text":"after"}`), nil, nil)
		if err != nil || !strings.Contains(string(body), "stdio-upstream:after") {
			t.Fatalf("after a canceled call: %s %v", body, err)
		}
	})
}

// TestPassResult: a result is passed on as the upstream wrote it (key
// order, number forms), only the hop's decorations cut out; what mcp-go's
// client would refuse or normalise goes to the slow reading, and a
// request for input is handed back.
func TestPassResult(t *testing.T) {
	const info = `"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"up","version":"1"}}`
	for _, tc := range []struct {
		in, want string
		ok       bool
		err      error
	}{
		{`{"content":[{"type":"text","text":"a"}],"resultType":"complete",` + info + `}`, `{"content":[{"type":"text","text":"a"}]}`, true, nil},
		{`{"isError":true,"structuredContent":{"n":1.0},"content":[]}`, `{"isError":true,"structuredContent":{"n":1.0},"content":[]}`, true, nil},
		{`{` + info + `,"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`, `{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`, true, nil},
		{`{"content":[],"_meta":{}}`, `{"content":[]}`, true, nil},
		{`{"resultType":"input_required","inputRequests":{}}`, ``, false, vend.ErrNotRaw},
		{`{"content":[{"type":"video"}]}`, ``, false, nil},
		{`{"content":[{"text":"no type"}]}`, ``, false, nil},
		{`{"structuredContent":{}}`, ``, false, nil},
		{`{"content":[],"_meta":{"x/extra":1}}`, ``, false, nil},
		{`{"content":[],"resultType":"other"}`, ``, false, nil},
		{`{"content":[],"content":[]}`, ``, false, nil},
	} {
		got, ok, err := passResult(json.RawMessage(tc.in))
		if string(got) != tc.want || ok != tc.ok || !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("%s: %s %v %v, want %s %v %v", tc.in, got, ok, err, tc.want, tc.ok, tc.err)
		}
	}
}
