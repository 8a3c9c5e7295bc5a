// Package mcpprobe is the raw MCP Streamable HTTP client of capvend's
// load tools (capvend-flood, capvend-soak): one JSON-RPC message posted,
// its answer read only as far as needed to name what it was, and a tally
// of those names. It never pays.
package mcpprobe

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Post sends one JSON-RPC message (body) to the MCP endpoint url, in the
// session sid ("" for none), and reads the answer until it knows what it
// is: "payment_required" (the notification: it hangs up, never paying),
// "payment_required result" (an invoice as a tool result), "error
// <code>", "result", "http <status>", "transport error" or "no answer".
// It returns the session id the server gave, and that kind.
func Post(ctx context.Context, c *http.Client, url, sid, body string) (newSID, kind string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "", "transport error"
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", "transport error"
	}
	defer resp.Body.Close()
	newSID = resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode >= 300 {
		return newSID, fmt.Sprintf("http %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimPrefix(sc.Bytes(), []byte("data: "))
		var m struct {
			Method string `json:"method"`
			Result *struct {
				IsError           bool `json:"isError"`
				StructuredContent struct {
					Invoice string `json:"invoice"`
				} `json:"structuredContent"`
			} `json:"result"`
			Error *struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch {
		case m.Method == "notifications/payment_required":
			return newSID, "payment_required"
		case m.Error != nil:
			return newSID, fmt.Sprintf("error %d", m.Error.Code)
		case m.Result != nil && m.Result.IsError && m.Result.StructuredContent.Invoice != "":
			return newSID, "payment_required result"
		case m.Result != nil:
			return newSID, "result"
		}
	}
	return newSID, "no answer"
}

// Tally counts answers by kind; the zero value is ready, and safe for
// concurrent use.
type Tally struct {
	mu sync.Mutex
	m  map[string]int
}

// Add counts one answer of kind.
func (t *Tally) Add(kind string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]int{}
	}
	t.m[kind]++
}

// Counts returns a copy of the counts.
func (t *Tally) Counts() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.m))
	for k, n := range t.m {
		out[k] = n
	}
	return out
}

// Replace sets the counts to m (a copy of another tally's, e.g. a child
// process's report).
func (t *Tally) Replace(m map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m = make(map[string]int, len(m))
	for k, n := range m {
		t.m[k] = n
	}
}

// String lists the counts, "N kind" sorted by kind, comma separated.
func (t *Tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts := make([]string, 0, len(t.m))
	for k, n := range t.m {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
