package ledger

import (
	"context"
	"fmt"
	"time"
)

// ExecForTest runs q on the writer connection outside the ledger's
// methods: tests use it to write what an older capvend (or a damaged
// file) would hold.
func (l *Ledger) ExecForTest(ctx context.Context, q string, args ...any) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.wconn.ExecContext(ctx, q, args...)
	return err
}

// BypassForTest runs q with the named triggers out of the way, the way a
// person editing the file by hand (or a bug below the schema) would: it
// drops them, runs q and puts them back, in one transaction. Tests use it
// to break a ledger and see verify notice.
func (l *Ledger) BypassForTest(ctx context.Context, triggers []string, q string, args ...any) error {
	return l.write(ctx, func(tx *wtx, _ time.Time) error {
		if l.pg {
			return l.bypassPG(ctx, triggers, q, args...)
		}
		var defs []string
		for _, name := range triggers {
			var def string
			if err := l.wconn.QueryRowContext(ctx, "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", name).Scan(&def); err != nil {
				return fmt.Errorf("trigger %s: %w", name, err)
			}
			defs = append(defs, def)
			if _, err := l.wconn.ExecContext(ctx, "DROP TRIGGER "+name); err != nil {
				return err
			}
		}
		if _, err := l.wconn.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		for _, def := range defs {
			if _, err := l.wconn.ExecContext(ctx, def); err != nil {
				return err
			}
		}
		return nil
	})
}

// SetBatchingForTest turns group commit off (or on again): each write is
// then one BEGIN IMMEDIATE ... COMMIT of its own, with statement journals
// in temporary files, as the ledger wrote before batching. The benchmark
// uses it to measure both in one run.
func (l *Ledger) SetBatchingForTest(on bool) error {
	l.queue.mu.Lock()
	l.queue.off = !on
	l.queue.mu.Unlock()
	if l.pg {
		return nil
	}
	store := map[bool]string{true: "MEMORY", false: "DEFAULT"}[on]
	return l.ExecForTest(context.Background(), "PRAGMA temp_store = "+store)
}

// BatchStatsForTest returns how many batches the writer committed (or
// tried to) and how many writes they held.
func (l *Ledger) BatchStatsForTest() (commits, writes int) {
	l.queue.mu.Lock()
	defer l.queue.mu.Unlock()
	return l.queue.commits, l.queue.writes
}

// QueryRowForTest scans the one row of q into dest, read on the writer
// connection.
func (l *Ledger) QueryRowForTest(ctx context.Context, q string, dest ...any) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.wconn.QueryRowContext(ctx, q).Scan(dest...)
}

// bypassPG is BypassForTest's body on PostgreSQL: the triggers are
// disabled around q, inside the caller's transaction.
func (l *Ledger) bypassPG(ctx context.Context, triggers []string, q string, args ...any) error {
	tables := map[string]string{}
	for _, name := range triggers {
		var table string
		if err := l.wconn.QueryRowContext(ctx, "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = ?", name).Scan(&table); err != nil {
			return fmt.Errorf("trigger %s: %w", name, err)
		}
		tables[name] = table
		if _, err := l.wconn.ExecContext(ctx, "ALTER TABLE "+table+" DISABLE TRIGGER "+name); err != nil {
			return err
		}
	}
	if _, err := l.wconn.ExecContext(ctx, q, args...); err != nil {
		return err
	}
	for name, table := range tables {
		if _, err := l.wconn.ExecContext(ctx, "ALTER TABLE "+table+" ENABLE TRIGGER "+name); err != nil {
			return err
		}
	}
	return nil
}
