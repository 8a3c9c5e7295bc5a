package cli

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
)

// modernPost sends a tools/call of protocol 2026-07-28 to url, as mcp-go's
// client would, from a client declaring caps, and returns the status, the
// content type and the JSON-RPC messages of the answer (one for JSON, the
// data of each event for SSE).
func modernPost(t *testing.T, url, id, tool, args, meta, caps string) (int, string, []string) {
	t.Helper()
	params := `{"name":"` + tool + `","arguments":` + args + `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientCapabilities":` + caps + `,"io.modelcontextprotocol/clientInfo":{"name":"e2e","version":"1"}` + meta + `}}`
	body := `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":` + params + `}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(mcp.HeaderProtocolVersion, mcp.ProtocolVersion20260728)
	for k, v := range mcp.StandardHeaders(mcp.ProtocolVersion20260728, mcp.MethodToolsCall, json.RawMessage(params)) {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	var msgs []string
	if strings.HasPrefix(ct, "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				msgs = append(msgs, d)
			}
		}
	} else {
		b, _ := io.ReadAll(resp.Body)
		msgs = append(msgs, string(b))
	}
	return resp.StatusCode, ct, msgs
}

// TestFreeCallFastPathSameBytes calls free tools of the HTTP upstream
// through serve twice: from a client that cannot elicit (the fast path:
// the request's bytes forwarded upstream) and from one that can (mcp-go's
// server and client, as before), and wants the same answers byte for byte:
// results, a tool's error, invalid arguments, progress notifications on
// the call's stream. An upstream asking for input goes through the full
// client on the fast path and is declined, as the slow path declines for
// a client that cannot elicit.
func TestFreeCallFastPathSameBytes(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{})
	url := startCapvend(t, path).URL()
	pc := capvendtest.NewPayingClient(t, s, url)
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	const cannot, can = `{}`, `{"elicitation":{}}`
	for _, tc := range []struct{ name, tool, args, meta string }{
		{"result", "w_word_count", `{"text":"free as in beer"}`, ``},
		{"tool error", "w_always_fails", `{"text":"x"}`, ``},
		{"invalid arguments", "w_word_count", `{"text":5}`, ``},
		{"unknown tool", "w_nope", `{}`, ``},
		{"progress", "w_slow_count", `{"n":3}`, `,"progressToken":"p-1"`},
		{"progress, numeric token", "w_slow_count", `{"n":2}`, `,"progressToken":7`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, fct, fast := modernPost(t, url, `"`+tc.name+`"`, tc.tool, tc.args, tc.meta, cannot)
			ss, sct, slow := modernPost(t, url, `"`+tc.name+`"`, tc.tool, tc.args, tc.meta, can)
			if fs != ss || fct != sct || len(fast) == 0 || len(slow) == 0 || fast[len(fast)-1] != slow[len(slow)-1] {
				t.Fatalf("fast path: %d %s %q\nslow path: %d %s %q", fs, fct, fast, ss, sct, slow)
			}
			// Progress: mcp-go's upstream server may drop a notification
			// queued as its handler returns, so each path may miss one;
			// a notification both paths sent must be the same bytes.
			byStep := func(msgs []string) map[float64]string {
				out := map[float64]string{}
				for _, m := range msgs {
					var n struct {
						Method string
						Params struct{ Progress float64 }
					}
					if json.Unmarshal([]byte(m), &n) != nil || n.Method != "notifications/progress" {
						t.Errorf("not a progress notification: %s", m)
					}
					out[n.Params.Progress] = m
				}
				return out
			}
			fp, sp := byStep(fast[:len(fast)-1]), byStep(slow[:len(slow)-1])
			for step, m := range fp {
				if o, ok := sp[step]; ok && o != m {
					t.Errorf("progress %v: fast %s, slow %s", step, m, o)
				}
			}
			if tc.meta != "" && len(fast) < 2 {
				t.Errorf("no progress on the fast path: %q", fast)
			}
		})
	}

	t.Run("upstream asks for input", func(t *testing.T) {
		_, _, fast := modernPost(t, url, `1`, "w_confirm", `{}`, ``, cannot)
		if len(fast) != 1 || !strings.Contains(fast[0], `"text":"declined"`) {
			t.Fatalf("%q", fast)
		}
	})
}
