package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/capvend/capvend/migrations"
)

// writeLockKey is the PostgreSQL advisory lock every write transaction
// takes first ("capv", as SQLite's application_id).
//
// SQLite relies on its single writer: BEGIN IMMEDIATE takes the file's
// write lock, so each write transaction sees every commit before it and
// no other writer until it commits; checks such as a free quota's count
// followed by an insert depend on that. PostgreSQL gets the same
// guarantee from an explicit lock, not from serializable isolation: each
// write transaction (READ COMMITTED) first takes one transaction-scoped
// advisory lock (pg_advisory_xact_lock), held until COMMIT, which
// serializes the writers of every capvend instance sharing the database.
// Serializable isolation would abort conflicting transactions with 40001
// and need a retry of each; a retry of a group commit would re-run every
// caller's write in it, and a retried write that talked to a payment
// backend in between is not safe to re-run blindly. The lock keeps the
// group commit as it is (one lock and one commit for a batch of callers)
// and makes every write see the commits before it, as on SQLite. Reads
// run in REPEATABLE READ, read-only transactions: a consistent snapshot,
// as SQLite's read transactions are.
const writeLockKey = ApplicationID

// SQLSTATE codes the ledger maps (never messages): class 23 is an
// integrity constraint (23505 unique, 23514 check, 23503 foreign key),
// P0001 an exception raised by one of the schema's triggers.
const (
	pgUniqueViolation = "23505"
	pgRaiseException  = "P0001"
)

// OpenPostgres opens the ledger in the PostgreSQL database that dsn names
// (a URL or key=value DSN, as libpq reads it) and applies any pending
// migrations (migrations/postgres), holding the write lock while it does,
// so that instances starting together migrate once. The DSN is a secret:
// it appears in no error and no log; Path names the host, port and
// database only. It returns ErrNoLedger (opts.MustExist and no capvend
// schema in the database), ErrNotLedger (the database holds tables of
// another application) or ErrNewerSchema.
func OpenPostgres(ctx context.Context, dsn string, opts Options) (*Ledger, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors may quote the DSN: say only that it failed.
		return nil, errors.New("ledger: the PostgreSQL DSN does not parse (check ledger.dsn_file)")
	}
	name := "postgres://" + cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/" + cfg.Database
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 10 * time.Second
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	// As SQLite's busy timeout: how long a write waits for the write lock
	// another instance holds before it fails (SQLSTATE 55P03).
	cfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(busy.Milliseconds(), 10)
	db := sql.OpenDB(pgConnector{stdlib.GetConnector(*cfg)})
	db.SetMaxOpenConns(1)
	db.SetConnMaxIdleTime(0)
	ro := cfg.Copy()
	ro.RuntimeParams["default_transaction_read_only"] = "on" // as SQLite's query_only
	// Every reading connection stays open once opened, as SQLite's
	// (readers): a new one is a new session of the server.
	rdb := sql.OpenDB(pgConnector{stdlib.GetConnector(*ro)})
	rdb.SetMaxOpenConns(4)
	rdb.SetMaxIdleConns(4)
	udb := sql.OpenDB(pgConnector{stdlib.GetConnector(*ro)})
	udb.SetMaxOpenConns(2)
	udb.SetMaxIdleConns(2)
	l := newLedger(name, db, rdb, udb, opts, sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	l.pg = true
	if err := l.migratePG(ctx, opts.MustExist); err != nil {
		l.Close()
		return nil, err
	}
	if l.wconn, err = db.Conn(ctx); err != nil {
		l.Close()
		return nil, l.fileError(err)
	}
	l.startWriter()
	return l, nil
}

// Engine names the ledger's database engine: "sqlite" or "postgres".
func (l *Ledger) Engine() string {
	if l.pg {
		return "postgres"
	}
	return "sqlite"
}

// migratePG is migrate for PostgreSQL: it refuses a database of another
// application, then applies each pending migration in a transaction of its
// own under the write lock.
func (l *Ledger) migratePG(ctx context.Context, mustExist bool) error {
	var tables int
	var ours bool
	err := l.db.QueryRowContext(ctx, `SELECT count(*), coalesce(bool_or(table_name = 'schema_migrations'), false)
		FROM information_schema.tables WHERE table_schema = current_schema()`).Scan(&tables, &ours)
	if err != nil {
		return l.fileError(err)
	}
	switch {
	case tables > 0 && !ours:
		return fmt.Errorf("ledger %s: %w: the database holds %d tables of another application", l.path, ErrNotLedger, tables)
	case !ours && mustExist:
		return fmt.Errorf("ledger %s: %w (check ledger.dsn_file)", l.path, noLedgerError("no capvend ledger in the database"))
	}
	err = l.pgTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    BIGINT PRIMARY KEY,
			name       TEXT   NOT NULL,
			applied_at BIGINT NOT NULL)`)
		return err
	})
	if err != nil {
		return l.fileError(err)
	}
	sub, err := fs.Sub(migrations.FS, "postgres")
	if err != nil {
		return err
	}
	files, err := migrationFilesIn(sub)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return errors.New("ledger: no PostgreSQL migrations embedded")
	}
	var newest int
	if err := l.db.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&newest); err != nil {
		return l.fileError(err)
	}
	if len(files) > 0 && newest > files[len(files)-1].version {
		return fmt.Errorf("ledger %s: %w (schema %d, this capvend knows up to %d)", l.path, ErrNewerSchema, newest, files[len(files)-1].version)
	}
	for _, m := range files {
		err := l.pgTx(ctx, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM schema_migrations WHERE version = ?", m.version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
				m.version, m.name, l.now().UnixMilli())
			return err
		})
		if err != nil {
			return fmt.Errorf("ledger %s: %w", l.path, err)
		}
	}
	return nil
}

// pgTx runs fn in a transaction of l.db holding the write lock.
func (l *Ledger) pgTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(?)", int64(writeLockKey)); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// beginWrite begins a write transaction on the writer connection: BEGIN
// IMMEDIATE on SQLite (the file's write lock), and on PostgreSQL a READ
// COMMITTED transaction that first takes the write lock (see
// writeLockKey).
func (l *Ledger) beginWrite(ctx context.Context) error {
	q := "BEGIN IMMEDIATE"
	if l.pg {
		q = "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock(" + strconv.Itoa(writeLockKey) + ")"
	}
	_, err := l.wconn.ExecContext(ctx, q)
	if err != nil && l.pg && l.pgWriterGone() {
		// The server closed the connection (a restart, a failover, an
		// idle timeout): nothing of this transaction ran, so take a
		// new connection and begin again, once.
		if rerr := l.pgReconnect(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		_, err = l.wconn.ExecContext(ctx, q)
	}
	if err != nil && l.pg && l.inTx() {
		// BEGIN ran and the lock's wait failed (lock_timeout, a
		// canceled ctx): end that transaction, as a failed BEGIN
		// IMMEDIATE leaves none.
		if _, rerr := l.wconn.ExecContext(context.Background(), "ROLLBACK"); rerr != nil {
			err = errors.Join(err, l.fileError(rerr))
		}
	}
	return err
}

// pgWriterGone reports whether the writer connection is closed.
func (l *Ledger) pgWriterGone() bool {
	gone := true
	l.wconn.Raw(func(dc any) error {
		if c, ok := dc.(*pgConn); ok {
			gone = c.Conn.Conn().IsClosed()
		}
		return nil
	})
	return gone
}

// pgReconnect replaces the writer connection (and drops the statements
// prepared on the old one); the caller holds wmu.
func (l *Ledger) pgReconnect(ctx context.Context) error {
	for q, st := range l.stmts {
		st.Close()
		delete(l.stmts, q)
	}
	l.wconn.Close()
	c, err := l.db.Conn(ctx)
	if err != nil {
		return l.fileError(err)
	}
	l.wconn = c
	return nil
}

// pgInTx reports whether the pgx connection dc is inside a transaction
// (also a failed one); ok is false if dc is not one.
func pgInTx(dc any) (in, ok bool) {
	c, ok := dc.(*pgConn)
	if !ok {
		return false, false
	}
	return c.Conn.Conn().PgConn().TxStatus() != 'I', true
}

// pgCode is err's SQLSTATE if it is a PostgreSQL error, "" otherwise.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// commitWrite commits the writer connection's transaction. PostgreSQL
// answers COMMIT of a transaction a failed statement aborted with a
// rollback, not an error: that is refused here, before, as an error.
func (l *Ledger) commitWrite(ctx context.Context) error {
	if l.pg {
		var failed bool
		l.wconn.Raw(func(dc any) error {
			if c, ok := dc.(*pgConn); ok {
				failed = c.Conn.Conn().PgConn().TxStatus() == 'E'
			}
			return nil
		})
		if failed {
			return fmt.Errorf("ledger %s: a statement of the transaction failed; it is rolled back", l.path)
		}
	}
	if _, err := l.wconn.ExecContext(ctx, "COMMIT"); err != nil {
		return l.fileError(err)
	}
	return nil
}
