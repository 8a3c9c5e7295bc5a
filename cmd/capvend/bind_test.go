package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// mcpPost sends one JSON-RPC message on an MCP Streamable HTTP session
// (2025-11-25) and calls each JSON-RPC message of the answer (JSON, or an
// SSE stream) until each returns false or the answer ends. It returns the
// response's session id.
func mcpPost(t *testing.T, url, sid, body string, each func(msg json.RawMessage) bool) string {
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

// TestReusedRequestIDOverMCPHTTP is issue 11's first hole, as reported:
// in one session, tools/call id 7 slow_count {"n":1} gets its
// payment_required, the client drops the stream, and sends id 7 again as
// sha256 {"text":"EXPENSIVE"}. That second request used to get the same
// (cheaper) invoice and, once it was paid, the SHA-256 of EXPENSIVE. It is
// now refused with -32600; nothing runs, nothing is charged, and the
// ledger holds only the first call, still awaiting its payment.
func TestReusedRequestIDOverMCPHTTP(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{hold: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	sid := mcpPost(t, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"experimental":{"capvend/payments":{}}},"clientInfo":{"name":"reuse","version":"1"}}}`,
		func(json.RawMessage) bool { return true })
	if sid == "" {
		t.Fatal("no session")
	}
	mcpPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, func(json.RawMessage) bool { return true })
	deadline := time.Now().Add(30 * time.Second)
	for { // the upstreams connect
		listed := false
		mcpPost(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, func(m json.RawMessage) bool {
			listed = listed || strings.Contains(string(m), `"t_slow_count"`)
			return true
		})
		if listed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("t_slow_count not listed")
		}
		time.Sleep(200 * time.Millisecond)
	}

	var invoice string
	mcpPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t_slow_count","arguments":{"n":1}}}`,
		func(m json.RawMessage) bool {
			var n struct {
				Method string
				Params struct {
					PayReq string `json:"pay_req"`
				}
			}
			json.Unmarshal(m, &n)
			if n.Method == "notifications/payment_required" {
				invoice = n.Params.PayReq
				return false // the client drops the stream
			}
			return true
		})
	if invoice == "" {
		t.Fatal("no payment_required for slow_count")
	}

	var answers []string
	mcpPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t_sha256","arguments":{"text":"EXPENSIVE"}}}`,
		func(m json.RawMessage) bool {
			answers = append(answers, string(m))
			return true
		})
	if len(answers) != 1 {
		t.Fatalf("answers to the reused id: %q", answers)
	}
	var rpc struct {
		ID    int
		Error *struct {
			Code    int
			Message string
		}
	}
	if err := json.Unmarshal([]byte(answers[0]), &rpc); err != nil || rpc.ID != 7 || rpc.Error == nil || rpc.Error.Code != -32600 ||
		rpc.Error.Message != "Invalid Request: request id reused with different parameters" {
		t.Fatalf("answer to the reused id: %s", answers[0])
	}

	ctx := context.Background()
	l := ledgerkit.Open(t, db, ledger.Options{MustExist: true})
	calls, err := l.CallsIn(ctx, vend.CallStates()...)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].Tool != "slow_count" || calls[0].State != vend.CallAwaitingPayment || calls[0].Executions != 0 {
		t.Fatalf("calls %+v, want slow_count alone, awaiting payment, never run", calls)
	}
	ps, err := l.CallPayments(ctx, calls[0].ID)
	if err != nil || len(ps) != 1 || ps[0].State != vend.PaymentOpen || ps[0].Bolt11 != invoice || ps[0].Amount != 3_000 {
		t.Fatalf("payments %+v %v", ps, err)
	}
	b, err := l.Balance(ctx)
	if err != nil || len(b.Tools) != 0 {
		t.Fatalf("booked %+v %v", b.Tools, err)
	}
	ledgerkit.Verify(t, l)
}
