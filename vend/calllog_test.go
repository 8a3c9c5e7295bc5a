package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/syncbuf"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// callLines returns the "vend: priced call" lines of a JSON log, by call
// id.
func callLines(t *testing.T, log string) map[int64][]map[string]any {
	t.Helper()
	out := map[int64][]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "vend: priced call" {
			out[int64(m["call"].(float64))] = append(out[int64(m["call"].(float64))], m)
		}
	}
	return out
}

// Every priced call gets one log line with its call id, whatever its
// outcome: delivered, and also expired or canceled unpaid (those end in
// the ledger, wherever they are ended, not on the paid path).
func TestEveryPricedCallIsLoggedOnce(t *testing.T) {
	var buf syncbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"),
		ledger.Options{Observer: vend.LogCallEnds(log, nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	h := harnessOn(t, l, false, func(c *vend.Config) { c.Log = log })

	// Expired: the payment request expires unpaid.
	ch := h.callAsync(req("expired", "demo_echo", `{"text":"hi"}`, nil))
	expired := h.nextPayment(t)
	h.be.expire(expired.Ref)
	if o := result(t, ch); !errors.Is(o.err, vend.ErrPaymentExpired) {
		t.Fatalf("expired call: %v", o.err)
	}
	// Canceled: the client can pay no way the server takes.
	r := req("canceled", "demo_echo", `{"text":"hi"}`, nil)
	r.PMIs = []string{"bitcoin-onchain"}
	if _, err := h.v.CallItem(h.ctx, r); !errors.Is(err, vend.ErrNoPaymentMethod) {
		t.Fatalf("canceled call: %v", err)
	}
	// Delivered.
	ch = h.callAsync(req("delivered", "demo_echo", `{"text":"hi"}`, nil))
	paid := h.nextPayment(t)
	h.be.pay(paid.Ref)
	if o := result(t, ch); o.err != nil {
		t.Fatalf("paid call: %v", o.err)
	}

	lines := callLines(t, buf.String())
	if len(lines) != 3 {
		t.Fatalf("%d calls logged, want 3:\n%s", len(lines), buf.String())
	}
	outcomes := map[string]int64{}
	for id, ls := range lines {
		if len(ls) != 1 {
			t.Fatalf("call %d has %d lines, want 1: %v", id, len(ls), ls)
		}
		outcomes[ls[0]["outcome"].(string)] = id
	}
	if id, ok := outcomes["expired"]; !ok || id != int64(expired.CallID) {
		t.Errorf("expired call %d: logged %v", expired.CallID, outcomes)
	}
	if id, ok := outcomes["delivered"]; !ok || id != int64(paid.CallID) {
		t.Errorf("delivered call %d: logged %v", paid.CallID, outcomes)
	}
	id, ok := outcomes["canceled"]
	if !ok {
		t.Fatalf("no canceled call logged: %v", outcomes)
	}
	if c, err := l.Call(context.Background(), vend.CallID(id)); err != nil || c.State != vend.CallCanceled || c.Price != 21_000 {
		t.Fatalf("the canceled call's line names call %d: %+v %v", id, c, err)
	}
	if line := lines[id][0]; line["price_msat"] != 21_000.0 || line["reason"] != "no payment method" || line["server"] != "demo" || line["upstream_tool"] != "echo" {
		t.Errorf("canceled call's line: %v", line)
	}
}
