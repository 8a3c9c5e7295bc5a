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

// LostPayment is vend.LostPayment.
type LostPayment = vend.LostPayment

// BookLostPayment books p once, in one transaction: its amount moves from
// the asset account it landed in (assets:lightning:lnd,
// assets:cashu:<mint>) to AccountUnattributed, recorded in lost_payments.
// One booked already, or a ref a payment names (recorded meanwhile: the
// money is that payment's), is vend.ErrAlreadySettled and writes nothing.
func (l *Ledger) BookLostPayment(ctx context.Context, p LostPayment) error {
	return l.write(ctx, func(tx *wtx, now time.Time) error { return bookLost(ctx, tx, p, now) })
}

func bookLost(ctx context.Context, tx *wtx, p LostPayment, now time.Time) error {
	if p.Amount <= 0 || p.Ref == "" {
		return fmt.Errorf("book lost payment %q: amount must be positive", p.Ref)
	}
	account := AccountLND
	switch p.Backend {
	case vend.BackendLND:
		p.MintURL = ""
	case vend.BackendCashu:
		if p.MintURL == "" {
			return fmt.Errorf("book lost payment %q: a Cashu payment names its mint", p.Ref)
		}
		account = CashuAccount(p.MintURL)
	default:
		return fmt.Errorf("book lost payment %q: backend %q", p.Ref, p.Backend)
	}
	var n int
	err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM lost_payments WHERE ref = ?) + (SELECT count(*) FROM payments WHERE ref = ?)`,
		p.Ref, p.Ref).Scan(&n)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("book lost payment %s: %w", p.Ref, vend.ErrAlreadySettled)
	}
	what := "invoice " + p.Ref + " settled by LND"
	if p.Backend == vend.BackendCashu {
		what = "mint quote " + p.Ref + " paid at " + p.MintURL
	}
	entry, err := postEntry(ctx, tx, Entry{Kind: "adjustment", Description: what + ", its quote lost with the ledger; " + p.Note,
		Postings: []Posting{{Account: account, Amount: p.Amount}, {Account: AccountUnattributed, Amount: -p.Amount}}}, now)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO lost_payments (ref, backend, mint_url, account, amount_msat, entry_id, found_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		p.Ref, string(p.Backend), p.MintURL, account, p.Amount, entry, ms(now))
	return err
}

// LostRefs implements reconcile.Store: which of refs are booked as lost
// payments.
func (l *Ledger) LostRefs(ctx context.Context, refs []string) (map[string]bool, error) {
	out := map[string]bool{}
	err := l.read(ctx, func(tx *sql.Tx) error {
		return inChunks(refs, func(in string, args []any) error {
			rows, err := tx.QueryContext(ctx, "SELECT ref FROM lost_payments WHERE ref "+in, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var ref string
				if err := rows.Scan(&ref); err != nil {
					return err
				}
				out[ref] = true
			}
			return rows.Err()
		})
	})
	if err != nil {
		return nil, fmt.Errorf("lost payments: %w", err)
	}
	return out, nil
}

// RepairLost implements reconcile.Store: s, a settlement of an invoice
// that carries this ledger's mark and that no payment names, is booked
// (BookLostPayment) with d, in one transaction.
func (l *Ledger) RepairLost(ctx context.Context, d reconcile.Difference, s vend.Settlement) error {
	if !strings.HasPrefix(d.Repair, reconcile.RepairPrefix) {
		return fmt.Errorf("repair lost payment %s: the repair must say it is a reconcile repair", s.Ref)
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		if err := bookLost(ctx, tx, LostPayment{Backend: d.Backend, Ref: s.Ref, Amount: s.Amount, Note: d.Repair}, now); err != nil {
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
// by its own entry, which moves exactly its amount from its backend's
// asset account to AccountUnattributed, and no payment names it.
var lostInvariants = []invariant{{
	name: "every lost payment (an invoice or mint quote of capvend's paid after the restored point) is booked once to " + AccountUnattributed + " and names no payment",
	query: `SELECT lp.ref, lp.amount_msat FROM lost_payments lp
		WHERE EXISTS (SELECT 1 FROM payments p WHERE p.ref = lp.ref)
			OR NOT EXISTS (SELECT 1 FROM entries e WHERE e.id = lp.entry_id AND e.kind = 'adjustment' AND e.payment_id IS NULL)
			OR (SELECT count(*) FROM postings po WHERE po.entry_id = lp.entry_id) <> 2
			OR NOT EXISTS (SELECT 1 FROM postings po JOIN accounts a ON a.id = po.account_id
				WHERE po.entry_id = lp.entry_id AND a.name = '` + AccountUnattributed + `' AND po.amount_msat = -lp.amount_msat)
			OR NOT EXISTS (SELECT 1 FROM postings po JOIN accounts a ON a.id = po.account_id
				WHERE po.entry_id = lp.entry_id AND a.name = lp.account AND po.amount_msat = lp.amount_msat)
			OR (lp.backend = 'lnd') <> (lp.account = '` + AccountLND + `')
			OR (lp.backend = 'cashu') <> (lp.account LIKE 'assets:cashu:%')`,
	format: "lost payment %v of %v msat is not booked as its own entry to " + AccountUnattributed + ", or a payment names it",
}}
