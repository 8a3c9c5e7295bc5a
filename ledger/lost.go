package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// AccountUnattributed holds money received for a call the ledger lost:
// an invoice capvend made and LND settled whose quote is not in a ledger
// restored from its replica (migrations/0029_lost_payments.sql). It is
// owed until the operator returns it to its payer or books it as income.
const AccountUnattributed = reconcile.UnattributedAccount

// InvoiceMark returns the ledger's identity: 32 random bytes made once,
// with the schema, and carried by every backup and replica. billing/lnd
// keys the mark of its invoice preimages with it, so that a restored
// ledger recognizes the invoices it made and lost.
func (l *Ledger) InvoiceMark(ctx context.Context) ([]byte, error) {
	var mark []byte
	err := l.read(ctx, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, "SELECT mark FROM ledger_identity WHERE id = 1").Scan(&mark)
	})
	if err != nil {
		return nil, fmt.Errorf("ledger identity: %w", err)
	}
	return mark, nil
}

// RepairLost implements reconcile.Store: s, a settlement of an invoice
// that carries this ledger's mark and that no payment names, is booked
// once, with d, in one transaction: its amount moves to
// AccountUnattributed from the node's asset account, recorded in
// lost_payments. One booked already (an earlier run) is
// vend.ErrAlreadySettled and writes nothing; so is a ref a payment names
// (recorded meanwhile: the settlement is then that payment's).
func (l *Ledger) RepairLost(ctx context.Context, d reconcile.Difference, s vend.Settlement) error {
	if !strings.HasPrefix(d.Repair, reconcile.RepairPrefix) {
		return fmt.Errorf("repair lost payment %s: the repair must say it is a reconcile repair", s.Ref)
	}
	if s.Amount <= 0 || s.Ref == "" {
		return fmt.Errorf("repair lost payment %q: amount must be positive", s.Ref)
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var n int
		err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM lost_payments WHERE ref = ?) + (SELECT count(*) FROM payments WHERE ref = ?)`,
			s.Ref, s.Ref).Scan(&n)
		if err != nil {
			return err
		}
		if n > 0 {
			return vend.ErrAlreadySettled
		}
		desc := fmt.Sprintf("invoice %s settled by LND, its quote lost with the ledger; %s", s.Ref, d.Repair)
		entry, err := postEntry(ctx, tx, Entry{Kind: "adjustment", Description: desc, Postings: []Posting{
			{Account: AccountLND, Amount: s.Amount},
			{Account: AccountUnattributed, Amount: -s.Amount},
		}}, now)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lost_payments (ref, backend, amount_msat, entry_id, found_at) VALUES (?, ?, ?, ?, ?)`,
			s.Ref, string(vend.BackendLND), s.Amount, entry, ms(now)); err != nil {
			return err
		}
		return insertDifference(ctx, tx, &d, now)
	})
	if err != nil {
		return fmt.Errorf("repair lost payment: %w", err)
	}
	return nil
}

// lostInvariants are verify's checks of the lost payments: each is booked
// by its own entry, which moves exactly its amount from the node's asset
// account to AccountUnattributed, and no payment names its invoice.
var lostInvariants = []invariant{{
	name: "every lost payment (an invoice of capvend's settled after the restored point) is booked once to " + AccountUnattributed + " and names no payment",
	query: `SELECT lp.ref, lp.amount_msat FROM lost_payments lp
		WHERE EXISTS (SELECT 1 FROM payments p WHERE p.ref = lp.ref)
			OR NOT EXISTS (SELECT 1 FROM entries e WHERE e.id = lp.entry_id AND e.kind = 'adjustment' AND e.payment_id IS NULL)
			OR (SELECT count(*) FROM postings po WHERE po.entry_id = lp.entry_id) <> 2
			OR NOT EXISTS (SELECT 1 FROM postings po JOIN accounts a ON a.id = po.account_id
				WHERE po.entry_id = lp.entry_id AND a.name = '` + AccountUnattributed + `' AND po.amount_msat = -lp.amount_msat)
			OR NOT EXISTS (SELECT 1 FROM postings po JOIN accounts a ON a.id = po.account_id
				WHERE po.entry_id = lp.entry_id AND a.name = '` + AccountLND + `' AND po.amount_msat = lp.amount_msat)`,
	format: "lost payment %v of %v msat is not booked as its own entry to " + AccountUnattributed + ", or a payment names it",
}}
