package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// Refunds. A call's refund entry (its income moved to liabilities:refunds)
// is written together with a row of the refunds table: what is owed, to
// whom (the call's transport and client), for which call and payment, and
// the client's refund invoice if it gave one. PayRefund books its payout
// once. The accounts:
//
//	refund (owed):   Dr income:<kind>:<server>:<item>   price
//	                 Dr income:overpayments              what was paid beyond it
//	                 Cr liabilities:refunds              what the payment brought in
//	payout:          Dr liabilities:refunds              the refund
//	                 Dr expenses:fees:cashu:<mint>       what paying it cost
//	                 Dr expenses:refunds:rounding        a token rounded up to a whole sat
//	                 Cr income:overpayments              a bolt11 for less than owed: the rest
//	                 Cr assets:cashu:<mint>              the ecash that left the wallet
//
// A refund paid from an NWC wallet books its payout with that wallet's
// accounts (PayoutAccounts): expenses:fees:<connection> and
// assets:lightning:<connection>.

// Accounts of refund payouts.
const (
	// AccountRefundRounding is what a Cashu refund paid beyond the owed
	// amount, rounded up to a whole sat.
	AccountRefundRounding = "expenses:refunds:rounding"
)

var (
	_ vend.RefundLedger = (*Ledger)(nil)
)

const refundColumns = `r.id, r.call_id, r.payment_id, r.transport, r.client, r.amount_msat, p.backend, p.kind,
	p.mint_url, r.invoice, r.reason, r.state, r.created_at, r.paid_at, coalesce(r.method, ''),
	coalesce(r.paid_msat, 0), coalesce(r.fee_msat, 0), coalesce(r.token, ''), coalesce(r.payout_ref, ''),
	coalesce(r.mint_url, '')`

const refundFrom = ` FROM refunds r JOIN payments p ON p.id = r.payment_id`

func scanRefund(row rowScanner) (vend.Refund, error) {
	var r vend.Refund
	var backend, kind, state, method string
	var created int64
	var paid sql.NullInt64
	err := row.Scan(&r.ID, &r.CallID, &r.PaymentID, &r.Transport, &r.Client, &r.Amount, &backend, &kind,
		&r.MintURL, &r.Invoice, &r.Reason, &state, &created, &paid, &method, &r.Paid, &r.Fee, &r.Token, &r.Ref, &r.PaidFrom)
	if errors.Is(err, sql.ErrNoRows) {
		return r, vend.ErrNotFound
	}
	r.Backend, r.Kind, r.State, r.Method = vend.Backend(backend), vend.PaymentKind(kind), vend.RefundState(state), vend.RefundMethod(method)
	r.CreatedAt = fromMS(created)
	if paid.Valid {
		r.PaidAt = fromMS(paid.Int64)
	}
	return r, err
}

// postRefund moves a settled call's income, and what its payment brought
// in beyond the price, to liabilities:refunds, and records the refund owed
// to the call's client: one entry, one refunds row, in tx.
func postRefund(ctx context.Context, tx *wtx, p vend.Payment, c vend.Call, reason string, now time.Time) error {
	var settled vend.Msat
	var invoice string
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(p.settled_msat, 0), c.refund_invoice FROM payments p
		JOIN calls c ON c.id = p.call_id WHERE p.id = ?`, p.ID).Scan(&settled, &invoice); err != nil {
		return err
	}
	if settled < c.Price {
		return fmt.Errorf("refund of call %d: payment %s settled %d msat, less than the price %d msat", c.ID, p.Ref, settled, c.Price)
	}
	desc := fmt.Sprintf("%s%s/%s call %d refunded", kindPrefix(c.Kind), c.Server, c.Name, c.ID)
	if reason != "" {
		desc += ": " + reason
	}
	e := Entry{
		Kind:        "refund",
		Description: desc,
		CallID:      c.ID,
		PaymentID:   p.ID,
		Postings:    []Posting{{Account: ItemIncomeAccount(c.Kind, c.Server, c.Name), Amount: c.Price}},
	}
	if over := settled - c.Price; over > 0 {
		e.Postings = append(e.Postings, Posting{Account: AccountOverpayment, Amount: over})
	}
	e.Postings = append(e.Postings, Posting{Account: AccountRefunds, Amount: -settled})
	if err := post(ctx, tx, e, now); err != nil {
		return err
	}
	tx.changed(vend.Change{What: vend.ChangeRefund, Call: c.ID, Backend: p.Backend, Payment: p.Kind, Amount: settled})
	_, err := tx.ExecContext(ctx, `INSERT INTO refunds (call_id, payment_id, transport, client, amount_msat, invoice,
		reason, state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'owed', ?)`,
		c.ID, p.ID, c.Transport, c.Client, settled, invoice, reason, ms(now))
	if isUnique(err) {
		return fmt.Errorf("refund of call %d: refunded before", c.ID)
	}
	return err
}

// CallRefund implements vend.RefundLedger.
func (l *Ledger) CallRefund(ctx context.Context, id vend.CallID) (vend.Refund, error) {
	r, err := scanRefund(l.rdb.QueryRowContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.call_id = ?", id))
	if err != nil {
		return r, fmt.Errorf("refund of call %d: %w", id, err)
	}
	return r, nil
}

// RefundByID returns a refund by id, or vend.ErrNotFound.
func (l *Ledger) RefundByID(ctx context.Context, id vend.RefundID) (vend.Refund, error) {
	r, err := scanRefund(l.rdb.QueryRowContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.id = ?", id))
	if err != nil {
		return r, fmt.Errorf("refund %d: %w", id, err)
	}
	return r, nil
}

// Refunds lists the refunds owed, oldest first; all refunds (paid ones
// too) with all.
func (l *Ledger) Refunds(ctx context.Context, all bool) ([]vend.Refund, error) {
	q := "SELECT " + refundColumns + refundFrom
	if !all {
		q += " WHERE r.state = 'owed'"
	}
	rows, err := l.rdb.QueryContext(ctx, q+" ORDER BY r.id")
	if err != nil {
		return nil, fmt.Errorf("refunds: %w", err)
	}
	defer rows.Close()
	var out []vend.Refund
	for rows.Next() {
		r, err := scanRefund(rows)
		if err != nil {
			return nil, fmt.Errorf("refunds: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// PayRefund implements vend.RefundLedger for a payout made already: the
// payout is reserved and booked in one transaction (see ReservePayout and
// BookPayout; a payer that has not paid yet reserves first). The payout
// entry (kind refund, no call: the call's own refund entry is the one that
// owes it) debits liabilities:refunds by the owed amount and credits the
// mint's ecash by what left the wallet (p.Paid + p.Fee); p.Fee is an
// expense, a token rounded up to a whole sat the expense
// AccountRefundRounding, a bolt11 for less than owed leaves the rest in
// income:overpayments. It refuses a payout above the owed amount (a
// token: above it rounded up to a sat), and one of a refund another payout
// is paying (vend.ErrPayoutInFlight).
func (l *Ledger) PayRefund(ctx context.Context, id vend.RefundID, p vend.RefundPayout) (vend.Refund, error) {
	switch {
	case p.Method != vend.RefundCashu && p.Method != vend.RefundBolt11:
		return vend.Refund{}, fmt.Errorf("pay refund %d: unknown method %q", id, p.Method)
	case p.Paid <= 0 || p.Fee < 0 || (p.MintURL == "") == (p.NWC == ""):
		return vend.Refund{}, fmt.Errorf("pay refund %d: a positive amount, a fee >= 0 and the paying mint (or NWC wallet) are required", id)
	case p.Method == vend.RefundCashu && p.Token == "":
		return vend.Refund{}, fmt.Errorf("pay refund %d: a Cashu payout needs its token", id)
	}
	var r vend.Refund
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		np := vend.NewPayout{Kind: vend.PayoutRefund, Refund: id, Method: p.Method, MintURL: p.MintURL, NWC: p.NWC, Amount: p.Paid}
		if p.Method == vend.RefundBolt11 {
			np.Quote = p.Ref
		}
		po, err := reservePayout(ctx, tx, np, now)
		if err != nil {
			return err
		}
		po.Token = p.Token
		if p.Token != "" {
			if _, err := tx.ExecContext(ctx, "UPDATE payouts SET token = ? WHERE id = ?", p.Token, po.ID); err != nil {
				return err
			}
		}
		if _, err := bookPayout(ctx, tx, po, p.Fee, now); err != nil {
			return err
		}
		r, err = scanRefund(tx.QueryRowContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.id = ?", id))
		return err
	})
	if err != nil {
		return vend.Refund{}, fmt.Errorf("pay refund: %w", err)
	}
	return r, nil
}

// payRefundEntry books the payout p of owed refund id in tx: its entry
// (see PayRefund) and the refund paid; it returns the entry's id. The
// schema refuses it unless a payout of the refund is reserved for it.
func payRefundEntry(ctx context.Context, tx *wtx, id vend.RefundID, p vend.RefundPayout, now time.Time) (int64, error) {
	r, err := scanRefund(tx.QueryRowContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.id = ?", id))
	if err != nil {
		return 0, fmt.Errorf("refund %d: %w", id, err)
	}
	if r.State != vend.RefundOwed {
		return 0, fmt.Errorf("%w: refund %d (call %d) was paid %s", vend.ErrRefundPaid, r.ID, r.CallID, r.PaidAt.Format(time.RFC3339))
	}
	limit := r.Amount
	if p.Method == vend.RefundCashu {
		limit = vend.Msat(r.Amount.SatsCeil() * vend.MsatPerSat)
	}
	if p.Paid > limit {
		return 0, fmt.Errorf("pay refund %d: %s is more than the %s owed", r.ID, p.Paid, r.Amount)
	}
	asset, fee := PayoutAccounts(vend.NewPayout{MintURL: p.MintURL, NWC: p.NWC})
	by := string(p.Method)
	if p.NWC != "" {
		by += " from " + string(p.NWC)
	}
	e := Entry{
		Kind:        "refund",
		Description: fmt.Sprintf("refund %d of call %d paid out by %s to %s %s", r.ID, r.CallID, by, r.Transport, r.Client),
		Postings: []Posting{
			{Account: AccountRefunds, Amount: r.Amount},
			{Account: asset, Amount: -(p.Paid + p.Fee)},
		},
	}
	if p.Fee > 0 {
		e.Postings = append(e.Postings, Posting{Account: fee, Amount: p.Fee})
	}
	switch d := p.Paid - r.Amount; {
	case d > 0:
		e.Postings = append(e.Postings, Posting{Account: AccountRefundRounding, Amount: d})
	case d < 0:
		e.Postings = append(e.Postings, Posting{Account: AccountOverpayment, Amount: d})
	}
	entry, err := postEntry(ctx, tx, e, now)
	if err != nil {
		return 0, err
	}
	// The state condition is the exactly-once claim; the schema's
	// triggers refuse a second payout, or one not reserved, whatever the
	// Go code does.
	res, err := tx.ExecContext(ctx, `UPDATE refunds SET state = 'paid', paid_at = ?, method = ?, paid_msat = ?,
		fee_msat = ?, mint_url = ?, token = nullif(?, ''), payout_ref = nullif(?, ''), entry_id = ?
		WHERE id = ? AND state = 'owed'`,
		ms(now), string(p.Method), p.Paid, p.Fee, vend.NewPayout{MintURL: p.MintURL, NWC: p.NWC}.From(), p.Token, p.Ref, entry, r.ID)
	if err != nil {
		if isConstraint(err) {
			return 0, fmt.Errorf("%w: refund %d: %v", vend.ErrRefundPaid, r.ID, err)
		}
		return 0, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return 0, fmt.Errorf("%w: refund %d", vend.ErrRefundPaid, r.ID)
	}
	return entry, nil
}

// refundInvariants are ledger verify's checks of refunds.
var refundInvariants = []invariant{
	{
		name: "refunds owed equal the balance of liabilities:refunds",
		query: `SELECT owed, -balance FROM (SELECT
				(SELECT coalesce(sum(amount_msat), 0) FROM refunds WHERE state = 'owed') AS owed,
				(SELECT coalesce(sum(p.amount_msat), 0) FROM postings p JOIN accounts a ON a.id = p.account_id
					JOIN entries e ON e.id = p.entry_id WHERE a.name = 'liabilities:refunds' AND e.sealed = 1) AS balance) AS s
			WHERE owed <> -balance`,
		format: "refunds owed sum to %v msat but liabilities:refunds holds %v msat",
	},
	{
		name: "each refund entry of a call has one refund record, and each record its entry",
		query: `SELECT e.call_id, 'a refund entry', 'no refund record' FROM entries e
				WHERE e.kind = 'refund' AND e.sealed = 1 AND e.call_id IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.call_id = e.call_id AND r.payment_id IS NOT DISTINCT FROM e.payment_id)
			UNION ALL
			SELECT r.call_id, 'a refund record', 'no refund entry' FROM refunds r
				WHERE NOT EXISTS (SELECT 1 FROM entries e WHERE e.kind = 'refund' AND e.sealed = 1
					AND e.call_id = r.call_id AND e.payment_id = r.payment_id)`,
		format: "call %v has %v but %v",
	},
	{
		name: "each paid refund has exactly one payout entry",
		query: `SELECT 'refund ' || r.id, 'is ' || r.state || ' with payout entry ' || coalesce(CAST(r.entry_id AS TEXT), 'none') FROM refunds r
				WHERE (r.state = 'paid') <> (r.entry_id IS NOT NULL)
				OR (r.entry_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM entries e JOIN postings p ON p.entry_id = e.id
					JOIN accounts a ON a.id = p.account_id WHERE e.id = r.entry_id AND e.sealed = 1 AND e.kind = 'refund'
					AND e.call_id IS NULL AND a.name = 'liabilities:refunds' AND p.amount_msat = r.amount_msat))
			UNION ALL
			SELECT 'entry ' || e.id, 'is a payout of no refund' FROM entries e WHERE e.kind = 'refund' AND e.sealed = 1
				AND e.call_id IS NULL AND (SELECT count(*) FROM refunds r WHERE r.entry_id = e.id) <> 1`,
		format: "%v %v",
	},
	{
		name: "the schema's refund rules are in place",
		query: `SELECT t.name FROM (SELECT 'refunds_paid_once' AS name UNION ALL SELECT 'refunds_payout_entry'
				UNION ALL SELECT 'refunds_need_refund_entry' UNION ALL SELECT 'refunds_no_delete'
				UNION ALL SELECT 'cashu_proofs_state_machine') t
			WHERE NOT EXISTS (SELECT 1 FROM sqlite_master m WHERE m.type = 'trigger' AND m.name = t.name)`,
		format: "trigger %v is missing",
	},
}

// RefundsOwed is the number and sum of the refunds owed.
func (l *Ledger) RefundsOwed(ctx context.Context) (n int, sum vend.Msat, err error) {
	err = l.rdb.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(amount_msat), 0) FROM refunds WHERE state = 'owed'`).Scan(&n, &sum)
	if err != nil {
		return 0, 0, fmt.Errorf("refunds owed: %w", err)
	}
	return n, sum, nil
}
