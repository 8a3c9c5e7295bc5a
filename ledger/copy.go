package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrTargetNotEmpty: CopyTo's target ledger already holds records.
var ErrTargetNotEmpty = errors.New("the target ledger is not empty")

// copyTables are the ledger's tables in an order that inserts every row
// after the rows it references. The state-machine tables (the same rows
// on both engines, written by the migrations) and schema_migrations are
// not copied.
var copyTables = []string{
	"calls", "payments", "payment_claims", "cashu_proofs", "results", "lnd_cursors",
	"accounts", "entries", "postings", "hold_preimages", "call_arguments", "free_uses",
	"request_replies", "executions", "refunds", "grant_tokens", "l402_root_keys",
	"l402_revocations", "credit_key", "credit_accounts", "credit_topups", "payouts", "credit_moves", "cashu_handed_out",
	"reconcile_cursors", "reconcile_runs", "reconcile_differences", "account_days",
	"ledger_identity", "lost_payments",
}

// drawnByMigration are the tables whose one row the target's migration
// drew at random and the copy replaces by the source's: the credit key
// (credit tokens stay good) and the ledger's identity (the invoices the
// source marked stay its own).
var drawnByMigration = []string{"credit_key", "ledger_identity"}

// notCopied are the tables CopyTo leaves out: the state machines' rows and
// schema_migrations, written by the target's own migrations, and the
// coordination state of instances sharing a ledger (request claims,
// leases, rate counts, price books, MCP sessions), which is not books and belongs to
// the running instances of the source.
var notCopied = []string{"call_transitions", "payment_transitions", "schema_migrations",
	"request_claims", "leases", "rate_counts", "instance_prices", "mcp_sessions"}

// CopyTo copies every record of l, from one consistent snapshot, into
// dst, which must be a PostgreSQL ledger with no records (the credit key
// and ledger identity its migration drew are replaced by l's, so that
// credit tokens stay good and l's invoices its own), in one transaction of dst: all of it or nothing. Rows keep their
// ids. The schema's triggers are off during the copy (the rows are
// already past the states they guard: a sealed entry's postings, an
// execution of a delivered call) and on again before it commits; its
// constraints and foreign keys check every row. It returns the number of
// rows copied per table, and ErrTargetNotEmpty if dst holds records.
// Run Verify on both afterwards.
func (l *Ledger) CopyTo(ctx context.Context, dst *Ledger) (map[string]int64, error) {
	if !dst.pg {
		return nil, errors.New("copy: the target must be a PostgreSQL ledger")
	}
	counts := map[string]int64{}
	err := l.read(ctx, func(src *sql.Tx) error {
		return dst.write(ctx, func(tx *wtx, _ time.Time) error {
			for _, t := range copyTables {
				if slices.Contains(drawnByMigration, t) {
					continue // drawn by the target's migration: replaced below
				}
				var n int64
				if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+t).Scan(&n); err != nil {
					return err
				}
				if n > 0 {
					return fmt.Errorf("%w: table %s has %d rows", ErrTargetNotEmpty, t, n)
				}
			}
			for _, t := range copyTables {
				if _, err := tx.ExecContext(ctx, "ALTER TABLE "+t+" DISABLE TRIGGER USER"); err != nil {
					return err
				}
			}
			for _, t := range drawnByMigration {
				if _, err := tx.ExecContext(ctx, "DELETE FROM "+t); err != nil {
					return err
				}
			}
			for _, t := range copyTables {
				n, err := copyTable(ctx, src, tx, t)
				if err != nil {
					return fmt.Errorf("copy %s: %w", t, err)
				}
				counts[t] = n
			}
			for _, t := range copyTables {
				if _, err := tx.ExecContext(ctx, "ALTER TABLE "+t+" ENABLE TRIGGER USER"); err != nil {
					return err
				}
			}
			return restartIdentities(ctx, tx)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("copy %s to %s: %w", l.path, dst.path, err)
	}
	return counts, nil
}

// copyTable copies the rows of table t from src into tx, column by name,
// and returns how many.
func copyTable(ctx context.Context, src *sql.Tx, tx *wtx, t string) (int64, error) {
	bytea := map[string]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT column_name, data_type FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = ?`, t)
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			rows.Close()
			return 0, err
		}
		bytea[name] = typ == "bytea"
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	srows, err := src.QueryContext(ctx, "SELECT * FROM "+t)
	if err != nil {
		return 0, err
	}
	defer srows.Close()
	cols, err := srows.Columns()
	if err != nil {
		return 0, err
	}
	q := "INSERT INTO " + t + " ("
	for i, c := range cols {
		if _, ok := bytea[c]; !ok {
			return 0, fmt.Errorf("column %s is not in the target's schema", c)
		}
		if i > 0 {
			q += ", "
		}
		q += c
	}
	q += ") VALUES (?" + strings.Repeat(", ?", len(cols)-1) + ")"
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var n int64
	for srows.Next() {
		if err := srows.Scan(ptrs...); err != nil {
			return n, err
		}
		for i, c := range cols {
			switch v := vals[i].(type) {
			case string:
				if bytea[c] {
					vals[i] = []byte(v)
				}
			case []byte:
				if !bytea[c] {
					vals[i] = string(v)
				}
			}
		}
		if _, err := tx.ExecContext(ctx, q, vals...); err != nil {
			return n, err
		}
		n++
	}
	return n, srows.Err()
}

// restartIdentities moves each identity column's sequence past the ids
// copied, so that the next row gets a new one.
func restartIdentities(ctx context.Context, tx *wtx) error {
	rows, err := tx.QueryContext(ctx, `SELECT table_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND column_name = 'id' AND is_identity = 'YES' ORDER BY table_name`)
	if err != nil {
		return err
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return err
		}
		tables = append(tables, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := tx.ExecContext(ctx, "SELECT setval(pg_get_serial_sequence('"+t+"', 'id'), coalesce(max(id), 0) + 1, false) FROM "+t); err != nil {
			return err
		}
	}
	return nil
}
