package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/migrations"
	"github.com/capvend/capvend/vend"
)

// TestPostgresConformance runs this package's whole suite again on a real
// PostgreSQL server: the test binary runs itself with
// CAPVEND_TEST_LEDGER=postgres (see ledger.TestEngineEnv), so every test
// that opens a ledger through OpenForTest runs on PostgreSQL, and the few
// about SQLite's file skip saying why. The suite passes on both engines
// or this test fails with the PostgreSQL run's output.
func TestPostgresConformance(t *testing.T) {
	if ledger.OnPostgres() {
		t.Skip("this is the PostgreSQL run")
	}
	skip.Short(t, "the ledger suite on PostgreSQL")
	args := []string{"-test.count=1", "-test.timeout=30m", "-test.v"}
	// -run narrows the PostgreSQL run as it narrows this one; -run
	// TestPostgresConformance alone runs the whole suite there.
	if f := flag.Lookup("test.run"); f != nil {
		if run := strings.Trim(f.Value.String(), "^$"); run != "" && run != "TestPostgresConformance" {
			args = append(args, "-test.run="+f.Value.String())
		}
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), ledger.TestEngineEnv+"=postgres")
	out, err := cmd.CombinedOutput()
	passed := regexp.MustCompile(`(?m)^--- PASS: `).FindAll(out, -1)
	var skipped [][]byte // the tests of SQLite's own file, skipped there
	for _, s := range regexp.MustCompile(`(?m)^--- SKIP: .*$`).FindAll(out, -1) {
		if !strings.Contains(string(s), " TestPostgresConformance ") {
			skipped = append(skipped, s)
		}
	}
	if err != nil {
		t.Fatalf("the suite failed on PostgreSQL: %v\n%s", err, out)
	}
	if len(passed) == 0 {
		t.Fatalf("no test ran on PostgreSQL:\n%s", out)
	}
	t.Logf("on PostgreSQL: %d tests passed, %d skipped (SQLite only)", len(passed), len(skipped))
	for _, s := range skipped {
		t.Log(string(s))
	}
}

// TestOpenPostgresRefusesWhatIsNotALedger: a database of another
// application, one with no ledger when it must exist, and one written by
// a newer capvend are refused; a DSN that does not parse is refused
// without being quoted (it holds the password).
func TestOpenPostgresRefusesWhatIsNotALedger(t *testing.T) {
	if !ledger.OnPostgres() {
		t.Skip("PostgreSQL only (TestPostgresConformance runs it)")
	}
	ctx := context.Background()
	path := func(name string) string { return filepath.Join(t.TempDir(), name) }

	_, err := ledger.OpenForTest(t, ctx, path("missing"), ledger.Options{MustExist: true})
	if !errors.Is(err, ledger.ErrNoLedger) || !strings.Contains(err.Error(), "no capvend ledger in the database") ||
		strings.Contains(err.Error(), "no ledger file") {
		t.Errorf("missing: %v; want ErrNoLedger, saying the database has no capvend ledger (a database is no file)", err)
	}

	foreign := path("foreign")
	db, err := ledger.OpenRawForTest(t, foreign)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE customers (id BIGINT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := ledger.OpenForTest(t, ctx, foreign, ledger.Options{}); !errors.Is(err, ledger.ErrNotLedger) ||
		!strings.Contains(err.Error(), "another application") {
		t.Errorf("foreign: %v", err)
	}

	newer := path("newer")
	l := openLedger(t, newer)
	l.Close()
	db, err = ledger.OpenRawForTest(t, newer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, 'future.sql', 0)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := ledger.OpenForTest(t, ctx, newer, ledger.Options{}); !errors.Is(err, ledger.ErrNewerSchema) {
		t.Errorf("newer: %v", err)
	}

	const secret = "s3cret-Pw"
	_, err = ledger.OpenPostgres(ctx, "postgres://capvend:"+secret+"@127.0.0.1:notaport/db", ledger.Options{})
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("bad DSN: %v", err)
	}
}

// TestPostgresInstancesKeepOneSetOfBooks: three ledgers (three capvend
// instances) open the same PostgreSQL database and race for the same
// payments, executions and free uses. Each payment is booked once, each
// call runs once, the free quota holds across them, and the books verify.
func TestPostgresInstancesKeepOneSetOfBooks(t *testing.T) {
	if !ledger.OnPostgres() {
		t.Skip("PostgreSQL only (TestPostgresConformance runs it)")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared")
	var ls []*ledger.Ledger
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC) // one day for every instance's free uses
	for range 3 {
		l, err := ledger.OpenForTest(t, ctx, path, ledger.Options{Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	const calls = 20
	var quoted []vend.Call
	var payments []vend.Payment
	for i := range calls {
		c, p := quote(t, ls[i%3], i)
		quoted, payments = append(quoted, c), append(payments, p)
	}
	var settled, started, free atomic.Int32
	var wg sync.WaitGroup
	for n, l := range ls {
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := payments[i]
				_, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount})
				switch {
				case err == nil:
					settled.Add(1)
				case !errors.Is(err, vend.ErrAlreadySettled):
					t.Errorf("settle %d: %v", i, err)
				}
				if _, err := l.StartExecution(ctx, quoted[i].ID, quoted[i].Binding(), quoted[i].Released(vend.SchemeInvoice)); err == nil {
					started.Add(1)
				} else if !errors.Is(err, vend.ErrIllegalTransition) {
					t.Errorf("start %d: %v", i, err)
				}
				ok, err := l.ClaimFreeUse(ctx, use("client-1", fmt.Sprint("free-", n, "-", i)))
				if err != nil {
					t.Errorf("free use %d: %v", i, err)
				}
				if ok {
					free.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if settled.Load() != calls || started.Load() != calls {
		t.Fatalf("%d settlements and %d executions of %d calls by 3 instances, want one each", settled.Load(), started.Load(), calls)
	}
	if free.Load() != 3 {
		t.Fatalf("%d free uses across 3 instances, want the quota of 3", free.Load())
	}
	for _, c := range quoted {
		got, err := ls[0].Call(ctx, c.ID)
		if err != nil || got.Executions != 1 || got.State != vend.CallExecuting {
			t.Fatalf("call %d: %+v %v", c.ID, got, err)
		}
	}
	mustVerify(t, ls[1])
}

// TestPostgresWriterReconnects: when the server ends the writer's
// connection (a restart, a failover), the next write takes a new one.
func TestPostgresWriterReconnects(t *testing.T) {
	if !ledger.OnPostgres() {
		t.Skip("PostgreSQL only (TestPostgresConformance runs it)")
	}
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	quote(t, l, 1)
	db, err := ledger.OpenRawForTest(t, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ended int
	if err := db.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&ended); err != nil || ended == 0 {
		t.Fatalf("ended %d connections: %v", ended, err)
	}
	c, p := quote(t, l, 2)
	if _, err := l.SettlePayment(context.Background(), vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	if got := callState(t, l, c.ID); got != vend.CallPaid {
		t.Fatalf("call %d is %s", c.ID, got)
	}
	mustVerify(t, l)
}

// TestSchemasMatch: the PostgreSQL schema is the SQLite one: each
// migration has its PostgreSQL twin of the same name; once both are
// applied, the same tables hold the same columns, and every trigger and
// named index of SQLite's is in PostgreSQL's (PostgreSQL has a few more:
// TRUNCATE, which SQLite lacks, is refused there too).
func TestSchemasMatch(t *testing.T) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := fs.Stat(migrations.FS, "postgres/"+n); err != nil {
			t.Errorf("migrations/%s has no PostgreSQL twin migrations/postgres/%s", n, n)
		}
	}
	pgNames, _ := fs.Glob(migrations.FS, "postgres/*.sql")
	if len(pgNames) != len(names) {
		t.Errorf("%d SQLite migrations, %d PostgreSQL ones", len(names), len(pgNames))
	}
	if !ledger.OnPostgres() {
		return // the rest compares the two databases (TestPostgresConformance runs it)
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	lite, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lite.Close()
	openLedger(t, path).Close() // the PostgreSQL database of the same name
	sq, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	pg, err := ledger.OpenRawForTest(t, path)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	set := func(db *sql.DB, q string) map[string]bool {
		t.Helper()
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out[s] = true
		}
		return out
	}
	liteCols := set(sq, `SELECT m.name || '.' || c.name FROM sqlite_master m, pragma_table_info(m.name) c
		WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'`)
	pgCols := set(pg, `SELECT table_name || '.' || column_name FROM information_schema.columns WHERE table_schema = current_schema()`)
	for c := range liteCols {
		if !pgCols[c] {
			t.Errorf("column %s is not in the PostgreSQL schema", c)
		}
	}
	for c := range pgCols {
		if !liteCols[c] {
			t.Errorf("column %s is only in the PostgreSQL schema", c)
		}
	}
	pgTriggers := set(pg, `SELECT tgname FROM pg_trigger WHERE NOT tgisinternal`)
	for tr := range set(sq, `SELECT name FROM sqlite_master WHERE type = 'trigger'`) {
		if !pgTriggers[tr] {
			t.Errorf("trigger %s is not in the PostgreSQL schema", tr)
		}
	}
	t.Logf("%d columns, %d triggers in PostgreSQL", len(pgCols), len(pgTriggers))
	pgIndexes := set(pg, `SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()`)
	for ix := range set(sq, `SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL`) {
		if !pgIndexes[ix] {
			t.Errorf("index %s is not in the PostgreSQL schema", ix)
		}
	}
}

// TestPostgresWriteLockTimesOut: a write waits for the write lock
// another instance holds no longer than Options.BusyTimeout (as SQLite's
// busy timeout), fails without writing, and goes through once the lock
// is free.
func TestPostgresWriteLockTimesOut(t *testing.T) {
	if !ledger.OnPostgres() {
		t.Skip("PostgreSQL only (TestPostgresConformance runs it)")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	holder := openLedger(t, path)
	waiter, err := ledger.OpenForTest(t, ctx, path, ledger.Options{BusyTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	if err := holder.ExecForTest(ctx, fmt.Sprintf("BEGIN; SELECT pg_advisory_xact_lock(%d)", ledger.ApplicationID)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := waiter.RecordCall(ctx, newCall(1)); err == nil {
		t.Fatal("a write went through while another instance held the write lock")
	}
	if err := holder.ExecForTest(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if _, created, err := waiter.RecordCall(ctx, newCall(1)); err != nil || !created {
		t.Fatalf("after the lock was released: created %v, %v", created, err)
	}
}
