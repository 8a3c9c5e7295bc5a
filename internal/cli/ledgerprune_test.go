package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestResultsRetentionConfig: ledger.results_retention defaults to 30
// days, 0 keeps answers forever, and anything else must be at least an
// hour (and twice nostr.window) and at most 100 years.
func TestResultsRetentionConfig(t *testing.T) {
	parse := func(ledgerYAML, rest string) (*Config, error) {
		return parseConfig("capvend.yaml", []byte("ledger:\n"+ledgerYAML+"server:\n  name: t\n"+rest), func(string) string { return "" })
	}
	cfg, err := parse("", "")
	if err != nil || cfg.Ledger.ResultsRetention != 30*24*time.Hour {
		t.Fatalf("default: %v, %v", cfg.Ledger.ResultsRetention, err)
	}
	for _, ok := range []string{"0", "0s", "1h", "2160h"} {
		if cfg, err := parse("  results_retention: "+ok+"\n", ""); err != nil {
			t.Errorf("%s: %v", ok, err)
		} else if ok == "0" && cfg.Ledger.ResultsRetention != 0 {
			t.Errorf("0: %v", cfg.Ledger.ResultsRetention)
		}
	}
	for _, bad := range []struct{ ledger, rest string }{
		{"  results_retention: 30m\n", ""},
		{"  results_retention: -1h\n", ""},
		{"  results_retention: 1000000h\n", ""},
		{"  results_retention: 1h\n", "nostr:\n  window: 1h\n"}, // a request delivered again inside its window must find its answer
	} {
		if _, err := parse(bad.ledger, bad.rest); err == nil || !strings.Contains(err.Error(), "ledger.results_retention:") {
			t.Errorf("%q %q: %v", bad.ledger, bad.rest, err)
		}
	}
}

// fillOld books paid calls in the ledger at path as of age ago.
func fillOld(t *testing.T, path string, age time.Duration, n int) {
	t.Helper()
	l, err := ledger.Open(context.Background(), path, ledger.Options{Now: func() time.Time { return time.Now().Add(-age) }})
	if err != nil {
		t.Fatal(err)
	}
	capvendtest.BookCalls(t, l, 0, n, true)
	l.Close()
}

// TestServePrunesOldAnswers: capvend serve with the default retention
// replaces the stored answers of calls older than 30 days by their hash
// record in the background; the money is unchanged and the ledger
// verifies.
func TestServePrunesOldAnswers(t *testing.T) {
	t.Parallel()
	path, _ := capvendtest.FreeToolsConfig(t, "")
	dir := filepath.Dir(path)
	db := filepath.Join(dir, "capvend.db")
	fillOld(t, db, 40*24*time.Hour, 4) // 2 delivered, 1 failed and refunded, 1 awaiting
	before := capvendIn(t, dir, nil, "ledger", "export", "--format", "beancount")
	stop := startCapvend(t, path).Stop
	l, err := ledger.Open(context.Background(), db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(30 * time.Second)
	for id := vend.CallID(1); id <= 3; id++ {
		for {
			_, err := l.Result(context.Background(), id)
			if errors.Is(err, vend.ErrResultExpired) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %d's result after 30 s of serve: %v; want it pruned", id, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	stop()
	if out := capvendIn(t, dir, nil, "ledger", "verify"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify:\n%s", out)
	}
	if after := capvendIn(t, dir, nil, "ledger", "export", "--format", "beancount"); after != before {
		t.Fatalf("pruning changed the books:\n%s\nbefore:\n%s", after, before)
	}
}

// TestLedgerPruneCommand: `capvend ledger prune` (the built binary)
// prunes by ledger.results_retention, or by --older-than; with a
// retention of 0 it prunes nothing.
func TestLedgerPruneCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fillOld(t, filepath.Join(dir, "capvend.db"), 10*24*time.Hour, 4)
	cfg := "ledger:\n  path: capvend.db\n  results_retention: 0\nserver:\n  name: t\n"
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := capvendIn(t, dir, nil, "ledger", "prune"); !strings.Contains(out, "kept forever; nothing pruned") {
		t.Fatalf("prune with retention 0:\n%s", out)
	}
	os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(strings.Replace(cfg, "results_retention: 0", "results_retention: 720h", 1)), 0o600)
	if out := capvendIn(t, dir, nil, "ledger", "prune"); !strings.Contains(out, "pruned 0 stored results") {
		t.Fatalf("prune of 10-day-old answers with a 30-day retention:\n%s", out)
	}
	if out := capvendIn(t, dir, nil, "ledger", "prune", "--older-than", "168h"); !strings.Contains(out, "pruned 3 stored results and 0 stored replies") {
		t.Fatalf("prune --older-than 168h:\n%s", out)
	}
	if out := capvendIn(t, dir, nil, "ledger", "verify"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify:\n%s", out)
	}
	if out := capvendFails(t, dir, "ledger", "prune", "--older-than", "-1h"); !strings.Contains(out, "--older-than") {
		t.Fatalf("a negative age:\n%s", out)
	}
}

// TestReplayAfterPruneOverMCPHTTP: a paid call over MCP HTTP on the
// regtest stack, its answer pruned by `capvend ledger prune` (the built
// binary, beside the running serve), then its request again (same
// session, same id): JSON-RPC -32057 "Result expired", and the ledger
// still holds one call, run once, paid once.
func TestReplayAfterPruneOverMCPHTTP(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	sid := capvendtest.MCPPost(t, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"experimental":{"capvend/payments":{}}},"clientInfo":{"name":"prune","version":"1"}}}`,
		func(json.RawMessage) bool { return true })
	capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, func(json.RawMessage) bool { return true })
	deadline := time.Now().Add(30 * time.Second)
	for { // the upstreams connect
		listed := false
		capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, func(m json.RawMessage) bool {
			listed = listed || strings.Contains(string(m), `"t_sha256"`)
			return true
		})
		if listed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("t_sha256 not listed")
		}
		time.Sleep(200 * time.Millisecond)
	}
	const call = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t_sha256","arguments":{"text":"hi"}}}`
	type answer struct {
		ID     int
		Method string
		Params struct {
			PayReq string `json:"pay_req"`
		}
		Result json.RawMessage
		Error  *struct {
			Code    int
			Message string
		}
	}
	paid := make(chan error, 1)
	var first answer
	capvendtest.MCPPost(t, url, sid, call, func(m json.RawMessage) bool {
		var a answer
		json.Unmarshal(m, &a)
		if a.Method == "notifications/payment_required" {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				_, err := s.Pay(ctx, a.Params.PayReq)
				paid <- err
			}()
		}
		if a.ID == 7 {
			first = a
			return false
		}
		return true
	})
	if err := <-paid; err != nil {
		t.Fatal(err)
	}
	if first.Error != nil || !strings.Contains(string(first.Result), "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4") {
		t.Fatalf("the paid call: %+v %s", first.Error, first.Result)
	}
	time.Sleep(5 * time.Millisecond) // older than --older-than 1ms
	dir := filepath.Dir(db)
	if out := capvendIn(t, dir, nil, "ledger", "prune", "--older-than", "1ms", "--config", "capvend.yaml"); !strings.Contains(out, "pruned 1 stored results") {
		t.Fatalf("prune:\n%s", out)
	}
	var again answer
	capvendtest.MCPPost(t, url, sid, call, func(m json.RawMessage) bool {
		json.Unmarshal(m, &again)
		return again.ID != 7
	})
	if again.ID != 7 || again.Error == nil || again.Error.Code != -32057 || !strings.HasPrefix(again.Error.Message, "Result expired:") || again.Result != nil {
		t.Fatalf("the replay after pruning: %+v %s", again.Error, again.Result)
	}
	l := ledgerkit.OpenVerified(t, db)
	calls, err := l.CallsIn(context.Background(), vend.CallStates()...)
	if err != nil || len(calls) != 1 || calls[0].Executions != 1 || calls[0].State != vend.CallDelivered {
		t.Fatalf("calls %+v %v: want one, delivered, run once", calls, err)
	}
	if ps, err := l.CallPayments(context.Background(), calls[0].ID); err != nil || len(ps) != 1 {
		t.Fatalf("payments %+v %v: want one", ps, err)
	}
}
