package cli

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
)

// TestMCPInspectorListsAndCallsThroughServe runs the official MCP Inspector
// CLI (npm @modelcontextprotocol/inspector, pinned in
// testdata/inspector/package.json; .ci/run installs it) against `capvend
// serve`: it lists the tools and calls a free one.
func TestMCPInspectorListsAndCallsThroughServe(t *testing.T) {
	inspector, err := filepath.Abs(filepath.Join(needNPM(t, "inspector"), "node_modules/.bin/mcp-inspector"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, listen := capvendtest.FreeToolsConfig(t, "")
	startCapvend(t, cfg)
	url := "http://" + listen + "/mcp"
	inspect := func(args ...string) string {
		t.Helper()
		var out string
		for attempt := 0; attempt < 20; attempt++ { // the upstream may still be connecting
			cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
			b, err := exec.CommandContext(cctx, inspector, append([]string{"--cli", url, "--transport", "http"}, args...)...).CombinedOutput()
			ccancel()
			out = string(b)
			if err == nil && strings.Contains(out, "word_count") || err == nil && strings.Contains(out, "characters") {
				return out
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Fatalf("inspector %v:\n%s", args, out)
		return ""
	}
	list := inspect("--method", "tools/list")
	for _, name := range []string{"word_count", "sha256", "slow_count", "always_fails", "confirm"} {
		if !strings.Contains(list, `"name": "`+name+`"`) {
			t.Errorf("tools/list lacks %s:\n%s", name, list)
		}
	}
	call := inspect("--method", "tools/call", "--tool-name", "word_count", "--tool-arg", "text=hello inspector")
	if !strings.Contains(call, "2 words, 1 lines, 15 characters") {
		t.Fatalf("tools/call:\n%s", call)
	}
}
