package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/capvend/capvend/ledger"
)

// TestBackupIsAVerifiedConsistentCopy: a backup taken while calls are
// being paid and delivered is one snapshot: the copy verifies, holds the
// snapshot's rows table by table, is a single file of mode 0600 with no
// temporary file left beside it, and opens as a ledger.
func TestBackupIsAVerifiedConsistentCopy(t *testing.T) {
	ledger.SkipOnPostgres(t, "the online backup of SQLite's file (TestBackupOfPostgresSaysPgDump covers PostgreSQL)")
	ctx := context.Background()
	dir := t.TempDir()
	l := openLedger(t, filepath.Join(dir, "capvend.db"))
	for i := range 20 {
		deliverPaid(t, l, i)
	}
	// Paid calls go on while the backup runs.
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 100; !stop.Load(); i++ {
			deliverPaid(t, l, i)
		}
	}()
	out := filepath.Join(dir, "backups", "capvend-backup.db")
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		t.Fatal(err)
	}
	rep, err := l.Backup(ctx, out, false)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Verify.OK() || rep.Rows["calls"] < 20 || rep.Rows["postings"] == 0 || rep.Bytes == 0 {
		var b strings.Builder
		rep.Verify.WriteTo(&b)
		t.Fatalf("report: rows %v, %d bytes\n%s", rep.Rows, rep.Bytes, b.String())
	}
	st, err := os.Stat(out)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v %v", st, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("beside the backup: %v (want the backup alone: no temporary, -wal or -shm file)", names)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if b[18] != 1 || b[19] != 1 {
		t.Fatalf("the backup's header says journal versions %d/%d: want 1/1 (a rollback-journal file, complete without a -wal)", b[18], b[19])
	}
	c, err := ledger.Open(ctx, out, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mustVerify(t, c)
	bal, err := c.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var income int64
	for _, tool := range bal.Tools {
		income += int64(tool.Revenue)
	}
	// Income is booked at settlement; a call's claim of its payment comes
	// with its execution, a transaction later: the snapshot may fall
	// between them. So count the copy's settled payments.
	db, err := sql.Open("sqlite3", "file:"+out+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var settled int64
	if err := db.QueryRow(`SELECT count(*) FROM payments WHERE state = 'settled'`).Scan(&settled); err != nil {
		t.Fatal(err)
	}
	if want := settled * 21_000; income != want || settled < rep.Rows["payment_claims"] {
		t.Fatalf("the copy's income %d msat, want %d (21 sat for each of the snapshot's %d settled payments; %d claimed)", income, want, settled, rep.Rows["payment_claims"])
	}
}

// TestBackupNeverReplacesWithoutForce: an existing file is refused (and
// left as it was) unless force; the ledger itself never; a canceled
// backup leaves nothing behind.
func TestBackupNeverReplacesWithoutForce(t *testing.T) {
	ledger.SkipOnPostgres(t, "the online backup of SQLite's file")
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "capvend.db")
	l := openLedger(t, path)
	deliverPaid(t, l, 1)
	out := filepath.Join(dir, "out", "backup.db")
	os.MkdirAll(filepath.Dir(out), 0o700)
	if err := os.WriteFile(out, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Backup(ctx, out, false); !errors.Is(err, ledger.ErrBackupExists) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("over an existing file: %v", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "precious" {
		t.Fatalf("the existing file was changed: %q", b)
	}
	if _, err := l.Backup(ctx, out, true); err != nil {
		t.Fatalf("with force: %v", err)
	}
	if b, _ := os.ReadFile(out); !strings.HasPrefix(string(b), "SQLite format 3") {
		t.Fatal("force did not replace the file with the backup")
	}
	if _, err := l.Backup(ctx, path, true); err == nil || !strings.Contains(err.Error(), "the ledger itself") {
		t.Fatalf("backup over the ledger itself: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	gone := filepath.Join(dir, "out", "canceled.db")
	if _, err := l.Backup(canceled, gone, false); err == nil {
		t.Fatal("a canceled backup succeeded")
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 || entries[0].Name() != "backup.db" {
		t.Fatalf("after a canceled backup the folder holds %d files", len(entries))
	}
	mustVerify(t, l)
}

// TestBackupOfPostgresSaysPgDump: a PostgreSQL ledger is not copied by
// capvend: Backup says to use pg_dump.
func TestBackupOfPostgresSaysPgDump(t *testing.T) {
	if !ledger.OnPostgres() {
		t.Skip("PostgreSQL only (TestPostgresConformance runs it)")
	}
	l := openLedger(t, "")
	_, err := l.Backup(context.Background(), filepath.Join(t.TempDir(), "b.db"), false)
	if !errors.Is(err, ledger.ErrBackupPostgres) || !strings.Contains(err.Error(), "pg_dump") {
		t.Fatalf("%v", err)
	}
}
