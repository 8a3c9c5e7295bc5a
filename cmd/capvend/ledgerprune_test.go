package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	paidCalls(t, l, n)
	l.Close()
}

// TestServePrunesOldAnswers: capvend serve with the default retention
// replaces the stored answers of calls older than 30 days by their hash
// record in the background; the money is unchanged and the ledger
// verifies.
func TestServePrunesOldAnswers(t *testing.T) {
	t.Parallel()
	path, listen := freeToolsConfig(t, "")
	dir := filepath.Dir(path)
	db := filepath.Join(dir, "capvend.db")
	fillOld(t, db, 40*24*time.Hour, 4) // 2 delivered, 1 failed and refunded, 1 awaiting
	before := capvendIn(t, dir, nil, "ledger", "export", "--format", "beancount")
	stop := serveInProcess(t, path, listen)
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
