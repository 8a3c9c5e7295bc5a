package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

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
	sid := capvendtest.MCPPost(t, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"experimental":{"capvend/payments":{}}},"clientInfo":{"name":"reuse","version":"1"}}}`,
		func(json.RawMessage) bool { return true })
	if sid == "" {
		t.Fatal("no session")
	}
	capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, func(json.RawMessage) bool { return true })
	deadline := time.Now().Add(30 * time.Second)
	for { // the upstreams connect
		listed := false
		capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, func(m json.RawMessage) bool {
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
	capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t_slow_count","arguments":{"n":1}}}`,
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
	capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t_sha256","arguments":{"text":"EXPENSIVE"}}}`,
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
	if len(calls) != 1 || calls[0].Name != "slow_count" || calls[0].State != vend.CallAwaitingPayment || calls[0].Executions != 0 {
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
