package testnet

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/internal/skip"
)

// TestStackPostgres: the stack's PostgreSQL server (Options.Postgres)
// starts as one of its processes, answers on its DSN with an empty
// database "capvend", is recorded in testnet.json, and stops with the
// others.
func TestStackPostgres(t *testing.T) {
	if _, err := pgserver.Bin(); errors.Is(err, pgserver.ErrMissing) {
		skip.Missing(t, err.Error(), "apt-get install postgresql")
	}
	t.Parallel() // its own directory and port, like TestStack and TestShared
	ctx := context.Background()
	dir := t.TempDir()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(Info{Version: 1, Dir: dir}, nil)
	s.Info.Postgres = &PostgresInfo{Listen: hostPort(ports[0]), DataDir: filepath.Join(dir, "postgres"),
		Proc: Proc{Log: filepath.Join(dir, "logs", "postgres.log")}}
	if err := s.startPostgres(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopAll(s.procs(), t.Logf)
		cleanDir(dir)
	})
	db, err := sql.Open("pgx", s.Info.Postgres.DSN)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	err = db.QueryRowContext(ctx, "SELECT current_database()").Scan(&name)
	db.Close()
	if err != nil || name != "capvend" {
		t.Fatalf("database %q: %v", name, err)
	}
	loaded, err := Load(dir, nil)
	if err != nil && loaded == nil {
		t.Fatal(err)
	}
	if loaded.Info.Postgres == nil || loaded.Info.Postgres.DSN != s.Info.Postgres.DSN || loaded.Info.Postgres.PID != s.Info.Postgres.PID {
		t.Fatalf("testnet.json: %+v", loaded.Info.Postgres)
	}
	loaded.Release()
	if err := stopAll(s.procs(), t.Logf); err != nil {
		t.Fatal(err)
	}
	if s.Info.Postgres.Alive() {
		t.Fatal("postgres still runs after the stack stopped")
	}
}
