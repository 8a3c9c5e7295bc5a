package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
)

// The README test's flake (#15): a client that asks as soon as serve
// accepts connections must see the upstream's tools, not an empty list.
func TestServeListsToolsOnlyOnceUpstreamsListed(t *testing.T) {
	t.Parallel()
	path, listen := capvendtest.FreeToolsConfig(t, "")
	// The upstream starts only after a pause (as on a loaded machine), so
	// a tools/list answered before it listed its tools would be empty.
	capvendtest.EditConfig(t, path, "command: "+capvendtest.ExampleTools(t)+"\n",
		"command: /bin/sh\n    args: [\"-c\", \"sleep 2; exec "+capvendtest.ExampleTools(t)+"\"]\n")
	startCapvend(t, path)
	c, err := client.NewStreamableHttpClient("http://" + listen + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	_, names, err := listTools(ctx, c) // once: no retry, no wait
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(names, ","), "word_count") {
		t.Fatalf("the first tools/list answered %v: serve answered before its upstream listed its tools", names)
	}
}

// serve with admin.listen: health, readiness and metrics on the admin
// listener, none of them on the MCP endpoint's.
func TestServeAdminListener(t *testing.T) {
	t.Parallel()
	path, listen := capvendtest.FreeToolsConfig(t, "")
	// The upstream starts only after a pause (as on a loaded machine), so
	// a tools/list answered before it listed its tools would be empty.
	capvendtest.EditConfig(t, path, "command: "+capvendtest.ExampleTools(t)+"\n",
		"command: /bin/sh\n    args: [\"-c\", \"sleep 2; exec "+capvendtest.ExampleTools(t)+"\"]\n")
	addr := capvendtest.AdminConfig(t, path, "")
	startCapvend(t, path)
	if code, body := capvendtest.Get(t, "http://"+addr+"/healthz", ""); code != 200 {
		t.Fatalf("healthz: %d %s", code, body)
	}
	c, err := client.NewStreamableHttpClient("http://" + listen + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil { // answered once the upstream listed its tools
		t.Fatal(err)
	}
	code, body := capvendtest.Get(t, "http://"+addr+"/readyz", "")
	if code != 200 || !strings.Contains(body, "ok: upstreams") {
		t.Fatalf("readyz once the MCP endpoint answers: %d\n%s", code, body)
	}
	for _, p := range []string{"/metrics", "/healthz", "/readyz", "/debug/pprof/"} {
		if code, _ := capvendtest.Get(t, "http://"+listen+p, ""); code != 404 {
			t.Errorf("the MCP listener answers %s with %d, want 404", p, code)
		}
	}
	if code, _ := capvendtest.Get(t, "http://"+addr+"/debug/pprof/", ""); code != 404 {
		t.Errorf("without admin.pprof the admin listener answers /debug/pprof/ with %d, want 404", code)
	}
	for range 3 {
		req := mcp.CallToolRequest{}
		req.Params.Name = "word_count"
		req.Params.Arguments = map[string]any{"text": "one two"}
		if _, err := c.CallTool(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	_, metrics := capvendtest.Get(t, "http://"+addr+"/metrics", "")
	for _, want := range []string{
		`capvend_free_calls_total{kind="tool",server="tools",tool="other"} 3`,
		`capvend_upstream_call_seconds_count{result="ok",server="tools",tool="other"} 3`,
		`capvend_upstreams_connected 1`,
		`capvend_sessions{front="http"} `,
		`capvend_inflight_requests 0`,
		`capvend_open_quotes 0`,
		`go_goroutines `,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
}

// admin.pprof serves Go's profiles on the admin listener, behind its token.
func TestAdminPprof(t *testing.T) {
	path, listen := capvendtest.FreeToolsConfig(t, "")
	tokenFile := filepath.Join(filepath.Dir(path), "admin.token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := capvendtest.AdminConfig(t, path, "  pprof: true\n  token_file: "+tokenFile+"\n")
	startCapvend(t, path)
	if code, _ := capvendtest.Get(t, "http://"+addr+"/debug/pprof/", ""); code != 401 {
		t.Errorf("/debug/pprof/ without the token: %d, want 401", code)
	}
	code, body := capvendtest.Get(t, "http://"+addr+"/debug/pprof/goroutine?debug=1", "0123456789abcdef0123")
	if code != 200 || !strings.Contains(body, "goroutine profile:") {
		t.Fatalf("/debug/pprof/goroutine with the token: %d\n%.300s", code, body)
	}
	if code, body := capvendtest.Get(t, "http://"+listen+"/debug/pprof/goroutine?debug=1", ""); code != 404 {
		t.Errorf("the MCP listener answers /debug/pprof/goroutine with %d: %.200s", code, body)
	}
}

// Off loopback, the admin listener needs a token file, and checks it.
func TestAdminConfigValidates(t *testing.T) {
	dir := t.TempDir()
	tokenFile := dir + "/admin.token"
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ yaml, err string }{
		{"admin:\n  listen: 127.0.0.1:9402\n", ""},
		{"admin:\n  listen: 0.0.0.0:9402\n", "admin.listen: 0.0.0.0:9402 is not a loopback address: set admin.token_file"},
		{"admin:\n  listen: 0.0.0.0:9402\n  token_file: " + tokenFile + "\n", ""},
		{"admin:\n  listen: nonsense\n", "admin.listen: \"nonsense\" is not host:port"},
		{"log:\n  format: xml\n", "log.format: \"xml\" is not text or json"},
		{"log:\n  level: loud\n", "log.level: \"loud\" is not one of debug, info, warn, error"},
		{"log:\n  format: json\n  level: debug\n", ""},
		{"admin:\n  pprof: true\n", "admin.pprof: profiles are served on the admin listener: set admin.listen too"},
		{"admin:\n  listen: 127.0.0.1:9402\n  pprof: true\n", ""},
	} {
		_, err := parseConfig(dir+"/capvend.yaml", []byte(tc.yaml), func(string) string { return "" })
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.err)
		}
	}
	if err := os.Chmod(tokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig(dir+"/capvend.yaml", []byte("admin:\n  listen: 0.0.0.0:9402\n  token_file: "+tokenFile+"\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.checkSecrets(); err == nil || !strings.Contains(err.Error(), "admin.token_file") {
		t.Fatalf("a world-readable admin token file: %v", err)
	}
}

// log.format json writes one JSON object a line, at log.level.
func TestLogConfig(t *testing.T) {
	var b strings.Builder
	l := LogConfig{Format: "json", Level: "warn"}.logger(&b)
	l.Info("hidden")
	l.Warn("shown", "call", 7)
	if got := b.String(); strings.Contains(got, "hidden") || !strings.HasPrefix(got, "{") || !strings.Contains(got, `"call":7`) {
		t.Fatalf("json at warn: %q", got)
	}
}
