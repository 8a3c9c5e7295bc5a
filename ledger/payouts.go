package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

// Payouts (schema 22): money leaving the Cashu wallet, or (schema 28) the
// wallet of an NWC connection, is reserved before it leaves, then booked
// or released, each in one transaction (see vend.Payout and
// migrations/0022_payouts.sql, 0028_nwc_payouts.sql). The accounts:
//
//	credit, reserve:  Dr liabilities:credit:<account>   amount
//	                  Cr liabilities:credit_reserved    amount
//	credit, book:     Dr liabilities:credit_reserved    amount
//	                  Dr expenses:fees:cashu:<mint>      fee
//	                  Cr assets:cashu:<mint>             amount + fee
//	credit, release:  Dr liabilities:credit_reserved    amount
//	                  Cr liabilities:credit:<account>   amount
//	refund, book:     the refund's payout entry (refunds.go)
//	withdrawal, book: Dr equity:withdrawals              amount
//	                  Dr expenses:fees:cashu:<mint>      fee
//	                  Cr assets:cashu:<mint>             amount + fee
//
// A refund's or a withdrawal's reservation posts nothing: a refund owed is
// in liabilities:refunds already, owed to its client, and a withdrawal is
// the operator's own money until it leaves. A payout from an NWC wallet
// books the same entries with that wallet's accounts in place of the
// mint's: assets:lightning:<connection> (where its income landed) and
// expenses:fees:<connection> (PayoutAccounts). Its payouts.mint_url names
// the connection.

// Accounts of payouts.
const (
	// AccountCreditReserved holds the credit reserved by payouts in
	// flight: still owed to the clients, no longer theirs to spend.
	AccountCreditReserved = "liabilities:credit_reserved"
	// AccountWithdrawals is the operator's ecash melted to an invoice.
	AccountWithdrawals = "equity:withdrawals"
)

// ErrCreditShort: a credit payout asks more than the account's balance
// (or there is not a whole sat left to pay); nothing was reserved.
var ErrCreditShort = errors.New("the credit balance does not cover the payout")

const payoutColumns = `id, kind, coalesce(account_id, ''), coalesce(refund_id, 0), method, mint_url, wallet, amount_msat,
	invoice, coalesce(quote, ''), fee_reserve_msat, coalesce(token, ''), coalesce(fee_msat, 0), state, reason,
	created_at, coalesce(ended_at, 0)`

func scanPayout(row rowScanner) (vend.Payout, error) {
	var p vend.Payout
	var kind, method, state, from string
	var created, ended int64
	err := row.Scan(&p.ID, &kind, &p.Account, &p.Refund, &method, &from, &p.Wallet, &p.Amount, &p.Invoice, &p.Quote,
		&p.FeeReserve, &p.Token, &p.Fee, &state, &p.Reason, &created, &ended)
	if errors.Is(err, sql.ErrNoRows) {
		return p, vend.ErrNotFound
	}
	if vend.Backend(from).IsNWC() {
		p.NWC = vend.Backend(from)
	} else {
		p.MintURL = from
	}
	p.Kind, p.Method, p.State = vend.PayoutKind(kind), vend.RefundMethod(method), vend.PayoutState(state)
	p.CreatedAt = fromMS(created)
	if ended != 0 {
		p.EndedAt = fromMS(ended)
	}
	return p, err
}

func getPayout(ctx context.Context, tx *wtx, id vend.PayoutID) (vend.Payout, error) {
	p, err := scanPayout(tx.QueryRowContext(ctx, "SELECT "+payoutColumns+" FROM payouts WHERE id = ?", id))
	if err != nil {
		return p, fmt.Errorf("payout %d: %w", id, err)
	}
	return p, nil
}

// ReservePayout reserves a payout before its money leaves, in one
// transaction, and returns it reserved:
//
//   - PayoutCredit takes np.Amount (0: every whole sat left) out of the
//     account's balance at once, into liabilities:credit_reserved; a
//     balance short of it is ErrCreditShort (the schema's balance CHECK
//     refuses it whatever the Go code does), so no draw can spend it
//     afterwards and its booking never fails for lack of balance;
//   - PayoutRefund claims an owed refund for this one payout: a refund
//     paid before is vend.ErrRefundPaid, one reserved by another payout
//     not ended is vend.ErrPayoutInFlight (a UNIQUE index refuses a
//     second one whatever the Go code does); the amount is at most what is
//     owed (a token: rounded up to a whole sat);
//   - PayoutWithdrawal records the intent.
//
// A bolt11 payout needs its melt quote (asked for before, paid after),
// or from an NWC wallet (np.NWC) the invoice's payment hash: a payment
// hash in flight or booked is vend.ErrPayoutInFlight. Not idempotent:
// each call reserves a new payout.
func (l *Ledger) ReservePayout(ctx context.Context, np vend.NewPayout) (vend.Payout, error) {
	if np.Method == vend.RefundBolt11 && (np.Quote == "" || np.Invoice == "") {
		return vend.Payout{}, fmt.Errorf("reserve payout: a bolt11 payout needs its invoice and its melt quote")
	}
	var p vend.Payout
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		p, err = reservePayout(ctx, tx, np, now)
		return err
	})
	if err != nil {
		return vend.Payout{}, fmt.Errorf("reserve payout: %w", l.fileError(err))
	}
	return p, nil
}

// reservePayout is ReservePayout's transaction.
func reservePayout(ctx context.Context, tx *wtx, np vend.NewPayout, now time.Time) (vend.Payout, error) {
	switch {
	case np.Method != vend.RefundCashu && np.Method != vend.RefundBolt11:
		return vend.Payout{}, fmt.Errorf("unknown method %q", np.Method)
	case np.NWC != "" && (!np.NWC.IsNWC() || np.MintURL != "" || np.Method != vend.RefundBolt11 ||
		np.Kind == vend.PayoutWithdrawal || !isPaymentHash(np.Quote) || np.FeeReserve != 0 || np.Wallet == ""):
		return vend.Payout{}, errors.New("an NWC payout pays a bolt11 by its payment hash, from one connection's wallet, and is no withdrawal")
	case np.NWC == "" && (np.MintURL == "" || vend.Backend(np.MintURL).IsNWC()) || np.Amount < 0 || np.FeeReserve < 0:
		return vend.Payout{}, errors.New("a mint and an amount >= 0 are required")
	case np.Amount == 0 && (np.Kind != vend.PayoutCredit || np.Method != vend.RefundCashu):
		return vend.Payout{}, errors.New("a positive amount is required")
	case np.Kind == vend.PayoutWithdrawal && np.Method != vend.RefundBolt11:
		return vend.Payout{}, errors.New("a withdrawal is a melt to a bolt11")
	}
	var account, refund any
	var entry sql.NullInt64
	desc := ""
	switch np.Kind {
	case vend.PayoutCredit:
		var bal vend.Msat
		err := tx.QueryRowContext(ctx, "SELECT balance_msat FROM credit_accounts WHERE id = ?", np.Account).Scan(&bal)
		if errors.Is(err, sql.ErrNoRows) {
			return vend.Payout{}, fmt.Errorf("credit account %s: %w", np.Account, vend.ErrNotFound)
		}
		if err != nil {
			return vend.Payout{}, err
		}
		if np.Amount == 0 {
			np.Amount = bal / vend.MsatPerSat * vend.MsatPerSat
		}
		if np.Amount <= 0 || np.Amount > bal {
			return vend.Payout{}, fmt.Errorf("%w: credit %s holds %s, the payout is %s", ErrCreditShort, np.Account, bal, np.Amount)
		}
		account = np.Account
		desc = fmt.Sprintf("credit %s: %s reserved for a payout by %s", np.Account, np.Amount, np.Method)
		id, err := postEntry(ctx, tx, Entry{Kind: "adjustment", Description: desc, Postings: []Posting{
			{Account: CreditAccount(np.Account), Amount: np.Amount}, {Account: AccountCreditReserved, Amount: -np.Amount}}}, now)
		if err != nil {
			return vend.Payout{}, err
		}
		entry = sql.NullInt64{Int64: id, Valid: true}
	case vend.PayoutRefund:
		r, err := scanRefund(tx.QueryRowContext(ctx, "SELECT "+refundColumns+refundFrom+" WHERE r.id = ?", np.Refund))
		if err != nil {
			return vend.Payout{}, fmt.Errorf("refund %d: %w", np.Refund, err)
		}
		if r.State != vend.RefundOwed {
			return vend.Payout{}, fmt.Errorf("%w: refund %d (call %d) was paid %s", vend.ErrRefundPaid, r.ID, r.CallID, r.PaidAt.Format(time.RFC3339))
		}
		limit := r.Amount
		if np.Method == vend.RefundCashu {
			limit = vend.Msat(r.Amount.SatsCeil() * vend.MsatPerSat)
		}
		if np.Amount > limit {
			return vend.Payout{}, fmt.Errorf("refund %d: %s is more than the %s owed", r.ID, np.Amount, r.Amount)
		}
		var other vend.PayoutID
		err = tx.QueryRowContext(ctx, "SELECT id FROM payouts WHERE refund_id = ? AND state = 'reserved'", r.ID).Scan(&other)
		if err == nil {
			return vend.Payout{}, fmt.Errorf("%w: refund %d is being paid by payout %d", vend.ErrPayoutInFlight, r.ID, other)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return vend.Payout{}, err
		}
		refund = int64(r.ID)
	case vend.PayoutWithdrawal:
	default:
		return vend.Payout{}, fmt.Errorf("unknown payout kind %q", np.Kind)
	}
	var quote any
	if np.Quote != "" {
		quote = np.Quote
	}
	var id vend.PayoutID
	err := tx.QueryRowContext(ctx, `INSERT INTO payouts (kind, account_id, refund_id, method, mint_url, wallet, amount_msat, invoice,
		quote, fee_reserve_msat, state, created_at, reserve_entry_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'reserved', ?, ?) RETURNING id`,
		string(np.Kind), account, refund, string(np.Method), np.From(), np.Wallet, np.Amount, np.Invoice, quote, np.FeeReserve,
		ms(now), entry).Scan(&id)
	if isUnique(err) {
		if np.NWC != "" {
			return vend.Payout{}, fmt.Errorf("%w: a payout of invoice %s (payment hash %s) is in flight or booked", vend.ErrPayoutInFlight,
				abbrev(np.Invoice), np.Quote)
		}
		return vend.Payout{}, fmt.Errorf("%w: %v", vend.ErrPayoutInFlight, err)
	}
	if err != nil {
		return vend.Payout{}, err
	}
	if np.Kind == vend.PayoutCredit {
		if err := insertCreditMove(ctx, tx, np.Account, "payout", -np.Amount, 0, string(np.Method), desc, entry.Int64, id, now); err != nil {
			return vend.Payout{}, err
		}
	}
	return vend.Payout{ID: id, NewPayout: np, State: vend.PayoutReserved, CreatedAt: fromMS(ms(now))}, nil
}

// SetPayoutToken records, in one transaction, the token a reserved Cashu
// payout pays with, and what making it cost, before the token is handed
// over: a process that dies before the booking leaves the token for the
// next one to take back (unspent) or book (spent). Once per payout.
func (l *Ledger) SetPayoutToken(ctx context.Context, id vend.PayoutID, token string, fee vend.Msat) (vend.Payout, error) {
	if token == "" || fee < 0 {
		return vend.Payout{}, fmt.Errorf("payout %d: a token and a fee >= 0 are required", id)
	}
	var p vend.Payout
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		res, err := tx.ExecContext(ctx, `UPDATE payouts SET token = ?, fee_msat = ? WHERE id = ? AND state = 'reserved'
			AND method = 'cashu' AND token IS NULL`, token, fee, id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("payout %d: not a reserved Cashu payout without a token: %w", id, vend.ErrPayoutEnded)
		}
		p, err = getPayout(ctx, tx, id)
		return err
	})
	if err != nil {
		return vend.Payout{}, fmt.Errorf("payout token: %w", l.fileError(err))
	}
	return p, nil
}

// BookPayout books a reserved payout whose money left, with fee what
// paying it cost beyond its amount, in one transaction: its journal entry
// (see the package's payout accounts; a refund also becomes paid, with
// the payout's token or melt quote). Exactly once: a payout booked or
// released before is vend.ErrPayoutEnded and books nothing.
func (l *Ledger) BookPayout(ctx context.Context, id vend.PayoutID, fee vend.Msat) (vend.Payout, error) {
	if fee < 0 {
		return vend.Payout{}, fmt.Errorf("book payout %d: a negative fee", id)
	}
	var p vend.Payout
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = getPayout(ctx, tx, id); err != nil {
			return err
		}
		p, err = bookPayout(ctx, tx, p, fee, now)
		return err
	})
	if err != nil {
		return vend.Payout{}, fmt.Errorf("book payout: %w", l.fileError(err))
	}
	return p, nil
}

// bookPayout is BookPayout's transaction for p, read in it.
func bookPayout(ctx context.Context, tx *wtx, p vend.Payout, fee vend.Msat, now time.Time) (vend.Payout, error) {
	if p.State != vend.PayoutReserved {
		return p, fmt.Errorf("%w: payout %d is %s", vend.ErrPayoutEnded, p.ID, p.State)
	}
	var entry int64
	var err error
	asset, feeAccount := PayoutAccounts(p.NewPayout)
	switch p.Kind {
	case vend.PayoutCredit:
		ps := []Posting{{Account: AccountCreditReserved, Amount: p.Amount}, {Account: asset, Amount: -(p.Amount + fee)}}
		if fee > 0 {
			ps = append(ps, Posting{Account: feeAccount, Amount: fee})
		}
		entry, err = postEntry(ctx, tx, Entry{Kind: "adjustment", Postings: ps,
			Description: fmt.Sprintf("credit %s refunded: %s by %s from %s (payout %d)", p.Account, p.Amount, p.Method, p.From(), p.ID)}, now)
	case vend.PayoutRefund:
		if p.Method == vend.RefundCashu && p.Token == "" {
			return p, fmt.Errorf("payout %d: a Cashu payout is booked with its token", p.ID)
		}
		entry, err = payRefundEntry(ctx, tx, p.Refund, vend.RefundPayout{Method: p.Method, MintURL: p.MintURL, NWC: p.NWC,
			Paid: p.Amount, Fee: fee, Token: p.Token, Ref: p.Quote}, now)
	case vend.PayoutWithdrawal:
		ps := []Posting{{Account: CashuAccount(p.MintURL), Amount: -(p.Amount + fee)}, {Account: AccountWithdrawals, Amount: p.Amount}}
		if fee > 0 {
			ps = append(ps, Posting{Account: CashuFeeAccount(p.MintURL), Amount: fee})
		}
		entry, err = postEntry(ctx, tx, Entry{Kind: "melt", Postings: ps,
			Description: fmt.Sprintf("melt %s at %s: paid %s (payout %d)", p.Quote, p.MintURL, p.Amount, p.ID)}, now)
	}
	if err != nil {
		return p, err
	}
	res, err := tx.ExecContext(ctx, `UPDATE payouts SET state = 'booked', fee_msat = ?, end_entry_id = ?, ended_at = ?
		WHERE id = ? AND state = 'reserved'`, fee, entry, ms(now), p.ID)
	if err != nil {
		return p, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return p, fmt.Errorf("%w: payout %d", vend.ErrPayoutEnded, p.ID)
	}
	return getPayout(ctx, tx, p.ID)
}

// ReleasePayout ends a reserved payout whose money did not leave, in one
// transaction: a credit payout's amount goes back to its account's
// balance (a 'release' move and its entry), a refund is owed again to be
// paid by another payout, a withdrawal is dropped. reason says why.
// Exactly once: a payout booked or released before is
// vend.ErrPayoutEnded and nothing changes.
func (l *Ledger) ReleasePayout(ctx context.Context, id vend.PayoutID, reason string) (vend.Payout, error) {
	var p vend.Payout
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = getPayout(ctx, tx, id); err != nil {
			return err
		}
		if p.State != vend.PayoutReserved {
			return fmt.Errorf("%w: payout %d is %s", vend.ErrPayoutEnded, p.ID, p.State)
		}
		var entry sql.NullInt64
		desc := fmt.Sprintf("credit %s: payout %d released (%s)", p.Account, p.ID, reason)
		if p.Kind == vend.PayoutCredit {
			id, err := postEntry(ctx, tx, Entry{Kind: "adjustment", Description: desc, Postings: []Posting{
				{Account: AccountCreditReserved, Amount: p.Amount}, {Account: CreditAccount(p.Account), Amount: -p.Amount}}}, now)
			if err != nil {
				return err
			}
			entry = sql.NullInt64{Int64: id, Valid: true}
		}
		res, err := tx.ExecContext(ctx, `UPDATE payouts SET state = 'released', reason = ?, end_entry_id = ?, ended_at = ?
			WHERE id = ? AND state = 'reserved'`, reason, entry, ms(now), p.ID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("%w: payout %d", vend.ErrPayoutEnded, p.ID)
		}
		if p.Kind == vend.PayoutCredit {
			if err := insertCreditMove(ctx, tx, p.Account, "release", p.Amount, 0, string(p.Method), desc, entry.Int64, p.ID, now); err != nil {
				return err
			}
		}
		p, err = getPayout(ctx, tx, p.ID)
		return err
	})
	if err != nil {
		return vend.Payout{}, fmt.Errorf("release payout: %w", l.fileError(err))
	}
	return p, nil
}

// PayoutAccounts returns the accounts a payout's money leaves and its fee
// goes to: assets:cashu:<mint> and expenses:fees:cashu:<mint> for the
// Cashu wallet's, NWCAccount and NWCFeeAccount of the connection for an
// NWC wallet's.
func PayoutAccounts(np vend.NewPayout) (asset, fee string) {
	if np.NWC != "" {
		return NWCAccount(np.NWC), NWCFeeAccount(np.NWC)
	}
	return CashuAccount(np.MintURL), CashuFeeAccount(np.MintURL)
}

// isPaymentHash reports whether s is a payment hash: 64 lower-case hex
// digits (as the schema checks it).
func isPaymentHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// abbrev shortens an invoice for an error.
func abbrev(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}

// PayoutByID returns a payout, or vend.ErrNotFound. Read only.
func (l *Ledger) PayoutByID(ctx context.Context, id vend.PayoutID) (vend.Payout, error) {
	p, err := scanPayout(l.rdb.QueryRowContext(ctx, "SELECT "+payoutColumns+" FROM payouts WHERE id = ?", id))
	if err != nil {
		return p, fmt.Errorf("payout %d: %w", id, err)
	}
	return p, nil
}

// Payouts lists the payouts in flight (reserved), oldest first; every
// payout with all. Read only.
func (l *Ledger) Payouts(ctx context.Context, all bool) ([]vend.Payout, error) {
	q := "SELECT " + payoutColumns + " FROM payouts"
	if !all {
		q += " WHERE state = 'reserved'"
	}
	rows, err := l.rdb.QueryContext(ctx, q+" ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("payouts: %w", l.fileError(err))
	}
	defer rows.Close()
	var out []vend.Payout
	for rows.Next() {
		p, err := scanPayout(rows)
		if err != nil {
			return nil, fmt.Errorf("payouts: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// payoutInvariants are ledger verify's checks of payouts.
var payoutInvariants = []invariant{
	{
		name: "credit reserved by payouts in flight equals liabilities:credit_reserved",
		query: `SELECT reserved, -held FROM (SELECT
				(SELECT coalesce(sum(amount_msat), 0) FROM payouts WHERE kind = 'credit' AND state = 'reserved') AS reserved,
				(SELECT coalesce(sum(p.amount_msat), 0) FROM postings p JOIN accounts a ON a.id = p.account_id
					JOIN entries e ON e.id = p.entry_id WHERE a.name = 'liabilities:credit_reserved' AND e.sealed = 1) AS held) AS s
			WHERE reserved <> -held`,
		format: "credit payouts in flight reserve %v msat but liabilities:credit_reserved holds %v msat",
	},
	{
		name: "each credit payout took its amount from its account once, and gave it back once if released",
		query: `SELECT id, state, reserved, released FROM (SELECT p.id, p.state,
				(SELECT count(*) FROM credit_moves m WHERE m.payout_id = p.id AND m.kind = 'payout'
					AND m.account_id = p.account_id AND m.amount_msat = -p.amount_msat) AS reserved,
				(SELECT count(*) FROM credit_moves m WHERE m.payout_id = p.id AND m.kind = 'release'
					AND m.account_id = p.account_id AND m.amount_msat = p.amount_msat) AS released
				FROM payouts p WHERE p.kind = 'credit') AS s
			WHERE reserved <> 1 OR released <> CASE WHEN state = 'released' THEN 1 ELSE 0 END`,
		format: "credit payout %v is %v with %v reservation and %v release moves",
	},
	{
		name: "each booked payout has its entry, and a booked refund payout its refund paid by it",
		query: `SELECT p.id, p.kind FROM payouts p WHERE p.state = 'booked'
			AND (NOT EXISTS (SELECT 1 FROM entries e WHERE e.id = p.end_entry_id AND e.sealed = 1)
				OR (p.kind = 'refund' AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.id = p.refund_id
					AND r.state = 'paid' AND r.entry_id = p.end_entry_id)))`,
		format: "payout %v (%v) is booked without its entry",
	},
	{
		// (A Cashu payout's accounts name its mint's host, which SQL
		// cannot read from the URL; an NWC payout's name its connection.)
		name: "each booked NWC payout took its amount and fee out of its connection's wallet, the fee an expense",
		query: `SELECT id, conn, want, took, fee, fees FROM (SELECT p.id, p.mint_url AS conn, p.amount_msat + p.fee_msat AS want,
				p.fee_msat AS fee,
				(SELECT coalesce(-sum(x.amount_msat), 0) FROM postings x JOIN accounts a ON a.id = x.account_id
					WHERE x.entry_id = p.end_entry_id AND a.name = 'assets:lightning:' || p.mint_url) AS took,
				(SELECT coalesce(sum(x.amount_msat), 0) FROM postings x JOIN accounts a ON a.id = x.account_id
					WHERE x.entry_id = p.end_entry_id AND a.name = 'expenses:fees:' || p.mint_url) AS fees
				FROM payouts p WHERE p.state = 'booked' AND p.mint_url LIKE 'nwc%') AS s
			WHERE took <> want OR fees <> fee`,
		format: "NWC payout %v of %v paid %v msat with its fee, its entry takes %v msat out of the wallet; fee %v msat, booked %v msat",
	},
	{
		name: "the schema's payout rules are in place",
		query: `SELECT t.name FROM (SELECT 'payouts_no_delete' AS name UNION ALL SELECT 'payouts_state_machine'
				UNION ALL SELECT 'payouts_end' UNION ALL SELECT 'refunds_paid_reserved'
				UNION ALL SELECT 'credit_moves_payout' UNION ALL SELECT 'payouts_nwc') t
			WHERE NOT EXISTS (SELECT 1 FROM sqlite_master m WHERE m.type = 'trigger' AND m.name = t.name)`,
		format: "trigger %v is missing",
	},
}
