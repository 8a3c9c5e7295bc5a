package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// TestServeReloadsPricesOnSIGHUP runs the real binary, changes a price in
// its configuration and sends SIGHUP: the new price is listed and charged.
// Then a broken configuration and SIGHUP: the error is logged and the
// price stays.
func TestServeReloadsPricesOnSIGHUP(t *testing.T) {
	s := needStack(t)
	path, listen := writeServeConfig(t, s, serveOpts{})
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(capvendBin, "serve", "--config", path)
	stderr := &lockedWriter{w: &strings.Builder{}}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	logs := func() string {
		stderr.mu.Lock()
		defer stderr.mu.Unlock()
		return stderr.w.(*strings.Builder).String()
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		// A bound on waiting (a deadlock guard), not a speed check.
		deadline := time.Now().Add(60 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s; log:\n%s", what, logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("serve listening", func() bool { return strings.Contains(logs(), "serving MCP at") })
	pc := newPayingClient(t, s, "http://"+listen+"/mcp")
	price := func() string {
		res, err := pc.ListTools(context.Background(), mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range res.Tools {
			if tl.Name == "t_sha256" && tl.Meta != nil {
				return fmt.Sprint(tl.Meta.AdditionalFields["capvend/price"])
			}
		}
		return ""
	}
	waitFor("t_sha256 listed at 21 sats", func() bool { return price() == "map[amount:21 unit:sats]" })

	newCfg := strings.Replace(string(cfg), "sha256: {price_sats: 21}", "sha256: {price_sats: 34}", 1)
	if newCfg == string(cfg) {
		t.Fatal("the test configuration has no 21-sat sha256")
	}
	if err := os.WriteFile(path, []byte(newCfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor("t_sha256 listed at 34 sats after SIGHUP", func() bool { return price() == "map[amount:34 unit:sats]" })

	before := customerBalance(t, s)
	res, err := pc.call(t, "t_sha256", map[string]any{"text": "hi"})
	if err != nil || res.IsError {
		t.Fatalf("call at the new price: %v %v", res, err)
	}
	if err := <-pc.paid; err != nil {
		t.Fatal(err)
	}
	if spent := before - customerBalance(t, s); spent != 34_000 {
		t.Fatalf("customer paid %d msat, want 34000", spent)
	}

	bad := strings.Replace(newCfg, "sha256: {price_sats: 34}", "sha256: {price_sats: -1}", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor("the bad configuration refused", func() bool { return strings.Contains(logs(), "config reload refused") })
	if !strings.Contains(logs(), "price_sats: cannot be negative") {
		t.Errorf("the refusal does not say what is wrong:\n%s", logs())
	}
	if p := price(); p != "map[amount:34 unit:sats]" {
		t.Fatalf("after a refused reload t_sha256 is listed at %s", p)
	}
}
