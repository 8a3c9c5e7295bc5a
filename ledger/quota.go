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
// that finds a replay (the same request id with the same tool and
// argument hash; anything else under that id is vend.ErrRequestReused),
// or inserts a use only while the client's count for the tool and UTC day
// is below the quota (RowsAffected says which).
func (l *Ledger) ClaimFreeUse(ctx context.Context, u vend.FreeUse) (bool, error) {
	switch {
	case u.Transport == "" || u.Client == "" || u.RequestID == "" || u.Server == "" || u.Tool == "":
		return false, errors.New("claim free use: transport, client, request id, server and tool are required")
	case len(u.ArgsHash) != 64:
		return false, errors.New("claim free use: args hash must be a hex SHA-256")
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
		var argsHash sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT server, tool, args_hash FROM free_uses WHERE transport = ? AND client = ? AND request_id = ?`,
			u.Transport, u.Client, u.RequestID).Scan(&server, &tool, &argsHash)
		switch {
		case err == nil:
			// A replay only if it is the same request: same tool and
			// arguments (a use recorded without a hash matches nothing).
			if server != u.Server || tool != u.Tool || !argsHash.Valid || argsHash.String != u.ArgsHash {
				return fmt.Errorf("%w: request %q of %s was a free call with other parameters", vend.ErrRequestReused, u.RequestID, u.Client)
			}
			free = true
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		day := now.Format(time.DateOnly)
		// The client's count, and with PerDayTotal everyone's: both in
		// this one immediate transaction, so concurrent claims never
		// exceed either.
		res, err := tx.ExecContext(ctx, `INSERT INTO free_uses (transport, client, request_id, server, tool, day, created_at, args_hash)
			SELECT ?, ?, ?, ?, ?, ?, ?, ?
			WHERE (SELECT count(*) FROM free_uses WHERE transport = ? AND client = ? AND server = ? AND tool = ? AND day = ?) < ?
			AND (? <= 0 OR (SELECT count(*) FROM free_uses WHERE server = ? AND tool = ? AND day = ?) < ?)`,
			u.Transport, u.Client, u.RequestID, u.Server, u.Tool, day, ms(now), u.ArgsHash,
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
