package ledger

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/internal/skip"
)

// The engine under test. The package's tests run on SQLite; with
// TestEngineEnv=postgres (TestPostgresConformance sets it for a second run
// of this test binary) every test that opens a ledger through OpenForTest
// runs on a real PostgreSQL server instead, one per test binary, started
// by StartTestEngine (TestMain), with a fresh database per ledger path.
const TestEngineEnv = "CAPVEND_TEST_LEDGER"

// testPG is the PostgreSQL server of this test binary, if any.
var testPG struct {
	mu      sync.Mutex
	missing string // why the server is not there (binaries missing)
	srv     *pgserver.Server
	dbs     map[string]string // database name -> DSN
}

// OnPostgres reports whether this test binary runs the ledger on PostgreSQL.
func OnPostgres() bool { return os.Getenv(TestEngineEnv) == "postgres" }

// SkipOnPostgres skips a test of something only SQLite has (its file, its
// pragmas, its single writer connection's internals).
func SkipOnPostgres(tb testing.TB, why string) {
	tb.Helper()
	if OnPostgres() {
		tb.Skip("SQLite only: " + why)
	}
}

// OpenForTest opens the ledger of path on the engine under test: the
// SQLite file path, or the PostgreSQL database named after path (created
// the first time, so opening the same path again is a restart).
func OpenForTest(tb testing.TB, ctx context.Context, path string, opts Options) (*Ledger, error) {
	tb.Helper()
	if !OnPostgres() {
		return Open(ctx, path, opts)
	}
	dsn := testDatabase(tb, path)
	return OpenPostgres(ctx, dsn, opts)
}

// testDatabase returns the DSN of path's database, creating it once.
func testDatabase(tb testing.TB, path string) string {
	tb.Helper()
	sum := sha256.Sum256([]byte(path))
	return testDSN(tb, "l"+hex.EncodeToString(sum[:10]))
}

// testDSN returns the DSN of database name, creating it once.
func testDSN(tb testing.TB, name string) string {
	tb.Helper()
	testPG.mu.Lock()
	defer testPG.mu.Unlock()
	if testPG.missing != "" {
		skip.Missing(tb, testPG.missing, "apt-get install postgresql")
	}
	if testPG.srv == nil {
		tb.Fatal("the PostgreSQL test server is not running: TestMain must call StartTestEngine")
	}
	if dsn, ok := testPG.dbs[name]; ok {
		return dsn
	}
	dsn, err := testPG.srv.CreateDatabase(context.Background(), name)
	if err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	testPG.dbs[name] = dsn
	return dsn
}

// StartTestEngine starts this test binary's PostgreSQL server when the
// engine under test is postgres, and returns the function that stops it.
// Missing binaries are not an error here: each test then skips (fails
// under CI) with the install command.
func StartTestEngine() (stop func(), err error) {
	if !OnPostgres() {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "capvend-ledger-pg-")
	if err != nil {
		return nil, err
	}
	srv, err := pgserver.Start(context.Background(), dir, pgserver.Options{NoFsync: true})
	if errors.Is(err, pgserver.ErrMissing) {
		os.RemoveAll(dir)
		testPG.missing = err.Error()
		return func() {}, nil
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	testPG.srv, testPG.dbs = srv, map[string]string{}
	return func() {
		srv.Destroy()
		os.RemoveAll(dir)
	}, nil
}

// OpenRawForTest opens the database behind a ledger directly, for tests
// that read or tamper with it below the ledger's API: on SQLite, the file
// name (with its query parameters) as sql.Open("sqlite3", name) takes it;
// on PostgreSQL, the same name's database (name may also be a ledger's
// Path), through the ledger's dialect, so that the same SQL runs.
func OpenRawForTest(tb testing.TB, name string) (*sql.DB, error) {
	tb.Helper()
	if !OnPostgres() {
		return sql.Open("sqlite3", name)
	}
	var dsn string
	name, _, _ = strings.Cut(name, "?")
	if db, ok := strings.CutPrefix(name, "postgres://"); ok {
		dsn = testDSN(tb, db[strings.LastIndexByte(db, '/')+1:])
	} else {
		dsn = testDatabase(tb, name)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(pgConnector{stdlib.GetConnector(*cfg)}), nil
}

// DropTriggerSQL is the statement that drops the trigger name on the
// engine under test (PostgreSQL names a trigger's table when dropping it).
func DropTriggerSQL(name string) string {
	if !OnPostgres() {
		return "DROP TRIGGER " + name
	}
	return `DO $$ DECLARE t text; BEGIN
		SELECT tgrelid::regclass::text INTO STRICT t FROM pg_trigger WHERE tgname = '` + name + `';
		EXECUTE format('DROP TRIGGER %I ON %s', '` + name + `', t); END $$`
}
