package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// ClaimFreeUse implements vend.Ledger: one BEGIN IMMEDIATE transaction
// that finds a replay, or inserts a use only while the client's count for
// the tool and UTC day is below the quota (RowsAffected says which).
func (l *Ledger) ClaimFreeUse(ctx context.Context, u vend.FreeUse) (bool, error) {
	switch {
	case u.Transport == "" || u.Client == "" || u.RequestID == "" || u.Server == "" || u.Tool == "":
		return false, errors.New("claim free use: transport, client, request id, server and tool are required")
	case u.PerDay <= 0:
		return false, fmt.Errorf("claim free use: the quota must be positive, got %d", u.PerDay)
	}
	var free bool
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		// A request recorded as a priced call stays priced (its
		// payment may be under way), even on a new day.
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM calls WHERE transport = ? AND client = ? AND request_id = ?`,
			u.Transport, u.Client, u.RequestID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		var server, tool string
		err := tx.QueryRowContext(ctx, `SELECT server, tool FROM free_uses WHERE transport = ? AND client = ? AND request_id = ?`,
			u.Transport, u.Client, u.RequestID).Scan(&server, &tool)
		switch {
		case err == nil: // a replay: free again if it is the same tool
			free = server == u.Server && tool == u.Tool
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		day := now.Format(time.DateOnly)
		// The client's count, and with PerDayTotal everyone's: both in
		// this one immediate transaction, so concurrent claims never
		// exceed either.
		res, err := tx.ExecContext(ctx, `INSERT INTO free_uses (transport, client, request_id, server, tool, day, created_at)
			SELECT ?, ?, ?, ?, ?, ?, ?
			WHERE (SELECT count(*) FROM free_uses WHERE transport = ? AND client = ? AND server = ? AND tool = ? AND day = ?) < ?
			AND (? <= 0 OR (SELECT count(*) FROM free_uses WHERE server = ? AND tool = ? AND day = ?) < ?)`,
			u.Transport, u.Client, u.RequestID, u.Server, u.Tool, day, ms(now),
			u.Transport, u.Client, u.Server, u.Tool, day, u.PerDay,
			u.PerDayTotal, u.Server, u.Tool, day, u.PerDayTotal)
		if err != nil {
			return err
		}
		rows, err := res.RowsAffected()
		free = rows == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("claim free use: %w", err)
	}
	return free, nil
}
