package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// rawMCP is a legacy (2025-11-25) MCP HTTP session by hand: the test
// chooses each request's JSON-RPC id and session, and sends a request
// again as it was.
type rawMCP struct {
	t   *testing.T
	sid string
}

// post sends body to url in the session and returns the HTTP status and
// the JSON-RPC messages of the answer (JSON or SSE), calling each as it
// comes to onMessage, if set.
func (r *rawMCP) post(url, body string, onMessage func(json.RawMessage)) (int, []json.RawMessage) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // a hang guard
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if r.sid != "" {
		req.Header.Set("Mcp-Session-Id", r.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil // a dead instance
	}
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" && r.sid == "" {
		r.sid = id
	}
	var msgs []json.RawMessage
	add := func(m json.RawMessage) {
		msgs = append(msgs, m)
		if onMessage != nil {
			onMessage(m)
		}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if d, ok := strings.CutPrefix(line, "data: "); ok && sse {
			add(json.RawMessage(d))
		} else if !sse && line != "" {
			add(json.RawMessage(line))
		}
	}
	return resp.StatusCode, msgs
}

// TestSessionOnAnotherInstance: with a shared PostgreSQL ledger, an MCP
// HTTP client whose instance died mid-call sends the same request (same
// session, same JSON-RPC id) to another instance and gets its paid call's
// stored answer: no second payment request, the call run once. A made-up
// session id is still refused there (404).
func TestSessionOnAnotherInstance(t *testing.T) {
	t.Parallel() // most of it is the wait for the dead instance's lease
	s := needStack(t)
	dsn := capvendtest.Postgres(t)
	var paths, listens []string
	for range 2 {
		p, l := writeServeConfig(t, s, serveOpts{})
		capvendtest.OnPostgres(t, p, dsn)
		paths, listens = append(paths, p), append(listens, l)
	}
	ctx := context.Background()
	a := startCapvend(t, paths[0], capvendtest.Options{Process: true, Failpoint: vend.FailAfterSettlement})
	l, err := ledger.OpenPostgres(ctx, dsn, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	capvendtest.WaitLeaseHolder(t, l, a.Pid(), true, time.Minute)
	startCapvend(t, paths[1], capvendtest.Options{Process: true})
	urlA, urlB := "http://"+listens[0]+"/mcp", "http://"+listens[1]+"/mcp"

	c := &rawMCP{t: t}
	if status, msgs := c.post(urlA, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25",
		"capabilities":{"experimental":{"capvend/payments":{}}},"clientInfo":{"name":"raw","version":"1"}}}`, nil); status != http.StatusOK || c.sid == "" {
		t.Fatalf("initialize at A: HTTP %d %s", status, msgs)
	}
	c.post(urlA, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)

	// A paid call at A, which dies once the payment is booked.
	callReq := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t_sha256","arguments":{"text":"hi"}}}`
	paid := make(chan error, 1)
	c.post(urlA, callReq, func(m json.RawMessage) {
		var n struct {
			Method string `json:"method"`
			Params struct {
				PayReq string `json:"pay_req"`
			} `json:"params"`
		}
		if json.Unmarshal(m, &n) == nil && n.Method == vend.NotifyPaymentRequired {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				_, err := s.Pay(ctx, n.Params.PayReq)
				paid <- err
			}()
		}
	})
	if code := a.Wait(); code != capvendtest.ExitKilled {
		t.Fatalf("A did not die by SIGKILL: exit %d", code)
	}
	select {
	case err := <-paid:
		if err != nil {
			t.Fatalf("payment: %v", err)
		}
	case <-time.After(90 * time.Second): // a hang guard
		t.Fatal("A sent no payment request")
	}
	// B takes the work over and runs the dead instance's paid call.
	capvendtest.WaitLeaseHolder(t, l, a.Pid(), false, 2*time.Minute)
	capvendtest.WaitCall(t, l, vend.CallDelivered)

	status, msgs := c.post(urlB, callReq, nil)
	if status != http.StatusOK || len(msgs) == 0 {
		t.Fatalf("the same request at B: HTTP %d %s", status, msgs)
	}
	last := string(msgs[len(msgs)-1])
	if !strings.Contains(last, `"id":7`) || !strings.Contains(last, sha256Hi) {
		t.Fatalf("B answered %s, want the stored result (%s)", msgs, sha256Hi)
	}
	for _, m := range msgs {
		if strings.Contains(string(m), vend.NotifyPaymentRequired) {
			t.Fatalf("B asked for a second payment: %s", msgs)
		}
	}
	if call, err := l.Call(ctx, 1); err != nil || call.Executions != 1 {
		t.Fatalf("the call executed %d times (%v), want once", call.Executions, err)
	}

	var b [32]byte
	rand.Read(b[:])
	madeUp := &rawMCP{t: t, sid: "mcp-session-" + base64.RawURLEncoding.EncodeToString(b[:])}
	if status, msgs := madeUp.post(urlB, callReq, nil); status != http.StatusNotFound {
		t.Fatalf("a made-up session at B: HTTP %d %s", status, msgs)
	}
	checkLedgerVerifies(t, paths[1])
}
