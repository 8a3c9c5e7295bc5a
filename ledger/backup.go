package ledger

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mattn/go-sqlite3"
)

// Errors returned by Backup.
var (
	// ErrBackupExists: the backup's file exists, and overwriting it was
	// not asked for. Nothing was written.
	ErrBackupExists = errors.New("the backup file exists")
	// ErrBackupPostgres: the ledger is in PostgreSQL, whose own tools
	// back it up (pg_dump; a base backup with WAL archiving).
	ErrBackupPostgres = errors.New("a PostgreSQL ledger is backed up with PostgreSQL's own tools")
)

// BackupReport says what Backup wrote.
type BackupReport struct {
	Path  string // the backup file
	Bytes int64  // its size
	// Rows is the number of rows of each table of the books (the tables
	// CopyTo copies) in the snapshot copied; the copy holds the same.
	Rows map[string]int64
	// Verify is the copy's own verification (Verify, run on the copy
	// opened read-only): every check passed, or Backup failed.
	Verify *Report
}

// backupStepPages is how many pages one step of the online backup copies
// (16 MiB of 4 KiB pages) before Backup looks at its ctx again.
const backupStepPages = 4096

// Backup writes a consistent copy of the SQLite ledger to the file to,
// while the ledger is in use (by this process or another capvend serve):
// SQLite's online backup API copies the pages of one read transaction's
// snapshot, which takes no lock a writer waits for, and the row counts of
// every table of the books are read in that same transaction. The copy is
// written to a temporary file (mode 0600) in to's directory, converted to
// a single self-contained file (rollback journal, no -wal beside it),
// synced, then opened read-only and verified: Verify must pass and every
// table must hold the snapshot's number of rows. Only then is it renamed
// to to (and the directory synced): to is never a half-written file.
// An existing to is refused with ErrBackupExists unless force; to is never
// the ledger itself. A PostgreSQL ledger is ErrBackupPostgres.
func (l *Ledger) Backup(ctx context.Context, to string, force bool) (*BackupReport, error) {
	if l.pg {
		return nil, fmt.Errorf("backup: %w: use pg_dump (see docs/OPERATING.md, Backups)", ErrBackupPostgres)
	}
	if to == "" {
		return nil, errors.New("backup: no file to write")
	}
	to, err := filepath.Abs(to)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if st, err := os.Stat(to); err == nil {
		if self, serr := os.Stat(l.path); serr == nil && os.SameFile(st, self) {
			return nil, fmt.Errorf("backup %s: that is the ledger itself", to)
		}
		if st.IsDir() {
			return nil, fmt.Errorf("backup %s: is a directory", to)
		}
		if !force {
			return nil, fmt.Errorf("backup %s: %w (pass --force to replace it)", to, ErrBackupExists)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("backup: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(to), "."+filepath.Base(to)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	tmp := f.Name()
	f.Close()
	defer func() {
		for _, s := range []string{"", "-journal", "-wal", "-shm"} {
			os.Remove(tmp + s)
		}
	}()
	rows, err := l.backupTo(ctx, tmp)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", to, err)
	}
	if err := syncFile(tmp); err != nil {
		return nil, fmt.Errorf("backup %s: %w", to, err)
	}
	rep := &BackupReport{Path: to, Rows: rows}
	if rep.Verify, err = verifyCopy(ctx, tmp, rows); err != nil {
		return nil, fmt.Errorf("backup %s: the copy: %w", to, err)
	}
	rep.Verify.Path = to
	if !rep.Verify.OK() {
		var b strings.Builder
		rep.Verify.WriteTo(&b)
		return rep, fmt.Errorf("backup %s: the copy failed verification; nothing was written:\n%s", to, b.String())
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, fmt.Errorf("backup %s: %w", to, err)
	}
	if force {
		err = os.Rename(tmp, to)
	} else {
		// A hard link is refused if to appeared meanwhile: the
		// no-clobber rename.
		if err = os.Link(tmp, to); errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("%w (pass --force to replace it)", ErrBackupExists)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", to, err)
	}
	if err := syncDir(filepath.Dir(to)); err != nil {
		return nil, fmt.Errorf("backup %s: %w", to, err)
	}
	if st, err := os.Stat(to); err == nil {
		rep.Bytes = st.Size()
	}
	return rep, nil
}

// backupTo copies the ledger to the empty file tmp with SQLite's online
// backup, from one read transaction in which it also counts the rows of
// every table of the books, and returns those counts.
func (l *Ledger) backupTo(ctx context.Context, tmp string) (map[string]int64, error) {
	src, err := l.rdb.Conn(ctx)
	if err != nil {
		return nil, l.fileError(err)
	}
	defer src.Close()
	ddb, err := sql.Open(sqliteDriver, tmp+"?_busy_timeout=10000")
	if err != nil {
		return nil, err
	}
	defer ddb.Close()
	dst, err := ddb.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	var rows map[string]int64
	err = src.Raw(func(sc any) error {
		s, ok := sc.(*sqlite3.SQLiteConn)
		if !ok {
			return fmt.Errorf("not an SQLite connection: %T", sc)
		}
		// The snapshot: the first read after BEGIN starts it, and the
		// backup's steps read in it (they begin no transaction of their
		// own while one is open), so no write restarts the copy.
		if _, err := s.Exec("BEGIN", nil); err != nil {
			return err
		}
		defer s.Exec("ROLLBACK", nil)
		if rows, err = countRows(s); err != nil {
			return err
		}
		return dst.Raw(func(dc any) error {
			d, ok := dc.(*sqlite3.SQLiteConn)
			if !ok {
				return fmt.Errorf("not an SQLite connection: %T", dc)
			}
			b, err := d.Backup("main", s, "main")
			if err != nil {
				return err
			}
			for {
				if err := ctx.Err(); err != nil {
					b.Close()
					return err
				}
				done, err := b.Step(backupStepPages)
				if err != nil {
					b.Close()
					return err
				}
				if done {
					break
				}
			}
			return b.Finish()
		})
	})
	if err != nil {
		return nil, l.fileError(err)
	}
	// The pages say WAL, as the ledger's do: make the copy one file that
	// needs no -wal or -shm beside it (capvend switches it back to WAL
	// when it opens it as its ledger).
	var mode string
	if err := dst.QueryRowContext(ctx, "PRAGMA journal_mode = DELETE").Scan(&mode); err != nil {
		return nil, err
	}
	if mode != "delete" {
		return nil, fmt.Errorf("the copy's journal mode is %s, not delete", mode)
	}
	return rows, nil
}

// countRows counts the rows of every table of the books (copyTables) on
// the raw connection s, in its open transaction.
func countRows(s *sqlite3.SQLiteConn) (map[string]int64, error) {
	out := map[string]int64{}
	for _, t := range copyTables {
		r, err := s.Query("SELECT count(*) FROM "+t, nil)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", t, err)
		}
		v := make([]driver.Value, 1)
		err = r.Next(v)
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", t, err)
		}
		n, ok := v[0].(int64)
		if !ok {
			return nil, fmt.Errorf("count %s: %T", t, v[0])
		}
		out[t] = n
	}
	return out, nil
}

// verifyCopy opens the copy at path read-only, runs the ledger's checks
// on it and compares its row counts with want (nil: none to compare); a
// count that differs is a failed check of the report.
func verifyCopy(ctx context.Context, path string, want map[string]int64) (*Report, error) {
	db, err := sql.Open(sqliteDriver, "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro&_query_only=1")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	c := newLedger(path, db, db, db, Options{}, sql.TxOptions{ReadOnly: true})
	var appID int64
	if err := db.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return nil, c.fileError(err)
	}
	if appID != ApplicationID {
		return nil, fmt.Errorf("%w: application_id %#x", ErrNotLedger, appID)
	}
	rep, err := c.Verify(ctx)
	if err != nil {
		return nil, err
	}
	if want == nil {
		return rep, nil
	}
	same := Check{Name: "the copy holds the snapshot's rows, table by table"}
	for _, t := range slices.Sorted(maps.Keys(want)) {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+t).Scan(&n); err != nil {
			return nil, c.fileError(err)
		}
		if n != want[t] {
			same.Count++
			if len(same.Problems) < maxExamples {
				same.Problems = append(same.Problems, fmt.Sprintf("%s: %d rows, the ledger's snapshot %d", t, n, want[t]))
			}
		}
	}
	rep.Checks = append(rep.Checks, same)
	return rep, nil
}

// syncFile flushes the file at path to the disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// syncDir flushes a directory's entries (a rename or link in it) to the
// disk.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
