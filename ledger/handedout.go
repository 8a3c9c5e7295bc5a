package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// RecordChange records the proofs (their secret hash, mint and amount) of the change handed out for the token
// payment ref, in one transaction, before the change is handed over: a
// wallet rebuilt from its seed sets them aside (see schema 27). A proof
// recorded before is left as it is.
func (l *Ledger) RecordChange(ctx context.Context, ref string, proofs []vend.Proof) error {
	if len(proofs) == 0 {
		return nil
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		for _, p := range proofs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO cashu_handed_out (secret_hash, mint_url, amount_sat, kind, ref, created_at)
				VALUES (?, ?, ?, 'change', ?, ?) ON CONFLICT DO NOTHING`, p.SecretHash, p.MintURL, p.AmountSat, ref, ms(now)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record change of %s: %w", ref, l.fileError(err))
	}
	return nil
}

// HandedOutEcash returns what capvend's wallet handed to clients: the
// secret hashes of recorded change, and the tokens of paid refunds and of
// payouts (reserved or booked: a reserved one may have left). Read only.
// The tokens are bearer secrets: never log them.
func (l *Ledger) HandedOutEcash(ctx context.Context) (change map[string]bool, tokens []string, err error) {
	change = map[string]bool{}
	rows, err := l.reader(ctx).QueryContext(ctx, "SELECT secret_hash FROM cashu_handed_out")
	if err != nil {
		return nil, nil, fmt.Errorf("handed out: %w", l.fileError(err))
	}
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			rows.Close()
			return nil, nil, err
		}
		change[h] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows, err = l.reader(ctx).QueryContext(ctx, `SELECT token FROM refunds WHERE token IS NOT NULL
		UNION ALL SELECT token FROM payouts WHERE token IS NOT NULL AND state <> 'released'`)
	if err != nil {
		return nil, nil, fmt.Errorf("handed out: %w", l.fileError(err))
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, nil, err
		}
		tokens = append(tokens, t)
	}
	return change, tokens, rows.Err()
}
