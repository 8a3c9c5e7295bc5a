package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
)

// pgDoc holds the PostgreSQL walk-through: its configuration with
// ledger.driver postgres and its commands.
const pgDoc = "docs/OPERATING.md"

// readmePostgres runs pgDoc's PostgreSQL commands the way a newcomer
// pastes them, in a fresh folder holding a copy of srcDB (the demo's
// SQLite ledger) and pgDoc's postgres configuration:
// `capvend testnet up --postgres` starts a real stack with its PostgreSQL
// server (the stack's directory is ~/.cache/capvend/testnet of a home of
// its own, so the jq line reads it), the DSN is written to ledger.dsn,
// the ledger is migrated into that database and verified there, and
// pg_dump backs it up. The stack is torn down at the end.
func readmePostgres(t *testing.T, run func(string, func(*testing.T)), srcDB string) {
	home := t.TempDir()
	stackDir := filepath.Join(home, ".cache", "capvend", "testnet")
	dir := t.TempDir()
	capvendtest.CopyFile(t, srcDB, filepath.Join(dir, "capvend.db"))
	if _, err := os.Stat(srcDB + "-wal"); err == nil {
		capvendtest.CopyFile(t, srcDB+"-wal", filepath.Join(dir, "capvend.db-wal"))
	}
	var cfg string
	for _, c := range docBlocks(t, pgDoc, "yaml") {
		if strings.Contains(c, "driver: postgres") {
			cfg = c
		}
	}
	if cfg == "" {
		t.Fatalf("%s has no configuration with ledger.driver: postgres", pgDoc)
	}
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	capvend := func(t *testing.T, args ...string) string {
		t.Helper()
		return capvendIn(t, dir, []string{"CAPVEND_TESTNET_DIR=" + stackDir}, args...)
	}
	shell := func(cmd string) {
		run(cmd, func(t *testing.T) {
			if _, err := exec.LookPath("jq"); err != nil {
				skip.Missing(t, "jq is not installed", "apt-get install jq")
			}
			c := exec.Command("sh", "-c", cmd)
			c.Dir, c.Env = dir, append(os.Environ(), "HOME="+home)
			if out, err := c.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, out)
			}
		})
	}
	// The stack runs its mint and relay as `capvend testnet ...`: the
	// real binary starts and stops it, not this test binary.
	bin := func(t *testing.T, args ...string) {
		t.Helper()
		// The whole environment: its HOME's cache holds the built btcd
		// and lnd, and the Go settings to build them if it does not.
		c := startCapvend(t, "", capvendtest.Options{Args: args, Process: true, Dir: dir, Env: []string{"CAPVEND_TESTNET_DIR=" + stackDir}})
		if code := c.Wait(); code != 0 {
			t.Fatalf("capvend %s: exit %d\n%s%s", strings.Join(args, " "), code, c.Stdout(), c.Stderr())
		}
	}
	t.Cleanup(func() { bin(t, "testnet", "down") })
	var dsn string
	run("capvend testnet up --postgres", func(t *testing.T) {
		if _, err := pgserver.Bin(); err != nil {
			skip.Missing(t, err.Error(), "apt-get install postgresql")
		}
		bin(t, "testnet", "up", "--postgres")
		st, err := testnet.Load(stackDir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Release()
		if st.Info.Postgres == nil || !strings.HasPrefix(st.Info.Postgres.DSN, "postgres://") {
			t.Fatalf("testnet.json has no PostgreSQL DSN: %+v", st.Info.Postgres)
		}
		dsn = st.Info.Postgres.DSN
	})
	if dsn == "" {
		return
	}
	shell("jq -r .postgres.dsn ~/.cache/capvend/testnet/testnet.json > ledger.dsn")
	shell("chmod 600 ledger.dsn")
	if b, err := os.ReadFile(filepath.Join(dir, "ledger.dsn")); err != nil || strings.TrimSpace(string(b)) != dsn {
		t.Fatalf("ledger.dsn holds %q (%v), not the stack's DSN %q", b, err, dsn)
	}
	run("capvend ledger migrate --from sqlite:capvend.db --to postgres --config capvend.yaml", func(t *testing.T) {
		out := capvend(t, "ledger", "migrate", "--from", "sqlite:capvend.db", "--to", "postgres", "--config", "capvend.yaml")
		// The demo made paid calls: they are copied, and both ledgers verify.
		if strings.Count(out, "checks passed") != 2 || !regexp.MustCompile(`: [1-9][0-9]* calls, [1-9][0-9]* payments`).MatchString(out) {
			t.Errorf("migrate:\n%s", out)
		}
	})
	const dump = `pg_dump --format=custom --file=capvend.dump "$(cat ledger.dsn)"`
	shell(dump)
	if _, err := exec.LookPath("jq"); err == nil { // shell ran it
		if st, err := os.Stat(filepath.Join(dir, "capvend.dump")); err != nil || st.Size() == 0 {
			t.Errorf("%s wrote no dump: %v", dump, err)
		}
	}
	run("capvend ledger verify --config capvend.yaml", func(t *testing.T) {
		out := capvend(t, "ledger", "verify", "--config", "capvend.yaml")
		if !strings.Contains(out, "checks passed") {
			t.Errorf("verify:\n%s", out)
		}
		// It read PostgreSQL: the demo's income is there.
		if out := capvend(t, "ledger", "balance", "--config", "capvend.yaml"); !strings.Contains(out, "income:tools:example:sha256") {
			t.Errorf("balance of the PostgreSQL ledger:\n%s", out)
		}
	})
}
