package ledger

import (
	"context"
	"fmt"

	"github.com/capvend/capvend/vend"
)

// OpenCounts is what the ledger holds open at one moment, for an operator's
// gauges.
type OpenCounts struct {
	// OpenQuotes are the priced calls not yet paid nor ended (quoted or
	// awaiting payment).
	OpenQuotes int
	// LockedHolds are the hold invoices whose payment is locked in
	// (accepted) and neither settled nor canceled yet.
	LockedHolds int
	// RefundsOwed and OwedMsat are the refunds owed and their sum.
	RefundsOwed int
	OwedMsat    vend.Msat
}

// OpenCounts counts what is open now, in one read (a consistent snapshot;
// each count uses an index on state).
func (l *Ledger) OpenCounts(ctx context.Context) (OpenCounts, error) {
	var p OpenCounts
	err := l.rdb.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM calls WHERE state IN ('quoted', 'awaiting_payment')),
		(SELECT count(*) FROM payments WHERE state = 'accepted' AND kind = 'hold_invoice'),
		(SELECT count(*) FROM refunds WHERE state = 'owed'),
		(SELECT coalesce(sum(amount_msat), 0) FROM refunds WHERE state = 'owed')`).
		Scan(&p.OpenQuotes, &p.LockedHolds, &p.RefundsOwed, &p.OwedMsat)
	if err != nil {
		return OpenCounts{}, fmt.Errorf("ledger open counts: %w", l.fileError(err))
	}
	return p, nil
}
