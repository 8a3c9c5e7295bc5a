package capvendtest

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/internal/skip"
)

// Postgres starts a PostgreSQL server for the test (skipping, and
// failing under CI, when its binaries are missing) and returns the DSN of
// an empty database.
func Postgres(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	srv, err := pgserver.Start(ctx, filepath.Join(t.TempDir(), "pg"), pgserver.Options{NoFsync: true})
	if errors.Is(err, pgserver.ErrMissing) {
		skip.Missing(t, err.Error(), "apt-get install postgresql")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Destroy() })
	dsn, err := srv.CreateDatabase(ctx, "capvend")
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// OpenPG opens the PostgreSQL database of dsn for the test's own
// queries, closed when the test ends.
func OpenPG(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	return db
}

// Query runs q on db and scan on each row.
func Query(t testing.TB, db *sql.DB, q string, scan func(*sql.Rows) error) {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// WaitLedger polls query (one integer) on db until ok says yes.
func WaitLedger(t testing.TB, db *sql.DB, what string, guard time.Duration, ok func(int) bool, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(guard) // a deadlock guard
	for {
		var n int
		err := db.QueryRow(query, args...).Scan(&n)
		if err == nil && ok(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %d (%v) after %s", what, n, err, guard)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
