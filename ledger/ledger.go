// Package ledger is capvend's durable record of money: priced calls,
// payment requests and their settlement, Cashu proofs received, stored
// results, the record of every execution (what was sent upstream, checked
// against what the call sold), refunds owed to clients and their payouts
// (refunds.go), credit accounts, and a double-entry journal in
// millisatoshis.
//
// # What it owns
//
// It implements vend.Ledger and its books on a SQLite file (Open:
// mattn/go-sqlite3 with WAL, synchronous=FULL, foreign keys and immediate
// write transactions) or in a PostgreSQL database (OpenPostgres: pgx,
// the same tables, numbering and money rules). Every state change is one
// transaction, and the schema's own constraints and triggers enforce the
// money rules, so a bug above this package cannot book an unbalanced
// entry, edit a posting or skip a state. A call records what it sold (a
// tool, a prompt or a resource: vend.ItemKind), and its income is booked
// to income:tools:<server>:<tool>, income:prompts:<server>:<prompt> or
// income:resources:<server>:<uri> (ItemIncomeAccount). Beside the books:
// Verify, exports, backups and restores, CopyTo between engines, stored
// Nostr replies, shared MCP sessions, and the coordination of instances
// sharing a PostgreSQL ledger (instances.go).
//
// # How it fits
//
// It imports vend (the interfaces it implements), migrations (the
// schemas), internal/journal and reconcile (it is the reconciler's
// store); only internal/cli and test kits import it.
//
// # Writes
//
// Writes are group-committed: one writer goroutine runs the writes of
// concurrent callers in one transaction, a savepoint each, with one fsync
// (batch.go). On PostgreSQL every write transaction first takes one
// advisory lock, so the writers of every instance run one at a time as on
// SQLite (writeLockKey); the queries are written once and translated at
// the driver (pgsql.go). docs/ARCHITECTURE.md has the ledger's state
// machines and crashes; docs/OPERATING.md its backups, exports,
// PostgreSQL and several instances.
package ledger

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/capvend/capvend/migrations"
	"github.com/capvend/capvend/vend"
)

// ApplicationID marks a SQLite file as a capvend ledger ("capv").
const ApplicationID = 0x63617076

// sqliteDriver is mattn/go-sqlite3 with capvend's SQL functions
// registered on every connection: capvend_sha256(X), the lower-case hex
// SHA-256 of a BLOB or TEXT, which the schema's rule for pruning a stored
// answer recomputes (migrations/0024_result_retention.sql). A connection
// of another program lacks it, so its update of a stored answer fails.
const sqliteDriver = "capvend-sqlite3"

func init() {
	sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		return c.RegisterFunc("capvend_sha256", sha256Hex, true)
	}})
}

// sha256Hex is capvend_sha256.
func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Errors returned by Open.
var (
	// ErrNoLedger: Options.MustExist was set and there is no ledger: the
	// SQLite file does not exist, or the PostgreSQL database has no
	// capvend tables. The error wrapping it says which (noLedgerError).
	ErrNoLedger = errors.New("no capvend ledger")
	// ErrNotLedger: the file is not an SQLite database, or an SQLite
	// database of another application.
	ErrNotLedger = errors.New("not a capvend ledger")
	// ErrCorrupt: SQLite reports the file as damaged.
	ErrCorrupt = errors.New("ledger file is corrupt")
	// ErrNewerSchema: the file was written by a newer capvend.
	ErrNewerSchema = errors.New("ledger was written by a newer capvend")
)

// Options tune Open.
type Options struct {
	// MustExist makes Open fail with ErrNoLedger instead of creating a new
	// ledger (read commands use it so a typo in a path is not a new, empty
	// ledger).
	MustExist bool
	// Now is the clock; nil means time.Now. Each transaction stamps one now.
	Now func() time.Time
	// BusyTimeout is how long a writer waits for another process's lock
	// (default 10 s).
	BusyTimeout time.Duration
	// Observer, if set, is told each write's changes once committed and
	// how long each write transaction took (see vend.Observer).
	Observer vend.Observer
	// ClaimTakeover is how long a dead instance's request claim stands
	// (see ClaimRequest); 0: DefaultClaimTakeover.
	ClaimTakeover time.Duration
	// SoleReplyWriter says no other process stores replies (RememberReply)
	// in this SQLite ledger while it is open: capvend serve, which holds
	// the ledger's lock. Reply then tells a key that has none from memory
	// (replyindex.go). Ignored by OpenPostgres: instances share its
	// replies.
	SoleReplyWriter bool
}

// Ledger is an open ledger file. It is safe for concurrent use.
type Ledger struct {
	path string
	db   *sql.DB // the writer's pool: one connection
	rdb  *sql.DB // reads: a pool of query-only connections
	// udb serves the reads of urgent contexts (vend.Urgent: money in
	// motion) on query-only connections of their own (see reader).
	udb *sql.DB
	now func() time.Time
	// creditKey caches the credit key (schema 13), read once.
	creditKeyMu sync.Mutex
	creditKey   []byte
	obs         vend.Observer // opts.Observer; nil: changes are not collected
	// claimTakeover is opts.ClaimTakeover, or DefaultClaimTakeover.
	claimTakeover time.Duration
	// pg: the ledger is in PostgreSQL (OpenPostgres), not SQLite.
	pg bool
	// rateSwept is the minute (unix ms) whose older rate counts CountCall
	// deleted last.
	rateSwept atomic.Int64
	// sessionsSwept is when PutSession last deleted expired sessions
	// (unix ms).
	sessionsSwept atomic.Int64
	// readOpts begins read transactions (PostgreSQL: repeatable read, a
	// snapshot, as SQLite's read transactions are).
	readOpts *sql.TxOptions

	// SQLite has one writer at a time: capvend's writes run on wconn, in
	// BEGIN IMMEDIATE transactions, with statements prepared once
	// (preparing a statement that fires the schema's triggers compiles
	// the triggers too, which costs more than running it). Whoever uses
	// wconn holds wmu: the writer goroutine for each batch, a batch of
	// stored replies, an unbatched write. Other processes are waited for
	// by the busy timeout.
	wmu   sync.Mutex
	wconn *sql.Conn
	stmts map[string]*sql.Stmt

	queue   writeQueue // write transactions waiting for their group commit (batch.go)
	replies replyBatch // stored replies waiting for their group commit
	// replyIdx, with Options.SoleReplyWriter, knows which keys may have
	// a stored reply (replyindex.go); nil: Reply always reads.
	replyIdx *replyIndex
}

var _ vend.Ledger = (*Ledger)(nil)

// Open opens (creating it with mode 0600 unless opts.MustExist) the ledger
// at path and applies any pending migrations. It returns ErrNoLedger,
// ErrNotLedger, ErrCorrupt or ErrNewerSchema, wrapped with the path, when the
// file cannot be used.
func Open(ctx context.Context, path string, opts Options) (*Ledger, error) {
	if path == "" {
		return nil, errors.New("ledger: empty path")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("ledger: path %q: '?' and '#' are not allowed in a ledger path", path)
	}
	if err := prepareFile(path, opts.MustExist); err != nil {
		return nil, err
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 10 * time.Second
	}
	base := path + "?_foreign_keys=on&_synchronous=FULL&_busy_timeout=" + strconv.FormatInt(busy.Milliseconds(), 10)
	if err := inspect(ctx, path, base); err != nil {
		return nil, err
	}
	db, err := sql.Open(sqliteDriver, base+"&_journal_mode=WAL&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // SQLite has one writer; queue in Go, not in busy loops
	db.SetConnMaxIdleTime(0)
	rdb, err := readers(base, 4)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	udb, err := readers(base, 2)
	if err != nil {
		db.Close()
		rdb.Close()
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	l := newLedger(path, db, rdb, udb, opts, sql.TxOptions{ReadOnly: true})
	if err := l.migrate(ctx); err != nil {
		l.Close()
		return nil, err
	}
	if opts.SoleReplyWriter {
		if err := l.loadReplyIndex(ctx); err != nil {
			l.Close()
			return nil, err
		}
	}
	if l.wconn, err = db.Conn(ctx); err != nil {
		l.Close()
		return nil, l.fileError(err)
	}
	// Statement journals and the savepoints' sub-journals in memory:
	// with temporary files, a caller's savepoint spilled to a file in
	// /var/tmp past 64 KiB, and every statement journal allocated and
	// freed 64 KiB chunks (glibc then returned the heap top to the kernel
	// at each statement). They only serve rolling back a statement or a
	// savepoint inside an open transaction, so durability does not
	// depend on where they are.
	if _, err := l.wconn.ExecContext(ctx, "PRAGMA temp_store = MEMORY"); err != nil {
		l.Close()
		return nil, l.fileError(err)
	}
	l.startWriter()
	return l, nil
}

// noLedgerError is ErrNoLedger in the words of the driver that found no
// ledger: a missing file is SQLite's, a database without capvend's tables
// PostgreSQL's.
type noLedgerError string

func (e noLedgerError) Error() string { return string(e) }
func (e noLedgerError) Unwrap() error { return ErrNoLedger }

// prepareFile makes sure path is either absent-and-creatable or a file that
// starts like an SQLite database, and creates a new ledger file 0600 so the
// SQLite files that follow it (-wal, -shm) inherit that mode.
func prepareFile(path string, mustExist bool) error {
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if mustExist {
			return fmt.Errorf("ledger %s: %w (check ledger.path in the configuration, or pass --db)", path, noLedgerError("no ledger file"))
		}
		if dir := filepath.Dir(path); dir != "" {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("ledger %s: %w", path, err)
			}
		}
		nf, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("ledger %s: %w", path, err)
		}
		return nf.Close()
	case err != nil:
		return fmt.Errorf("ledger %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("ledger %s: %w", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("ledger %s: is a directory, not a ledger file", path)
	}
	if st.Size() == 0 {
		return nil // created by us and never written, or touched: a new ledger
	}
	header := make([]byte, 16)
	if _, err := io.ReadFull(f, header); err != nil || string(header) != "SQLite format 3\x00" {
		return fmt.Errorf("ledger %s: %w: the file is not an SQLite database", path, ErrNotLedger)
	}
	return nil
}

// Path returns the ledger's file path.
func (l *Ledger) Path() string { return l.path }

// Close closes the ledger. It is safe to call more than once. Writes
// queued before Close are committed (or fail) before it returns, and
// their callers are told which; writes after Close fail with ErrClosed.
func (l *Ledger) Close() error {
	l.stopWriter()
	l.wmu.Lock()
	for q, st := range l.stmts {
		st.Close()
		delete(l.stmts, q)
	}
	if l.wconn != nil {
		l.wconn.Close()
		l.wconn = nil
	}
	l.wmu.Unlock()
	err1 := l.db.Close()
	err2 := l.rdb.Close()
	err3 := l.udb.Close()
	return errors.Join(err1, err2, err3)
}

// readers opens a pool of n query-only connections to the ledger of base
// (the shared reads, and those of urgent contexts). All n stay open once
// opened (database/sql keeps 2 idle by default: under more concurrent
// reads it closed and opened SQLite connections, each parsing the schema
// again), and each keeps its last readStmtCache statements prepared
// (preparing was a third of a reply lookup's CPU).
func readers(base string, n int) (*sql.DB, error) {
	db, err := sql.Open(sqliteDriver, base+"&_txlock=deferred&_query_only=1&_stmt_cache_size="+strconv.Itoa(readStmtCache))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	return db, nil
}

// readStmtCache is how many prepared statements each reading connection
// keeps (go-sqlite3's _stmt_cache_size): more than the ledger's distinct
// hot reads.
const readStmtCache = 64

// reader is the pool for ctx's reads: the urgent one for a context
// marked vend.Urgent (a paid call, a known payer), so that those do not
// wait behind a flood's lookups; the shared one otherwise.
func (l *Ledger) reader(ctx context.Context) *sql.DB {
	if vend.IsUrgent(ctx) {
		return l.udb
	}
	return l.rdb
}

// inspect looks at an existing file through a query-only connection, before
// anything (such as switching to WAL) writes to it: a file of another
// application is refused untouched.
func inspect(ctx context.Context, path, base string) error {
	db, err := sql.Open(sqliteDriver, base+"&_query_only=1")
	if err != nil {
		return fmt.Errorf("ledger %s: %w", path, err)
	}
	defer db.Close()
	l := &Ledger{path: path}
	var appID int64
	if err := db.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return l.fileError(err)
	}
	var tables int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master WHERE type = 'table'").Scan(&tables); err != nil {
		return l.fileError(err)
	}
	if appID != ApplicationID && tables > 0 {
		return fmt.Errorf("ledger %s: %w: it is an SQLite database of another application (application_id %#x, %d tables)", path, ErrNotLedger, appID, tables)
	}
	return nil
}

// newLedger is the ledger named name on its pools (writes, reads, and
// urgent reads), with opts' settings or their defaults, before its
// migration; read is its read transactions' options.
func newLedger(name string, db, rdb, udb *sql.DB, opts Options, read sql.TxOptions) *Ledger {
	l := &Ledger{path: name, db: db, rdb: rdb, udb: udb, now: opts.Now, obs: opts.Observer,
		claimTakeover: cmp.Or(opts.ClaimTakeover, DefaultClaimTakeover), readOpts: &read}
	if l.now == nil {
		l.now = time.Now
	}
	return l
}

// migrate applies the embedded migrations that are not recorded yet, each
// in its own transaction.
func (l *Ledger) migrate(ctx context.Context) error {
	var appID int64
	if err := l.db.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return l.fileError(err)
	}
	if _, err := l.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL)`); err != nil {
		return l.fileError(err)
	}
	if appID != ApplicationID {
		if _, err := l.db.ExecContext(ctx, fmt.Sprintf("PRAGMA application_id = %d", ApplicationID)); err != nil {
			return l.fileError(err)
		}
	}
	files, err := migrationFiles()
	if err != nil {
		return err
	}
	var newest int
	if err := l.db.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&newest); err != nil {
		return l.fileError(err)
	}
	if len(files) > 0 && newest > files[len(files)-1].version {
		return fmt.Errorf("ledger %s: %w (schema %d, this capvend knows up to %d)", l.path, ErrNewerSchema, newest, files[len(files)-1].version)
	}
	for _, m := range files {
		if err := l.apply(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

func (l *Ledger) apply(ctx context.Context, m migration) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return l.fileError(err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM schema_migrations WHERE version = ?", m.version).Scan(&n); err != nil {
		return l.fileError(err)
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return fmt.Errorf("ledger %s: migration %s: %w", l.path, m.name, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
		m.version, m.name, l.now().UnixMilli()); err != nil {
		return l.fileError(err)
	}
	if err := tx.Commit(); err != nil {
		return l.fileError(err)
	}
	return nil
}

type migration struct {
	version int
	name    string
	sql     string
}

func migrationFiles() ([]migration, error) { return migrationFilesIn(migrations.FS) }

// migrationFilesIn reads the numbered migrations of fsys, in order.
func migrationFilesIn(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, name := range names {
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migrations: %s: name must start with a positive number and '_'", name)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations: %s and %s share version %d", out[i-1].name, out[i].name, out[i].version)
		}
	}
	return out, nil
}

// fileError turns driver errors about the file itself into the package's
// sentinel errors, by SQLite result code (never by message).
func (l *Ledger) fileError(err error) error {
	var se sqlite3.Error
	if errors.As(err, &se) {
		switch se.Code {
		case sqlite3.ErrNotADB:
			return fmt.Errorf("ledger %s: %w: the file is not an SQLite database", l.path, ErrNotLedger)
		case sqlite3.ErrCorrupt:
			return fmt.Errorf("ledger %s: %w (%v); restore it from a backup", l.path, ErrCorrupt, err)
		}
	}
	return fmt.Errorf("ledger %s: %w", l.path, err)
}

// isConstraint reports whether err is a constraint violation (including
// a refusal by one of the schema's triggers): SQLite's SQLITE_CONSTRAINT
// (RAISE(ABORT)), PostgreSQL's SQLSTATE class 23 or P0001 (RAISE EXCEPTION).
func isConstraint(err error) bool {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return se.Code == sqlite3.ErrConstraint
	}
	code := pgCode(err)
	return strings.HasPrefix(code, "23") || code == pgRaiseException
}

// isUnique reports whether err is a UNIQUE or PRIMARY KEY violation
// (PostgreSQL: SQLSTATE 23505).
func isUnique(err error) bool {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey
	}
	return pgCode(err) == pgUniqueViolation
}

// wtx is a write transaction on the writer connection. Its methods run
// cached prepared statements.
type wtx struct {
	l *Ledger
	// detached: statements ignore the cancellation of the ctx they are
	// given. A batch sets it: a canceled statement interrupts the
	// connection, which can roll back the whole batch transaction, the
	// other callers' changes with it.
	detached bool
	// changes collects what the write changed, for the Observer once it
	// is committed; nil when the ledger has none.
	changes *[]vend.Change
}

// changed records c for the Observer (see wtx.changes).
func (tx *wtx) changed(c vend.Change) {
	if tx.changes != nil {
		*tx.changes = append(*tx.changes, c)
	}
}

// ctx is the context a statement of tx runs with.
func (tx *wtx) ctx(ctx context.Context) context.Context {
	if tx.detached {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// stmt returns the prepared statement for query; the caller holds wmu.
func (l *Ledger) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := l.stmts[query]; ok {
		return st, nil
	}
	st, err := l.wconn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if l.stmts == nil {
		l.stmts = map[string]*sql.Stmt{}
	}
	l.stmts[query] = st
	return st, nil
}

// ExecContext runs a statement in the transaction.
func (tx *wtx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx = tx.ctx(ctx)
	st, err := tx.l.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// QueryContext runs a query in the transaction.
func (tx *wtx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx = tx.ctx(ctx)
	st, err := tx.l.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// QueryRowContext runs a single-row query in the transaction.
func (tx *wtx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx = tx.ctx(ctx)
	st, err := tx.l.stmt(ctx, query)
	if err != nil {
		// Let the preparation error surface from Scan.
		return tx.l.wconn.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

// write runs fn as one transaction stamped with one now: fn's changes
// commit if it returns nil and are rolled back otherwise. write returns
// once they are committed (fsynced), or with fn's error or the commit's.
// Concurrent writes share a commit (group commit, batch.go): fn runs in a
// savepoint of the writer's batch transaction, so it sees the changes of
// the writes before it in the batch, and its statements are not canceled
// by ctx (a ctx done before fn's turn makes fn not run).
func (l *Ledger) write(ctx context.Context, fn func(tx *wtx, now time.Time) error) (err error) {
	if l.batching() {
		return l.enqueue(ctx, fn)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.writeLocked(ctx, fn)
}

// batching reports whether writes go through the writer's batches (tests
// and the benchmark turn it off to compare with one commit per write).
func (l *Ledger) batching() bool {
	l.queue.mu.Lock()
	defer l.queue.mu.Unlock()
	return !l.queue.off
}

// writeRelaxed is write without the fsync at commit (synchronous=NORMAL
// for this one transaction): the commit survives capvend being killed, not
// a power cut. Only for what is not money (stored replies).
func (l *Ledger) writeRelaxed(ctx context.Context, fn func(tx *wtx, now time.Time) error) (err error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.wconn == nil {
		return fmt.Errorf("ledger %s: %w", l.path, ErrClosed)
	}
	relax, restore := "PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"
	if l.pg {
		// The commit waits for no WAL flush: it survives capvend, not
		// a crash of the PostgreSQL server.
		relax, restore = "SET synchronous_commit = off", "RESET synchronous_commit"
	}
	if _, err := l.wconn.ExecContext(ctx, relax); err != nil {
		return l.fileError(err)
	}
	defer func() {
		// Every other transaction must stay durable: if this fails the
		// connection is unusable for money, so say so loudly.
		if _, rerr := l.wconn.ExecContext(context.Background(), restore); rerr != nil {
			err = errors.Join(err, fmt.Errorf("ledger %s: restoring synchronous=FULL: %w", l.path, l.fileError(rerr)))
		}
	}()
	return l.writeLocked(ctx, fn)
}

// writeLocked is the body of an unbatched write (one transaction of its
// own); the caller holds wmu.
func (l *Ledger) writeLocked(ctx context.Context, fn func(tx *wtx, now time.Time) error) (err error) {
	if l.wconn == nil {
		return fmt.Errorf("ledger %s: %w", l.path, ErrClosed)
	}
	began := time.Now()
	if err := l.beginWrite(ctx); err != nil {
		return l.fileError(err)
	}
	done := false
	defer func() {
		if !done {
			// Roll back even if ctx is canceled: the connection must
			// not stay inside a transaction.
			if _, rbErr := l.wconn.ExecContext(context.Background(), "ROLLBACK"); rbErr != nil {
				err = errors.Join(err, l.fileError(rbErr))
			}
		}
	}()
	tx := &wtx{l: l}
	var changes []vend.Change
	if l.obs != nil {
		tx.changes = &changes
	}
	if err := fn(tx, l.now().UTC()); err != nil {
		return err
	}
	if err := l.commitWrite(ctx); err != nil {
		return err
	}
	done = true
	if l.obs != nil {
		l.obs.LedgerCommit(time.Since(began), 1)
		if len(changes) > 0 {
			l.obs.LedgerChanged(changes)
		}
	}
	return nil
}

// read runs fn in one read transaction: a consistent snapshot.
func (l *Ledger) read(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := l.rdb.BeginTx(ctx, l.readOpts)
	if err != nil {
		return l.fileError(err)
	}
	defer tx.Rollback()
	return fn(tx)
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }
