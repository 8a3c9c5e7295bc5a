package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// envServe makes the test binary run as a stdio MCP server (see TestMain).
const envServe = "CAPVEND_UPSTREAM_TEST_SERVE"

// waitLimit bounds every wait for an event; it is a deadlock guard, not an
// assertion on speed.
const waitLimit = 30 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv(envServe) == "stdio" {
		s := newTestServer("stdio-upstream")
		in, out := stdioStreams()
		if err := server.NewStdioServer(s).Listen(context.Background(), in, out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// newTestServer is a real mcp-go server with the tools the tests need.
func newTestServer(name string) *server.MCPServer {
	s := server.NewMCPServer(name, "1", server.WithToolCapabilities(true),
		server.WithPromptCapabilities(true), server.WithResourceCapabilities(false, true))
	addCatalog(s, name)
	addAskTool(s)
	addWhois(s, name)
	// slow sends two progress notifications, then waits for a release call:
	// mcp-go's stdio server may write notifications after the result, so
	// the test releases slow only once it has seen them.
	release := make(chan struct{}, 1)
	s.AddTool(mcp.NewTool("environ", mcp.WithDescription("its own environment, one KEY=value per line")),
		func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			env := os.Environ()
			sort.Strings(env)
			return mcp.NewToolResultText(strings.Join(env, "\n")), nil
		})
	s.AddTool(mcp.NewTool("release"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		select {
		case release <- struct{}{}:
		default:
		}
		return mcp.NewToolResultText("released"), nil
	})
	s.AddTool(mcp.NewTool("echo", mcp.WithDescription("echoes text"), mcp.WithString("text", mcp.Required())),
		func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(name + ":" + r.GetString("text", "")), nil
		})
	s.AddTool(mcp.NewTool("pid"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(fmt.Sprint(os.Getpid())), nil
	})
	s.AddTool(mcp.NewTool("fail"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultError("boom"), nil
	})
	s.AddTool(mcp.NewTool("slow"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if r.Params.Meta != nil && r.Params.Meta.ProgressToken != nil {
			for i := 1; i <= 2; i++ {
				err := server.ServerFromContext(ctx).SendNotificationToClient(ctx, "notifications/progress",
					map[string]any{"progressToken": r.Params.Meta.ProgressToken, "progress": i, "total": 2})
				if err != nil {
					return nil, err
				}
			}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return mcp.NewToolResultText("done"), nil
	})
	s.AddTool(mcp.NewTool("add_tool", mcp.WithString("name", mcp.Required())),
		func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.AddTool(mcp.NewTool(r.GetString("name", "x")), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return mcp.NewToolResultText("new"), nil
			})
			return mcp.NewToolResultText("added"), nil
		})
	return s
}

// events collects the Manager's callbacks.
type events struct {
	changed chan struct{}
	state   chan string // "name up" / "name down"
}

func newEvents() *events {
	return &events{changed: make(chan struct{}, 100), state: make(chan string, 100)}
}

func (e *events) config(servers ...ServerConfig) Config {
	return Config{
		Servers:  servers,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnChange: func() { e.changed <- struct{}{} },
		OnState: func(name string, up bool, _ error) {
			e.state <- fmt.Sprintf("%s %v", name, map[bool]string{true: "up", false: "down"}[up])
		},
		MinBackoff:     10 * time.Millisecond,
		MaxBackoff:     200 * time.Millisecond,
		ConnectTimeout: 10 * time.Second,
		StopTimeout:    2 * time.Second,
	}
}

// waitState waits for the state event want ("name up" / "name down").
func (e *events) waitState(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case got := <-e.state:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q state event", want)
		}
	}
}

// waitTools waits until m lists every name in want.
func waitTools(t *testing.T, m *Manager, e *events, want ...string) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		have := map[string]bool{}
		for _, tl := range m.Tools() {
			have[tl.Name] = true
		}
		missing := false
		for _, w := range want {
			if !have[w] {
				missing = true
			}
		}
		if !missing {
			return
		}
		select {
		case <-e.changed:
		case <-deadline:
			t.Fatalf("tools %v not all listed; have %v", want, have)
		}
	}
}

func stdioConfig(t *testing.T, name, prefix string) ServerConfig {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return ServerConfig{Name: name, Prefix: prefix, Command: exe, Args: []string{"-test.run=^$"}, Env: []string{envServe + "=stdio"}, Dir: t.TempDir()}
}

// httpUpstream serves s on 127.0.0.1; restart brings it back on the same
// address after stop.
type httpUpstream struct {
	t    *testing.T
	s    *server.MCPServer
	opts []server.StreamableHTTPOption
	addr string
	ts   *httptest.Server
}

func startHTTP(t *testing.T, s *server.MCPServer, opts ...server.StreamableHTTPOption) *httpUpstream {
	h := &httpUpstream{t: t, s: s, opts: opts}
	h.start()
	t.Cleanup(h.stop)
	return h
}

func (h *httpUpstream) start() {
	addr := h.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	var err error
	for range 50 { // the old socket may linger briefly after stop
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		h.t.Fatal(err)
	}
	h.ts = httptest.NewUnstartedServer(server.NewStreamableHTTPServer(h.s, h.opts...))
	h.ts.Listener = l
	h.ts.Start()
	h.addr = l.Addr().String()
}

func (h *httpUpstream) stop() {
	if h.ts != nil {
		// Listener first: the Manager reconnects at once, and Close waits
		// for active connections.
		h.ts.Listener.Close()
		h.ts.CloseClientConnections()
		h.ts.Close()
		h.ts = nil
	}
}

func (h *httpUpstream) url() string { return "http://" + h.addr + "/mcp" }

// run starts m and stops it at cleanup, checking Run returns.
func run(t *testing.T, m *Manager) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(waitLimit):
			t.Error("Run did not return after cancel")
		}
	})
}

func tool(t *testing.T, m *Manager, name string) vend.Item {
	t.Helper()
	for _, tl := range m.Tools() {
		if tl.Name == name {
			return tl
		}
	}
	t.Fatalf("no tool %q", name)
	return vend.Item{}
}

func text(t *testing.T, body json.RawMessage) string {
	t.Helper()
	var r struct {
		Content []struct{ Text string } `json:"content"`
		IsError bool                    `json:"isError"`
	}
	if err := json.Unmarshal(body, &r); err != nil || len(r.Content) == 0 {
		t.Fatalf("bad result %s: %v", body, err)
	}
	if r.IsError {
		return "ERROR:" + r.Content[0].Text
	}
	return r.Content[0].Text
}

func TestManager(t *testing.T) {
	hs := newTestServer("http-upstream")
	h := startHTTP(t, hs)
	e := newEvents()
	m, err := New(e.config(
		ServerConfig{Name: "web", Prefix: "w_", URL: h.url()},
		stdioConfig(t, "local", "l_"),
	))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Tools()) != 0 {
		t.Fatal("tools before Run")
	}
	run(t, m)
	waitTools(t, m, e, "w_echo", "w_slow", "l_echo", "l_slow")

	t.Run("listing", func(t *testing.T) {
		for _, tc := range []struct{ name, server, up string }{
			{"w_echo", "web", "echo"}, {"l_echo", "local", "echo"}, {"l_add_tool", "local", "add_tool"},
		} {
			tl := tool(t, m, tc.name)
			if tl.Server != tc.server || tl.UpstreamName != tc.up {
				t.Errorf("%s: server %q upstream name %q", tc.name, tl.Server, tl.UpstreamName)
			}
		}
		echo := tool(t, m, "w_echo")
		if echo.Description != "echoes text" || !strings.Contains(string(echo.InputSchema), `"text"`) {
			t.Errorf("echo tool: %+v", echo)
		}
	})

	t.Run("call", func(t *testing.T) {
		for _, tc := range []struct{ tool, want string }{
			{"w_echo", "http-upstream:hi"}, {"l_echo", "stdio-upstream:hi"}, {"l_fail", "ERROR:boom"},
		} {
			body, err := m.CallTool(context.Background(), tool(t, m, tc.tool), json.RawMessage(`{"text":"hi"}`), nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", tc.tool, err)
			}
			if got := text(t, body); got != tc.want {
				t.Errorf("%s: got %q want %q", tc.tool, got, tc.want)
			}
			if strings.Contains(string(body), "serverInfo") || strings.Contains(string(body), "resultType") {
				t.Errorf("%s: upstream decorations kept: %s", tc.tool, body)
			}
		}
	})

	t.Run("progress", func(t *testing.T) {
		for _, tc := range []struct{ tool, token string }{
			{"w_slow", `"tok-1"`}, {"l_slow", `7`},
		} {
			var mu sync.Mutex
			var got []map[string]any
			var toks []string
			two := make(chan struct{})
			type answer struct {
				body json.RawMessage
				err  error
			}
			done := make(chan answer, 1)
			go func() {
				body, err := m.CallTool(context.Background(), tool(t, m, tc.tool), nil, json.RawMessage(tc.token), func(p json.RawMessage) {
					var f map[string]json.RawMessage
					_ = json.Unmarshal(p, &f)
					var v map[string]any
					_ = json.Unmarshal(p, &v)
					mu.Lock()
					got = append(got, v)
					toks = append(toks, string(f["progressToken"]))
					if len(got) == 2 {
						close(two)
					}
					mu.Unlock()
				})
				done <- answer{body, err}
			}()
			select {
			case <-two:
			case <-time.After(waitLimit):
				t.Fatalf("%s: progress not forwarded", tc.tool)
			}
			release := strings.Replace(tc.tool, "slow", "release", 1)
			if _, err := m.CallTool(context.Background(), tool(t, m, release), nil, nil, nil); err != nil {
				t.Fatal(err)
			}
			var a answer
			select {
			case a = <-done:
			case <-time.After(waitLimit):
				t.Fatalf("%s: no result", tc.tool)
			}
			if a.err != nil {
				t.Fatal(a.err)
			}
			if text(t, a.body) != "done" {
				t.Fatalf("result %s", a.body)
			}
			mu.Lock()
			for i, v := range got {
				if toks[i] != tc.token || v["progress"] != float64(i+1) || v["total"] != float64(2) {
					t.Errorf("%s: progress %d = %v (token %s)", tc.tool, i, v, toks[i])
				}
			}
			mu.Unlock()
		}
	})

	t.Run("list_changed", func(t *testing.T) {
		// stdio: the child adds a tool and notifies.
		if _, err := m.CallTool(context.Background(), tool(t, m, "l_add_tool"), json.RawMessage(`{"name":"extra"}`), nil, nil); err != nil {
			t.Fatal(err)
		}
		waitTools(t, m, e, "l_extra")
		// http: the server adds a tool and notifies.
		hs.AddTool(mcp.NewTool("late"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("late"), nil
		})
		waitTools(t, m, e, "w_late")
		body, err := m.CallTool(context.Background(), tool(t, m, "w_late"), nil, nil, nil)
		if err != nil || text(t, body) != "late" {
			t.Fatalf("w_late: %s %v", body, err)
		}
	})
}

func TestReconnectStdioChildKilled(t *testing.T) {
	e := newEvents()
	m, err := New(e.config(stdioConfig(t, "local", "")))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	e.waitState(t, "local up")
	body, err := m.CallTool(context.Background(), tool(t, m, "pid"), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid1 := text(t, body)
	var pid int
	fmt.Sscan(pid1, &pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "local down")
	e.waitState(t, "local up")
	body, err = m.CallTool(context.Background(), tool(t, m, "pid"), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if text(t, body) == pid1 {
		t.Fatal("same child after kill")
	}
}

func TestReconnectHTTPRestart(t *testing.T) {
	h := startHTTP(t, newTestServer("web"))
	e := newEvents()
	m, err := New(e.config(ServerConfig{Name: "web", URL: h.url()}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	e.waitState(t, "web up")
	h.stop()
	e.waitState(t, "web down")
	h.start()
	e.waitState(t, "web up")
	body, err := m.CallTool(context.Background(), tool(t, m, "echo"), json.RawMessage(`{"text":"again"}`), nil, nil)
	if err != nil || text(t, body) != "web:again" {
		t.Fatalf("after restart: %s %v", body, err)
	}
}

// TestLegacyHTTPUpstream: an upstream that only speaks 2025-11-25 sends
// list_changed on its GET stream, and a restart is noticed by pings.
func TestLegacyHTTPUpstream(t *testing.T) {
	hs := newTestServer("old")
	h := startHTTP(t, hs, server.WithStreamableHTTPProtocolVersions(mcp.ProtocolVersion20251125))
	e := newEvents()
	cfg := e.config(ServerConfig{Name: "old", Prefix: "o_", URL: h.url()})
	cfg.PingInterval = 50 * time.Millisecond
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitTools(t, m, e, "o_echo")
	hs.AddTool(mcp.NewTool("late"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("late"), nil
	})
	waitTools(t, m, e, "o_late")
	hs.AddPrompt(mcp.NewPrompt("late_prompt"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("late"))}), nil
	})
	waitCatalog(t, m, e, "o_late_prompt")
	h.stop()
	e.waitState(t, "old down")
	h.start()
	e.waitState(t, "old up")
	body, err := m.CallTool(context.Background(), tool(t, m, "o_echo"), json.RawMessage(`{"text":"x"}`), nil, nil)
	if err != nil || text(t, body) != "old:x" {
		t.Fatalf("%s %v", body, err)
	}
}

func TestDownUpstreamFailsFast(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	e := newEvents()
	m, err := New(e.config(ServerConfig{Name: "dead", Prefix: "d_", URL: "http://" + addr + "/mcp"}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	if n := len(m.Tools()); n != 0 {
		t.Fatalf("%d tools from a dead upstream", n)
	}
	_, err = m.CallTool(context.Background(), vend.Item{Name: "d_x", Server: "dead", UpstreamName: "x"}, nil, nil, nil)
	if !errors.Is(err, vend.ErrUpstream) || !strings.Contains(err.Error(), `upstream "dead" is down`) {
		t.Fatalf("got %v", err)
	}
	_, err = m.CallTool(context.Background(), vend.Item{Name: "y", Server: "nope"}, nil, nil, nil)
	if !errors.Is(err, vend.ErrUpstream) {
		t.Fatalf("unknown upstream: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"ok", Config{Servers: []ServerConfig{{Name: "a", Command: "x"}, {Name: "b", URL: "http://127.0.0.1:1/mcp"}}}, true},
		{"no name", Config{Servers: []ServerConfig{{Command: "x"}}}, false},
		{"dup", Config{Servers: []ServerConfig{{Name: "a", Command: "x"}, {Name: "a", Command: "y"}}}, false},
		{"both", Config{Servers: []ServerConfig{{Name: "a", Command: "x", URL: "http://h/"}}}, false},
		{"neither", Config{Servers: []ServerConfig{{Name: "a"}}}, false},
		{"bad url", Config{Servers: []ServerConfig{{Name: "a", URL: "ftp://h/"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
}

var _ http.Handler = (*server.StreamableHTTPServer)(nil)
