package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestLedgerDriverConfig: ledger.driver is sqlite or postgres, and
// postgres needs ledger.dsn_file.
func TestLedgerDriverConfig(t *testing.T) {
	for _, tc := range []struct{ ledger, field string }{
		{"  driver: mysql\n", "ledger.driver"},
		{"  driver: postgres\n", "ledger.dsn_file"},
		{"  driver: sqlite\n  path: \"\"\n", "ledger.path"},
		{"  driver: sqlite\nnostr:\n  shard: true\n", "nostr.shard"}, // sharding is between instances on PostgreSQL
		{"  lease_ttl: 2s\n", "ledger.lease_ttl"},
		{"  lease_ttl: 11m\n  claim_takeover: 20m\n", "ledger.lease_ttl"},
		{"  lease_ttl: 1m\n", "ledger.claim_takeover"}, // the default minute is not longer
		{"  lease_ttl: 10s\n  claim_takeover: 10s\n", "ledger.claim_takeover"},
		{"  claim_takeover: 2h\n", "ledger.claim_takeover"},
		{"  driver: sqlite\nnostr:\n  shard_sample: 50ms\n", "nostr.shard_sample"},
		{"  driver: sqlite\nnostr:\n  shard_sample: 6s\n", "nostr.shard_sample"},
	} {
		_, err := parseConfig("capvend.yaml", []byte("ledger:\n"+tc.ledger+"server:\n  name: t\n"), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%q: %v", tc.ledger, err)
		}
	}
	cfg, err := parseConfig("capvend.yaml", []byte("server:\n  name: t\n"), func(string) string { return "" })
	if err != nil || cfg.Ledger.LeaseTTL != 30*time.Second || cfg.Ledger.ClaimTakeover != time.Minute {
		t.Errorf("the default lease and claim times: %+v, %v", cfg.Ledger, err)
	}
	cfg, err = parseConfig("capvend.yaml", []byte("ledger:\n  lease_ttl: 10s\n  claim_takeover: 15s\nserver:\n  name: t\n"), func(string) string { return "" })
	if err != nil || cfg.Ledger.LeaseTTL != 10*time.Second || cfg.Ledger.ClaimTakeover != 15*time.Second {
		t.Errorf("lease_ttl 10s, claim_takeover 15s: %+v, %v", cfg.Ledger, err)
	}
	cfg, err = parseConfig("capvend.yaml", []byte("nostr:\n  shard_sample: 300ms\nserver:\n  name: t\n"), func(string) string { return "" })
	if err != nil || cfg.Nostr.ShardSample != 300*time.Millisecond {
		t.Errorf("shard_sample 300ms: %+v, %v", cfg.Nostr, err)
	}
}

// TestLedgerDSNFileIsASecret: a DSN file others can read is refused like
// the other secret files, and its content (a password) is never quoted.
func TestLedgerDSNFileIsASecret(t *testing.T) {
	dir := t.TempDir()
	dsn := filepath.Join(dir, "ledger.dsn")
	if err := os.WriteFile(dsn, []byte("postgres://capvend:s3cret-pw@127.0.0.1:9/capvend\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "capvend.yaml")
	body := "ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\nserver:\n  name: t\nhttp:\n  listen: 127.0.0.1:0\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := run(t, nil, "serve", "--config", cfg)
	if code != 1 || !strings.Contains(errOut, "ledger.dsn_file:") || !strings.Contains(errOut, "too open") || strings.Contains(errOut, "s3cret") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	// Readable by its owner only, the DSN is used; the server it names is
	// not there, and the error still does not quote the password.
	os.Chmod(dsn, 0o600)
	_, errOut, code = run(t, nil, "ledger", "verify", "--config", cfg)
	if code == 0 || strings.Contains(errOut, "s3cret") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
}

// TestLedgerCommandsOnPostgres: with ledger.driver postgres, capvend opens
// the ledger in a real PostgreSQL server (the DSN from ledger.dsn_file),
// and the ledger commands read it: verify, balance, export.
func TestLedgerCommandsOnPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := capvendtest.Postgres(t)
	// The server trusts loopback; the password is there to be kept secret.
	dsn = strings.Replace(dsn, pgserver.User+"@", pgserver.User+":s3cret-pw@", 1)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ledger.dsn"), []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "capvend.yaml")
	if err := os.WriteFile(cfgPath, []byte("ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\nserver:\n  name: t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(cfgPath, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if _, _, code := run(t, nil, "ledger", "verify", "--config", cfgPath); code == 0 {
		t.Fatal("verify of a database with no ledger passed: it must not create one")
	}
	l, err := cfg.Ledger.open(ctx, "", ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Engine() != "postgres" {
		t.Fatalf("engine %s", l.Engine())
	}
	if err := l.Post(ctx, ledger.Entry{Kind: "adjustment", Description: "opening", Postings: []ledger.Posting{
		{Account: ledger.AccountLND, Amount: 21_000}, {Account: "equity:opening", Amount: -21_000},
	}}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	for _, args := range [][]string{
		{"ledger", "verify", "--config", cfgPath},
		{"ledger", "balance", "--config", cfgPath},
		{"ledger", "export", "--format", "csv", "--config", cfgPath},
	} {
		out, errOut, code := run(t, nil, args...)
		if code != 0 || strings.Contains(out+errOut, "s3cret") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		if args[1] == "export" && !strings.Contains(out, "equity:opening") {
			t.Fatalf("export lacks the entry:\n%s", out)
		}
		if args[1] == "verify" && !strings.Contains(out, "checks passed") {
			t.Fatalf("verify:\n%s", out)
		}
	}
}

// TestLedgerMigrateToPostgres: `capvend ledger migrate --from sqlite:F --to
// postgres` copies a ledger with paid, refunded and credit records into an
// empty PostgreSQL database; both verify, their exports are identical,
// the copy goes on taking calls, and a second migrate into the now
// non-empty target is refused.
func TestLedgerMigrateToPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := capvendtest.Postgres(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ledger.dsn"), []byte(dsn), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "capvend.yaml")
	if err := os.WriteFile(cfgPath, []byte("ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\nserver:\n  name: t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "capvend.db")
	src, err := ledger.Open(ctx, db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c, _, err := src.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: fmt.Sprint("r", i),
			Server: "demo", Name: "echo", ArgsHash: strings.Repeat("a", 63) + fmt.Sprint(i), Price: 21_000, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := src.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
			Ref: strings.Repeat("b", 63) + fmt.Sprint(i), Bolt11: "lnbcrt210n1test", Amount: 21_000, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if i == 4 {
			continue // one call stays awaiting payment
		}
		if _, err := src.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			t.Fatal(err)
		}
		if _, err := src.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			if err := src.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "upstream failed"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := src.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[]}`)}); err != nil {
			t.Fatal(err)
		}
	}
	src.Close()

	out, errOut, code := run(t, nil, "ledger", "migrate", "--from", "sqlite:"+db, "--to", "postgres", "--config", cfgPath)
	if code != 0 || !strings.Contains(out, "5 calls, 5 payments") || strings.Count(out, "checks passed") != 2 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	fromSQLite, _, code1 := run(t, nil, "ledger", "export", "--format", "beancount", "--db", db)
	fromPG, _, code2 := run(t, nil, "ledger", "export", "--format", "beancount", "--config", cfgPath)
	if code1 != 0 || code2 != 0 || fromSQLite != fromPG || !strings.Contains(fromPG, "Income:Tools:Demo:Echo") {
		t.Fatalf("exports differ (exit %d, %d):\nSQLite:\n%s\nPostgreSQL:\n%s", code1, code2, fromSQLite, fromPG)
	}
	cfg, err := loadConfig(cfgPath, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	l, err := cfg.Ledger.open(ctx, "", ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, created, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: "after",
		Server: "demo", Name: "echo", ArgsHash: strings.Repeat("c", 64), Price: 21_000, Idempotent: true})
	if err != nil || !created || c.ID != 6 {
		t.Fatalf("a call after the copy: %+v %v %v (ids go on after the copied ones)", c, created, err)
	}
	l.Close()

	_, errOut, code = run(t, nil, "ledger", "migrate", "--from", "sqlite:"+db, "--config", cfgPath)
	if code == 0 || !strings.Contains(errOut, "not empty") {
		t.Fatalf("second migrate: exit %d, %s", code, errOut)
	}
}

// TestServeOnPostgres: `capvend serve` with ledger.driver postgres
// creates its ledger in the database of ledger.dsn_file, serves an MCP
// client (tools/list, a tools/call) and stops cleanly; the ledger then
// verifies.
func TestServeOnPostgres(t *testing.T) {
	ctx := context.Background()
	dsn := capvendtest.Postgres(t)
	src, listen := capvendtest.FreeToolsConfig(t, "")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(b), "ledger:\n  path: capvend.db\n", "ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\n", 1)
	if err := os.WriteFile(src, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(src), "ledger.dsn"), []byte(dsn), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("serve", func(t *testing.T) {
		startCapvend(t, src)
		c, err := client.NewStreamableHttpClient("http://" + listen + "/mcp")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatal(err)
		}
		for { // the upstream connects in the background
			list, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Tools) > 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal("serve lists no tools after a minute")
			case <-time.After(50 * time.Millisecond):
			}
		}
		req := mcp.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = "sha256", map[string]any{"text": "abc"}
		res, err := c.CallTool(ctx, req)
		if err != nil || res.IsError || len(res.Content) == 0 {
			t.Fatalf("sha256: %+v %v", res, err)
		}
	})
	out, errOut, code := run(t, nil, "ledger", "verify", "--config", src)
	if code != 0 || !strings.Contains(out, "checks passed") || !strings.Contains(out, "postgres://") {
		t.Fatalf("verify after serve: exit %d\n%s%s", code, out, errOut)
	}
}

// TestServeRefusesOtherPricesOnASharedLedger: two `capvend serve` with the
// same price book share one PostgreSQL ledger; a third whose price book
// differs (here a tool's rule: not idempotent; a price would need a
// payment backend) is refused at start, saying why.
func TestServeRefusesOtherPricesOnASharedLedger(t *testing.T) {
	dsn := capvendtest.Postgres(t)
	var paths []string
	for _, rule := range []string{"not_idempotent: false", "not_idempotent: false", "not_idempotent: true"} {
		path, _ := capvendtest.FreeToolsConfig(t, "")
		capvendtest.OnPostgres(t, path, dsn)
		capvendtest.EditConfig(t, path, "", "    tools:\n      sha256:\n        "+rule+"\n")
		paths = append(paths, path)
	}
	startCapvend(t, paths[0])
	startCapvend(t, paths[1])
	_, errOut, code := run(t, nil, "serve", "--config", paths[2])
	if code == 0 || !strings.Contains(errOut, "price book differs from a running instance's") || !strings.Contains(errOut, "same prices") {
		t.Fatalf("an instance with other prices: exit %d\n%s", code, errOut)
	}
}
