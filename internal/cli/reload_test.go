package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
)

// TestServeReloadsPricesOnSIGHUP runs the real binary, changes a price in
// its configuration and sends SIGHUP: the new price is listed and charged.
// Then a broken configuration and SIGHUP: the error is logged and the
// price stays.
func TestServeReloadsPricesOnSIGHUP(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{})
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sv := startCapvend(t, path, capvendtest.Options{Process: true})
	pc := capvendtest.NewPayingClient(t, s, sv.URL())
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
	sv.Await("t_sha256 listed at 21 sats", func() bool { return price() == "map[amount:21 unit:sats]" })

	newCfg := strings.Replace(string(cfg), "sha256: {price_sats: 21}", "sha256: {price_sats: 34}", 1)
	if newCfg == string(cfg) {
		t.Fatal("the test configuration has no 21-sat sha256")
	}
	if err := os.WriteFile(path, []byte(newCfg), 0o600); err != nil {
		t.Fatal(err)
	}
	sv.Signal(syscall.SIGHUP)
	sv.Await("t_sha256 listed at 34 sats after SIGHUP", func() bool { return price() == "map[amount:34 unit:sats]" })

	before := capvendtest.CustomerBalance(t, s)
	res, err := pc.Call(t, "t_sha256", map[string]any{"text": "hi"})
	if err != nil || res.IsError {
		t.Fatalf("call at the new price: %v %v", res, err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatal(err)
	}
	if spent := before - capvendtest.CustomerBalance(t, s); spent != 34_000 {
		t.Fatalf("customer paid %d msat, want 34000", spent)
	}

	bad := strings.Replace(newCfg, "sha256: {price_sats: 34}", "sha256: {price_sats: -1}", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	sv.Signal(syscall.SIGHUP)
	sv.Await("the bad configuration refused", func() bool { return strings.Contains(sv.Stderr(), "config reload refused") })
	if !strings.Contains(sv.Stderr(), "price_sats: cannot be negative") {
		t.Errorf("the refusal does not say what is wrong:\n%s", sv.Stderr())
	}
	if p := price(); p != "map[amount:34 unit:sats]" {
		t.Fatalf("after a refused reload t_sha256 is listed at %s", p)
	}
}
