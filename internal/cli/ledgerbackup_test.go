package cli

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestLedgerBackupWhileServing: `capvend ledger backup` (the built binary)
// copies the ledger a running serve holds: the copy is verified and
// written once, mode 0600; an existing file is refused without --force,
// replaced with it; the copy verifies and balances as the ledger does.
func TestLedgerBackupWhileServing(t *testing.T) {
	t.Parallel()
	path, _ := capvendtest.FreeToolsConfig(t, "")
	dir := filepath.Dir(path)
	l, err := ledger.Open(context.Background(), filepath.Join(dir, "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	capvendtest.BookCalls(t, l, 0, 6, true)
	l.Close()
	startCapvend(t, path)

	if out := capvendIn(t, dir, nil, "ledger", "--help"); !strings.Contains(out, "backup ") {
		t.Fatalf("ledger --help does not list backup:\n%s", out)
	}
	out := capvendIn(t, dir, nil, "ledger", "backup", "--to", "backups/capvend.db", "--config", "capvend.yaml")
	if !strings.Contains(out, "one snapshot of 6 calls, 6 payments") || !strings.Contains(out, "checks passed") {
		t.Fatalf("backup:\n%s", out)
	}
	copyPath := filepath.Join(dir, "backups", "capvend.db")
	st, err := os.Stat(copyPath)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the backup: %v %v", st, err)
	}
	if out := capvendFails(t, dir, "ledger", "backup", "--to", "backups/capvend.db"); !strings.Contains(out, "--force") {
		t.Fatalf("a second backup to the same file:\n%s", out)
	}
	if st2, _ := os.Stat(copyPath); !st2.ModTime().Equal(st.ModTime()) {
		t.Fatal("the refused backup changed the file")
	}
	capvendIn(t, dir, nil, "ledger", "backup", "--to", "backups/capvend.db", "--force")
	if out := capvendIn(t, dir, nil, "ledger", "verify", "--db", "backups/capvend.db"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify of the backup:\n%s", out)
	}
	want := capvendIn(t, dir, nil, "ledger", "export", "--format", "beancount")
	got := capvendIn(t, dir, nil, "ledger", "export", "--format", "beancount", "--db", "backups/capvend.db")
	if got != want || !strings.Contains(got, "Income:Tools:Demo:Echo") {
		t.Fatalf("the backup's books differ from the ledger's:\n%s\nledger:\n%s", got, want)
	}
}

// TestLedgerBackupOfPostgresSaysPgDump: with ledger.driver postgres the
// command copies nothing and names PostgreSQL's tools.
func TestLedgerBackupOfPostgresSaysPgDump(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ledger.dsn"), []byte("postgres://capvend@127.0.0.1:9/capvend\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte("ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\nserver:\n  name: t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := capvendFails(t, dir, "ledger", "backup", "--to", "b.db")
	if !strings.Contains(out, "pg_dump") || strings.Contains(out, "127.0.0.1:9") {
		t.Fatalf("backup of a PostgreSQL ledger:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a file was written")
	}
}

// TestPgDumpRestoresALedger: a PostgreSQL ledger with money in it (paid,
// refunded and awaiting calls, a pruned result) survives pg_dump and
// pg_restore into an empty database: `capvend ledger verify` passes on
// the restored one, its books equal the original's, and it takes new
// calls (ids go on after the restored ones).
func TestPgDumpRestoresALedger(t *testing.T) {
	ctx := context.Background()
	dsn := capvendtest.Postgres(t)
	bin, err := pgserver.Bin()
	if err != nil {
		skip.Missing(t, err.Error(), "apt-get install postgresql")
	}
	l, err := ledger.OpenPostgres(ctx, dsn, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	capvendtest.BookCalls(t, l, 0, 6, true)
	if st, err := l.PruneBatch(ctx, time.Now().Add(time.Hour)); err != nil || st.Results == 0 {
		t.Fatalf("prune: %+v %v", st, err)
	}
	l.Close()

	dir := t.TempDir()
	dump := filepath.Join(dir, "capvend.dump")
	pg := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(filepath.Join(bin, name), args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	pg("pg_dump", "--format=custom", "--file="+dump, dsn)
	if _, err := capvendtest.OpenPG(t, dsn).Exec("CREATE DATABASE restored TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	restored := strings.Replace(dsn, "/capvend?", "/restored?", 1)
	pg("pg_restore", "--no-owner", "--exit-on-error", "--dbname="+restored, dump)

	configs := map[string]string{"original": dsn, "restored": restored}
	exports := map[string]string{}
	for name, d := range configs {
		sub := filepath.Join(dir, name)
		os.Mkdir(sub, 0o700)
		if err := os.WriteFile(filepath.Join(sub, "ledger.dsn"), []byte(d), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, "capvend.yaml"), []byte("ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\nserver:\n  name: t\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out := capvendIn(t, sub, nil, "ledger", "verify"); !strings.Contains(out, "checks passed") {
			t.Fatalf("verify of the %s ledger:\n%s", name, out)
		}
		exports[name] = capvendIn(t, sub, nil, "ledger", "export", "--format", "beancount") +
			capvendIn(t, sub, nil, "refunds", "--all")
	}
	if exports["original"] != exports["restored"] || !strings.Contains(exports["restored"], "Income:Tools:Demo:Echo") {
		t.Fatalf("the restored books differ:\n%s\noriginal:\n%s", exports["restored"], exports["original"])
	}
	r, err := ledger.OpenPostgres(ctx, restored, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, created, err := r.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: "after",
		Server: "demo", Name: "echo", ArgsHash: strings.Repeat("c", 64), Price: 21_000, Idempotent: true})
	if err != nil || !created || c.ID != 7 {
		t.Fatalf("a call after the restore: %+v %v %v", c, created, err)
	}
	if _, err := r.Result(ctx, 1); !errors.Is(err, vend.ErrResultExpired) {
		t.Fatalf("the pruned result after the restore: %v", err)
	}
}
