package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/capvend/capvend/vend"
)

// ToolRevenue is the net income booked for one tool, prompt or resource
// (settlements less refunds).
type ToolRevenue struct {
	Account string
	Calls   int // settled payments booked to it
	Revenue vend.Msat
}

// DayRevenue is one tool's net income on one UTC day.
type DayRevenue struct {
	Day     string // YYYY-MM-DD, UTC
	Account string
	Revenue vend.Msat
}

// AccountBalance is the balance of one asset, liability or expense account.
type AccountBalance struct {
	Account string
	Balance vend.Msat
}

// Pending is money on its way: asked for but not in, or in but owed back.
type Pending struct {
	OpenPayments  int       // payment requests not paid yet and not expired
	OpenAmount    vend.Msat // their total
	HeldPayments  int       // hold invoices locked in, not settled yet
	HeldAmount    vend.Msat
	AwaitingCalls int // calls waiting for their payment
	// RefundsOwed is the sum of the refunds owed (capvend refunds lists
	// them); ledger verify checks it equals the balance of
	// liabilities:refunds.
	RefundsOwed      vend.Msat
	RefundsOwedCount int
}

// FreeUses counts the calls of one tool served free under its daily quota.
type FreeUses struct {
	Server, Tool string
	Uses         int // ever
	Today        int // on the current UTC day
}

// Balance is the summary `capvend ledger balance` prints.
type Balance struct {
	Tools    []ToolRevenue
	Days     []DayRevenue
	Accounts []AccountBalance
	Pending  Pending
	Free     []FreeUses // by server and tool; free calls move no money
}

// Balance computes revenue per tool and per day, account balances and
// pending amounts from one consistent snapshot. Open payments past their
// expiry (as of now) are not counted as pending.
func (l *Ledger) Balance(ctx context.Context) (*Balance, error) {
	b := &Balance{}
	nowT := l.now().UTC()
	now := ms(nowT)
	err := l.read(ctx, func(tx *sql.Tx) error {
		var err error
		b.Tools, err = queryRows(ctx, tx, scanToolRevenue, `SELECT a.name, -sum(p.amount_msat),
			count(DISTINCT CASE WHEN e.kind = 'settlement' THEN e.id END)
			FROM postings p JOIN accounts a ON a.id = p.account_id JOIN entries e ON e.id = p.entry_id
			WHERE `+incomeAccountsWhere+` AND e.sealed = 1 GROUP BY a.name ORDER BY a.name`)
		if err != nil {
			return err
		}
		b.Days, err = queryRows(ctx, tx, scanDayRevenue, `SELECT date(e.ts / 1000, 'unixepoch') AS day, a.name, -sum(p.amount_msat)
			FROM postings p JOIN accounts a ON a.id = p.account_id JOIN entries e ON e.id = p.entry_id
			WHERE `+incomeAccountsWhere+` AND e.sealed = 1 GROUP BY day, a.name ORDER BY day, a.name`)
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT a.name, sum(p.amount_msat)
			FROM postings p JOIN accounts a ON a.id = p.account_id JOIN entries e ON e.id = p.entry_id
			WHERE a.type IN ('assets', 'liabilities', 'expenses', 'equity') AND e.sealed = 1
			GROUP BY a.name ORDER BY a.name`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var a AccountBalance
			if err := rows.Scan(&a.Account, &a.Balance); err != nil {
				rows.Close()
				return err
			}
			b.Accounts = append(b.Accounts, a)
		}
		rows.Close()
		rows, err = tx.QueryContext(ctx, `SELECT server, tool, count(*), count(*) FILTER (WHERE day = ?)
			FROM free_uses GROUP BY server, tool ORDER BY server, tool`, nowT.Format(time.DateOnly))
		if err != nil {
			return err
		}
		for rows.Next() {
			var f FreeUses
			if err := rows.Scan(&f.Server, &f.Tool, &f.Uses, &f.Today); err != nil {
				rows.Close()
				return err
			}
			b.Free = append(b.Free, f)
		}
		rows.Close()
		if err := tx.QueryRowContext(ctx, `SELECT
			count(*) FILTER (WHERE state = 'open' AND expires_at > ?), coalesce(sum(amount_msat) FILTER (WHERE state = 'open' AND expires_at > ?), 0),
			count(*) FILTER (WHERE state = 'accepted'), coalesce(sum(amount_msat) FILTER (WHERE state = 'accepted'), 0)
			FROM payments`, now, now).Scan(&b.Pending.OpenPayments, &b.Pending.OpenAmount,
			&b.Pending.HeldPayments, &b.Pending.HeldAmount); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(amount_msat), 0) FROM refunds WHERE state = 'owed'`).
			Scan(&b.Pending.RefundsOwedCount, &b.Pending.RefundsOwed); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT count(*) FROM calls WHERE state = 'awaiting_payment'`).Scan(&b.Pending.AwaitingCalls)
	})
	if err != nil {
		return nil, fmt.Errorf("balance: %w", err)
	}
	return b, nil
}

// WriteTo writes the balance as aligned text tables, amounts in sats with
// millisatoshi precision.
func (b *Balance) WriteTo(w io.Writer) (int64, error) {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(&sb, "Revenue per tool, prompt and resource (net of refunds):")
	var total vend.Msat
	fmt.Fprintf(tw, "\tTOOL ACCOUNT\tPAID CALLS\tREVENUE (sat)\t\n")
	for _, t := range b.Tools {
		fmt.Fprintf(tw, "\t%s\t%d\t%s\t\n", t.Account, t.Calls, t.Revenue.AppendSats(nil))
		total += t.Revenue
	}
	fmt.Fprintf(tw, "\ttotal\t\t%s\t\n", total.AppendSats(nil))
	tw.Flush()
	fmt.Fprintln(&sb, "\nRevenue per day (UTC):")
	fmt.Fprintf(tw, "\tDAY\tTOOL ACCOUNT\tREVENUE (sat)\t\n")
	for _, d := range b.Days {
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t\n", d.Day, d.Account, d.Revenue.AppendSats(nil))
	}
	tw.Flush()
	fmt.Fprintln(&sb, "\nAccounts:")
	fmt.Fprintf(tw, "\tACCOUNT\tBALANCE (sat)\t\n")
	for _, a := range b.Accounts {
		fmt.Fprintf(tw, "\t%s\t%s\t\n", a.Account, a.Balance.AppendSats(nil))
	}
	tw.Flush()
	p := b.Pending
	fmt.Fprintln(&sb, "\nPending:")
	fmt.Fprintf(tw, "\topen payment requests\t%d\t%s sat\t\n", p.OpenPayments, p.OpenAmount.AppendSats(nil))
	fmt.Fprintf(tw, "\thold invoices locked in\t%d\t%s sat\t\n", p.HeldPayments, p.HeldAmount.AppendSats(nil))
	fmt.Fprintf(tw, "\tcalls awaiting payment\t%d\t\t\n", p.AwaitingCalls)
	fmt.Fprintf(tw, "\trefunds owed (capvend refunds)\t%d\t%s sat\t\n", p.RefundsOwedCount, p.RefundsOwed.AppendSats(nil))
	tw.Flush()
	if len(b.Free) > 0 {
		fmt.Fprintln(&sb, "\nFree calls (daily quotas):")
		fmt.Fprintf(tw, "\tSERVER/TOOL\tTODAY (UTC)\tALL\t\n")
		for _, f := range b.Free {
			fmt.Fprintf(tw, "\t%s/%s\t%d\t%d\t\n", f.Server, f.Tool, f.Today, f.Uses)
		}
		tw.Flush()
	}
	n, err := io.WriteString(w, sb.String())
	return int64(n), err
}

// LNDCursor returns where the invoice subscription of node resumes: the
// highest add and settle indexes recorded (zero for a node never seen).
func (l *Ledger) LNDCursor(ctx context.Context, node string) (addIndex, settleIndex uint64, err error) {
	err = l.rdb.QueryRowContext(ctx, "SELECT add_index, settle_index FROM lnd_cursors WHERE node = ?", node).
		Scan(&addIndex, &settleIndex)
	if err == sql.ErrNoRows {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("lnd cursor %s: %w", node, err)
	}
	return addIndex, settleIndex, nil
}

// SaveLNDCursor records the indexes seen for node. Indexes only move
// forward: a smaller value than the one stored is ignored, so replays of old
// subscription messages cannot rewind the cursor.
func (l *Ledger) SaveLNDCursor(ctx context.Context, node string, addIndex, settleIndex uint64) error {
	return l.write(ctx, func(tx *wtx, now time.Time) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO lnd_cursors (node, add_index, settle_index, updated_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (node) DO UPDATE SET add_index = max(lnd_cursors.add_index, excluded.add_index),
			settle_index = max(lnd_cursors.settle_index, excluded.settle_index), updated_at = excluded.updated_at`,
			node, addIndex, settleIndex, ms(now))
		return err
	})
}

// queryRows runs q in tx and returns one T per row, each filled by scan.
func queryRows[T any](ctx context.Context, tx *sql.Tx, scan func(*sql.Rows, *T) error, q string, args ...any) ([]T, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := scan(rows, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func scanToolRevenue(r *sql.Rows, t *ToolRevenue) error {
	return r.Scan(&t.Account, &t.Revenue, &t.Calls)
}

func scanDayRevenue(r *sql.Rows, d *DayRevenue) error { return r.Scan(&d.Day, &d.Account, &d.Revenue) }

// AccountBalances returns the balance of every account whose name starts
// with prefix, by name: what the operator's wallet commands compare (the
// ecash per mint, assets:cashu:).
func (l *Ledger) AccountBalances(ctx context.Context, prefix string) (map[string]vend.Msat, error) {
	b, err := l.Balance(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]vend.Msat{}
	for _, a := range b.Accounts {
		if strings.HasPrefix(a.Account, prefix) {
			out[a.Account] += a.Balance
		}
	}
	return out, nil
}
