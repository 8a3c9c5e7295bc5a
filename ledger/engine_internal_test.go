package ledger

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

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
	dir     string
	port    int
	runAs   []string // runuser -u postgres -- (postgres refuses to run as root)
	admin   *sql.DB
	dbs     map[string]bool
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
	testPG.mu.Lock()
	defer testPG.mu.Unlock()
	if testPG.missing != "" {
		skip.Missing(tb, testPG.missing, "apt-get install postgresql")
	}
	if testPG.admin == nil {
		tb.Fatal("the PostgreSQL test server is not running: TestMain must call StartTestEngine")
	}
	sum := sha256.Sum256([]byte(path))
	name := "l" + hex.EncodeToString(sum[:10])
	if !testPG.dbs[name] {
		if _, err := testPG.admin.Exec("CREATE DATABASE " + name + " TEMPLATE template0"); err != nil {
			tb.Fatalf("create test database: %v", err)
		}
		testPG.dbs[name] = true
	}
	return testDSN(name)
}

func testDSN(db string) string {
	return fmt.Sprintf("postgres://capvend@127.0.0.1:%d/%s?sslmode=disable", testPG.port, db)
}

// StartTestEngine starts this test binary's PostgreSQL server when the
// engine under test is postgres, and returns the function that stops it.
// Missing binaries are not an error here: each test then skips (fails
// under CI) with the install command.
func StartTestEngine() (stop func(), err error) {
	if !OnPostgres() {
		return func() {}, nil
	}
	bin, err := postgresBin()
	if err != nil {
		testPG.missing = err.Error()
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "capvend-ledger-pg-")
	if err != nil {
		return nil, err
	}
	stop = func() { os.RemoveAll(dir) }
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			stop()
			return nil, fmt.Errorf("running as root and there is no postgres user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			stop()
			return nil, err
		}
		testPG.runAs = []string{"runuser", "-u", "postgres", "--"}
	}
	data := filepath.Join(dir, "data")
	if out, err := pgRun(filepath.Join(bin, "initdb"), "-D", data, "-U", "capvend", "--auth=trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		stop()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		stop()
		return nil, err
	}
	// fsync off: the tests check the ledger's rules, not the disk's
	// durability (which is PostgreSQL's, and SQLite's own test).
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c full_page_writes=off -c max_connections=300", port, dir)
	if out, err := pgRun(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		stop()
		return nil, fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	testPG.dir, testPG.port, testPG.dbs = dir, port, map[string]bool{}
	stop = func() {
		if testPG.admin != nil {
			testPG.admin.Close()
		}
		pgRun(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		os.RemoveAll(dir)
	}
	testPG.admin, err = sql.Open("pgx", testDSN("postgres")) // pgx/v5/stdlib's driver
	if err != nil {
		stop()
		return nil, err
	}
	if err := testPG.admin.Ping(); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

func pgRun(name string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, testPG.runAs...), name)
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = os.TempDir()
	return cmd.CombinedOutput()
}

// postgresBin finds the directory of initdb and pg_ctl: on PATH, or
// Debian's /usr/lib/postgresql/<version>/bin.
func postgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", errors.New("PostgreSQL's initdb and pg_ctl are not installed")
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
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
		dsn = testDSN(db[strings.LastIndexByte(db, '/')+1:])
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
