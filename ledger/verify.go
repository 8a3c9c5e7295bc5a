package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/capvend/capvend/vend"
)

// Check is the outcome of one invariant check.
type Check struct {
	Name     string
	Problems []string // empty when the invariant holds; at most maxExamples listed
	Count    int      // how many violations there are in all
}

// Report is the outcome of Verify.
type Report struct {
	Path   string
	Checks []Check
}

// OK reports whether every invariant holds.
func (r *Report) OK() bool {
	for _, c := range r.Checks {
		if c.Count > 0 {
			return false
		}
	}
	return true
}

// WriteTo writes the report for a person to read.
func (r *Report) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	failed := 0
	for _, c := range r.Checks {
		if c.Count > 0 {
			failed++
		}
	}
	if failed == 0 {
		fmt.Fprintf(&b, "ledger %s: all %d checks passed\n", r.Path, len(r.Checks))
	} else {
		fmt.Fprintf(&b, "ledger %s: %d of %d checks FAILED\n", r.Path, failed, len(r.Checks))
	}
	for _, c := range r.Checks {
		if c.Count == 0 {
			fmt.Fprintf(&b, "  ok    %s\n", c.Name)
			continue
		}
		fmt.Fprintf(&b, "  FAIL  %s: %d violation(s)\n", c.Name, c.Count)
		for _, p := range c.Problems {
			fmt.Fprintf(&b, "          %s\n", p)
		}
		if c.Count > len(c.Problems) {
			fmt.Fprintf(&b, "          ... and %d more\n", c.Count-len(c.Problems))
		}
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

const maxExamples = 10

// invariant is one check: a query whose every row is a violation, rendered
// by a format string over its columns.
type invariant struct {
	name   string
	query  string
	format string
}

var invariants = []invariant{
	{
		name: "every entry balances (postings sum to zero, at least two postings)",
		query: `SELECT e.id, coalesce(sum(p.amount_msat), 0), count(p.id) FROM entries e
			LEFT JOIN postings p ON p.entry_id = e.id WHERE e.sealed = 1
			GROUP BY e.id HAVING count(p.id) < 2 OR coalesce(sum(p.amount_msat), 0) <> 0`,
		format: "entry %v: sum %v msat over %v postings",
	},
	{
		name:   "no entry is left unsealed",
		query:  `SELECT id, kind, description FROM entries WHERE sealed = 0`,
		format: "entry %v (%v %q) was never sealed: its postings are not booked",
	},
	{
		name: "each settled payment has exactly one income entry",
		query: `SELECT p.id, p.ref, p.state, count(e.id) FROM payments p
			LEFT JOIN entries e ON e.payment_id = p.id AND e.kind = 'settlement' AND e.sealed = 1
			GROUP BY p.id HAVING (p.state = 'settled') <> (count(e.id) = 1) OR count(e.id) > 1`,
		format: "payment %v (%v) is %v with %v settlement entries",
	},
	{
		name: "no delivered priced call without a settled payment",
		query: `SELECT c.id, c.server, c.tool, c.price_msat FROM calls c WHERE c.state = 'delivered'
			AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.call_id = c.id
				AND p.state = 'settled' AND p.settled_msat >= c.price_msat)
			AND NOT EXISTS (SELECT 1 FROM credit_moves d WHERE d.call_id = c.id AND d.kind = 'draw' AND -d.amount_msat = c.price_msat)`,
		format: "call %v (%v/%v, %v msat) was delivered without a settled payment or a credit draw",
	},
	{
		name: "no call executed without payment",
		// A claimed payment that was canceled covers a run only when the
		// run failed: its hold invoice was canceled to return the money.
		query: `SELECT c.id, c.state FROM calls c WHERE (c.executions > 0 OR c.state IN ('executing', 'delivered', 'failed'))
			AND NOT EXISTS (SELECT 1 FROM payment_claims pc JOIN payments p ON p.id = pc.payment_id
				WHERE pc.call_id = c.id AND (p.state IN ('settled', 'accepted')
					OR p.state = 'canceled' AND p.kind = 'hold_invoice' AND c.state IN ('failed', 'refunded')))
			AND NOT EXISTS (SELECT 1 FROM credit_moves d WHERE d.call_id = c.id AND d.kind = 'draw')`,
		format: "call %v (%v) ran without a claimed payment",
	},
	{
		name:   "no non-idempotent call executed twice",
		query:  `SELECT id, executions FROM calls WHERE idempotent = 0 AND executions > 1`,
		format: "call %v executed %v times",
	},
	{
		name: "every execution sent exactly what its call sold (kind, server, tool, args hash)",
		query: `SELECT e.call_id, e.seq, e.kind, e.server, e.tool, e.args_hash,
				coalesce(c.kind, '(no call)'), coalesce(c.server, ''), coalesce(c.tool, ''), coalesce(c.args_hash, '')
			FROM executions e LEFT JOIN calls c ON c.id = e.call_id
			WHERE c.id IS NULL OR e.kind <> c.kind OR e.server <> c.server OR e.tool <> c.tool OR e.args_hash <> c.args_hash`,
		format: "call %v execution %v sent %v %v/%v (args %.12v…); the call sold %v %v/%v (args %.12v…)",
	},
	{
		name: "each call's execution count equals its execution records",
		query: `SELECT c.id, c.executions, count(e.id) FROM calls c LEFT JOIN executions e ON e.call_id = c.id
			GROUP BY c.id HAVING c.executions <> count(e.id)`,
		format: "call %v counts %v executions but %v are recorded",
	},
	{
		name: "every call that ran keeps its stored result",
		query: `SELECT c.id, c.state FROM calls c
			WHERE (c.state IN ('delivered', 'failed') OR c.state = 'refunded' AND c.executions > 0)
			AND NOT EXISTS (SELECT 1 FROM results r WHERE r.call_id = c.id)`,
		format: "call %v is %v but its result is gone",
	},
	{
		name: "every pruned answer keeps a well-formed record of its body (SHA-256, size, error flag); no whole one claims to be pruned",
		// The empty body's SHA-256 is the only hash of size 0.
		query: `SELECT 'result of call', CAST(call_id AS TEXT), CASE WHEN pruned_at IS NULL THEN 'is whole but has a pruned record'
				ELSE 'has a malformed pruned record' END FROM results
			WHERE CASE WHEN pruned_at IS NULL THEN body_sha256 IS NOT NULL OR body_size IS NOT NULL
				ELSE ` + prunedRecordBroken("body", "stored_at") + ` END
			UNION ALL
			SELECT 'reply to', request_key, CASE WHEN pruned_at IS NULL THEN 'is whole but has a pruned record'
				ELSE 'has a malformed pruned record' END FROM request_replies
			WHERE CASE WHEN pruned_at IS NULL THEN reply_sha256 IS NOT NULL OR reply_size IS NOT NULL OR is_error IS NOT NULL
				ELSE is_error IS NULL OR is_error NOT IN (0, 1) OR ` + prunedRecordBroken("reply", "created_at") + ` END`,
		format: "%v %v %v",
	},
	{
		name:   "no payment claimed twice",
		query:  `SELECT payment_id, count(*) FROM payment_claims GROUP BY payment_id HAVING count(*) > 1`,
		format: "payment %v claimed %v times",
	},
	{
		name:   "no Cashu proof received twice",
		query:  `SELECT secret_hash, count(*) FROM cashu_proofs WHERE state <> 'released' GROUP BY secret_hash HAVING count(*) > 1`,
		format: "proof %.12v… received %v times",
	},
	{
		name: "every settled payment of a refunded (or expired, canceled) call has exactly one refund entry",
		query: `SELECT id, ref, state, n FROM (SELECT c.id, p.ref, c.state,
				(SELECT count(*) FROM entries e WHERE e.call_id = c.id AND e.kind = 'refund' AND e.sealed = 1) AS n
				FROM calls c JOIN payments p ON p.call_id = c.id AND p.state = 'settled') AS s
			WHERE n <> CASE WHEN state IN ('refunded', 'expired', 'canceled') THEN 1 ELSE 0 END`,
		format: "call %v (payment %v) is %v with %v refund entries",
	},
	{
		name: "paid calls have a settled or locked-in payment",
		// Canceled covers nothing: it is legitimate only for a failed
		// call whose hold invoice was canceled to return the money (the
		// call is refunded next).
		query: `SELECT c.id, c.state FROM calls c WHERE c.state IN ('paid', 'executing', 'delivered', 'failed')
			AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.call_id = c.id AND p.amount_msat >= c.price_msat
				AND (p.state IN ('settled', 'accepted') OR p.state = 'canceled' AND p.kind = 'hold_invoice' AND c.state = 'failed'))
			AND NOT EXISTS (SELECT 1 FROM credit_moves d WHERE d.call_id = c.id AND d.kind = 'draw' AND -d.amount_msat = c.price_msat)`,
		format: "call %v is %v but has no settled or accepted payment or credit draw covering it",
	},
	{
		name: "every credit account's balance equals its top-ups minus draws plus give-backs minus refunds and expiries",
		query: `SELECT a.id, a.balance_msat, coalesce(sum(m.amount_msat), 0) FROM credit_accounts a
			LEFT JOIN credit_moves m ON m.account_id = a.id GROUP BY a.id HAVING a.balance_msat <> coalesce(sum(m.amount_msat), 0)`,
		format: "credit account %v has balance %v msat but its moves sum to %v msat",
	},
	{
		name: "every credit account's balance equals its journal account, and none is negative",
		query: `SELECT a.id, a.balance_msat, j.owed FROM credit_accounts a
			LEFT JOIN (SELECT ac.name, -sum(p.amount_msat) AS owed FROM postings p JOIN accounts ac ON ac.id = p.account_id
				JOIN entries e ON e.id = p.entry_id AND e.sealed = 1
				WHERE ac.name LIKE 'liabilities:credit:%' GROUP BY ac.name) j ON j.name = 'liabilities:credit:' || a.id
			WHERE a.balance_msat < 0 OR a.balance_msat <> coalesce(j.owed, 0)`,
		format: "credit account %v has balance %v msat; the journal owes it %v msat",
	},
	{
		name: "every credit move is booked by its own entry on its account, and every credit entry is a move",
		query: `SELECT 'move', m.id, m.kind || ' of ' || m.account_id FROM credit_moves m LEFT JOIN entries e ON e.id = m.entry_id AND e.sealed = 1
			WHERE e.id IS NULL OR m.amount_msat <> coalesce((SELECT -sum(p.amount_msat) FROM postings p JOIN accounts ac ON ac.id = p.account_id
				WHERE p.entry_id = e.id AND ac.name = 'liabilities:credit:' || m.account_id), 0)
			UNION ALL
			SELECT DISTINCT 'entry', e.id, e.description FROM entries e JOIN postings p ON p.entry_id = e.id JOIN accounts ac ON ac.id = p.account_id
			WHERE e.sealed = 1 AND (ac.name LIKE 'liabilities:credit:%' OR ac.name = 'liabilities:credit_drawn')
				AND NOT EXISTS (SELECT 1 FROM credit_moves m WHERE m.entry_id = e.id)`,
		format: "credit %v %v (%v) has no matching journal entry or move",
	},
	{
		name: "drawn credit equals the draws of calls still running",
		query: `SELECT j.drawn, o.open FROM
			(SELECT -coalesce(sum(p.amount_msat), 0) AS drawn FROM postings p JOIN accounts ac ON ac.id = p.account_id
				JOIN entries e ON e.id = p.entry_id AND e.sealed = 1 WHERE ac.name = 'liabilities:credit_drawn') j,
			(SELECT -coalesce(sum(d.amount_msat), 0) AS open FROM credit_moves d WHERE d.kind = 'draw' AND NOT EXISTS
				(SELECT 1 FROM credit_moves x WHERE x.call_id = d.call_id AND x.kind IN ('deliver', 'giveback'))) o
			WHERE j.drawn <> o.open`,
		format: "liabilities:credit_drawn holds %v msat, the open draws %v msat",
	},
	{
		name: "a credit draw ends as its call: delivered to income, given back if refunded",
		query: `SELECT d.call_id, c.state, coalesce(x.kind, 'open') FROM credit_moves d JOIN calls c ON c.id = d.call_id
			LEFT JOIN credit_moves x ON x.call_id = d.call_id AND x.kind IN ('deliver', 'giveback')
			WHERE d.kind = 'draw' AND NOT (c.state = 'delivered' AND coalesce(x.kind, '') = 'deliver'
				OR c.state = 'refunded' AND coalesce(x.kind, '') = 'giveback' OR c.state IN ('executing', 'failed') AND x.kind IS NULL)`,
		format: "call %v is %v but its credit draw is %v",
	},
	{
		name: "every delivered top-up credited its account once, with its price",
		query: `SELECT c.id, c.state, count(m.id) FROM calls c JOIN credit_topups t ON t.call_id = c.id
			LEFT JOIN credit_moves m ON m.call_id = c.id AND m.kind = 'topup' AND m.account_id = t.account_id AND m.amount_msat = c.price_msat
			GROUP BY c.id HAVING count(m.id) <> CASE WHEN c.state = 'delivered' THEN 1 ELSE 0 END`,
		format: "top-up call %v is %v with %v credit top-ups",
	},
	{
		name: "the daily account totals (account_days, the dashboard's revenue) equal the journal",
		query: `SELECT coalesce(j.day, d.day), (SELECT name FROM accounts WHERE id = coalesce(j.account_id, d.account_id)),
				coalesce(j.amount, 0), coalesce(j.settlements, 0), coalesce(d.amount_msat, 0), coalesce(d.settlements, 0)
			FROM (SELECT date(e.ts / 1000, 'unixepoch') AS day, p.account_id, sum(p.amount_msat) AS amount,
					count(DISTINCT CASE WHEN e.kind = 'settlement' THEN e.id END) AS settlements
				FROM postings p JOIN entries e ON e.id = p.entry_id WHERE e.sealed = 1 GROUP BY day, p.account_id) j
			FULL JOIN account_days d ON d.day = j.day AND d.account_id = j.account_id
			WHERE coalesce(j.amount, 0) <> coalesce(d.amount_msat, 0) OR coalesce(j.settlements, 0) <> coalesce(d.settlements, 0)`,
		format: "%v %v: the journal has %v msat in %v settlements, account_days %v msat in %v",
	},
	{
		name: "the schema's money rules are in place",
		query: `SELECT t.name FROM (SELECT 'postings_no_update' AS name UNION ALL SELECT 'postings_no_delete'
				UNION ALL SELECT 'entries_seal_requires_balance' UNION ALL SELECT 'entries_seal_balanced'
				UNION ALL SELECT 'calls_state_machine' UNION ALL SELECT 'payments_state_machine'
				UNION ALL SELECT 'postings_only_into_open_entries' UNION ALL SELECT 'results_immutable'
				UNION ALL SELECT 'results_no_delete' UNION ALL SELECT 'executions_match_call'
				UNION ALL SELECT 'executions_immutable' UNION ALL SELECT 'executions_no_delete'
				UNION ALL SELECT 'calls_executions_recorded' UNION ALL SELECT 'credit_moves_balance'
				UNION ALL SELECT 'credit_moves_immutable' UNION ALL SELECT 'credit_moves_no_delete'
				UNION ALL SELECT 'credit_moves_close_draw' UNION ALL SELECT 'credit_moves_topup'
				UNION ALL SELECT 'credit_accounts_no_delete' UNION ALL SELECT 'credit_topups_immutable'
				UNION ALL SELECT 'account_days_on_seal' UNION ALL SELECT 'executions_released'
				UNION ALL SELECT 'request_replies_prune_only') t
			WHERE NOT EXISTS (SELECT 1 FROM sqlite_master m WHERE m.type = 'trigger' AND m.name = t.name)`,
		format: "trigger %v is missing",
	},
}

// emptySHA256 is the SHA-256 of no bytes: the hash of a body of size 0.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// prunedRecordBroken is the SQL condition under which a pruned answer's
// record (column col, its col_sha256 and col_size, stored at stored) is
// not well formed: a hash that is not 64 lower-case hex digits, a size
// missing or negative, a body left, a size of 0 with another hash than
// the empty body's (or the empty body's hash with a size), or pruned
// before it was stored. ltrim reads the same on both engines.
func prunedRecordBroken(col, stored string) string {
	return strings.NewReplacer("COL", col, "STORED", stored, "EMPTY", emptySHA256).Replace(
		`COL_sha256 IS NULL OR length(COL_sha256) <> 64 OR ltrim(COL_sha256, '0123456789abcdef') <> ''
				OR COL_size IS NULL OR COL_size < 0 OR length(COL) <> 0
				OR (COL_size = 0) <> (COL_sha256 = 'EMPTY') OR pruned_at < STORED`)
}

// Verify checks every invariant of the ledger on one consistent snapshot
// and reports each violation, with SQLite's quick_check for the file
// itself. A non-nil error means the checks could not run; violations are
// in the report.
func (l *Ledger) Verify(ctx context.Context) (*Report, error) { return l.verify(ctx, "quick_check") }

// VerifyFull is Verify with SQLite's integrity_check in place of
// quick_check: it also checks every index against its table (and reads
// the whole file, so it takes longer on a large ledger).
func (l *Ledger) VerifyFull(ctx context.Context) (*Report, error) {
	return l.verify(ctx, "integrity_check")
}

// releaseInvariant checks every execution's release (schema 23 on)
// against the table of ways to pay, vend.Schemes: a scheme the table
// knows, and a bound one only to the call's own client (the SQL form of
// vend.Release.Check). Executions recorded before have no release.
func releaseInvariant() invariant {
	var known, bound []string
	for _, s := range vend.Schemes() {
		known = append(known, "'"+string(s.Name)+"'")
		if !s.Bearer {
			bound = append(bound, "'"+string(s.Name)+"'")
		}
	}
	return invariant{
		name: "every execution was released by a way to pay the table allows (bound ones only to the call's own client)",
		query: `SELECT e.call_id, e.seq, e.released_by, e.released_transport, e.released_client, c.transport, c.client
			FROM executions e JOIN calls c ON c.id = e.call_id
			WHERE e.released_by IS NOT NULL AND (e.released_by NOT IN (` + strings.Join(known, ", ") + `)
				OR e.released_by IN (` + strings.Join(bound, ", ") + `)
					AND (e.released_transport <> c.transport OR e.released_client <> c.client))`,
		format: "call %v execution %v was released by %v to %v %q; the call is %v %q's",
	}
}

func (l *Ledger) verify(ctx context.Context, pragma string) (*Report, error) {
	r := &Report{Path: l.path}
	err := l.read(ctx, func(tx *sql.Tx) error {
		if !l.pg { // PostgreSQL checks its own pages (and has no such pragma)
			if err := l.sqliteIntegrity(ctx, tx, pragma, r); err != nil {
				return err
			}
		}
		for _, inv := range slices.Concat(invariants, refundInvariants, payoutInvariants, lostInvariants, []invariant{releaseInvariant()}) {
			c, err := runInvariant(ctx, tx, inv)
			if err != nil {
				return fmt.Errorf("check %q: %w", inv.name, err)
			}
			r.Checks = append(r.Checks, c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	return r, nil
}

// sqliteIntegrity runs SQLite's quick_check or integrity_check (pragma)
// and adds its result to r.
func (l *Ledger) sqliteIntegrity(ctx context.Context, tx *sql.Tx, pragma string, r *Report) error {
	integrity := Check{Name: "SQLite integrity check (" + pragma + ")"}
	rows, err := tx.QueryContext(ctx, "PRAGMA "+pragma)
	if err != nil {
		return l.fileError(err)
	}
	defer rows.Close()
	for rows.Next() {
		var msg string
		if err := rows.Scan(&msg); err != nil {
			return err
		}
		if msg != "ok" {
			integrity.Count++
			if len(integrity.Problems) < maxExamples {
				integrity.Problems = append(integrity.Problems, msg)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return l.fileError(err)
	}
	r.Checks = append(r.Checks, integrity)
	return nil
}

func runInvariant(ctx context.Context, tx *sql.Tx, inv invariant) (Check, error) {
	c := Check{Name: inv.name}
	rows, err := tx.QueryContext(ctx, inv.query)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return c, err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		c.Count++
		if len(c.Problems) >= maxExamples {
			continue
		}
		if err := rows.Scan(ptrs...); err != nil {
			return c, err
		}
		args := make([]any, len(vals))
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			args[i] = v
		}
		c.Problems = append(c.Problems, fmt.Sprintf(inv.format, args...))
	}
	return c, rows.Err()
}
