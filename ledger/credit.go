package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

var _ vend.CreditLedger = (*Ledger)(nil)

// Accounts of prepaid credit (schema 13).
const (
	// AccountCreditDrawn holds the credit drawn by calls still running:
	// income once delivered, given back if not.
	AccountCreditDrawn = "liabilities:credit_drawn"
	// AccountCreditExpired is the income of expired credit.
	AccountCreditExpired = "income:credit_expired"
)

// CreditAccount is where an account's balance is owed to its client:
// liabilities:credit:<account>.
func CreditAccount(account string) string { return "liabilities:credit:" + Segment(account) }

// topUpIncome is where a top-up's payment is booked when it settles, like
// any call's (ItemIncomeAccount), until its delivery moves it to the
// client's credit: its balance is zero but for top-ups paid and not yet
// credited.
var topUpIncome = IncomeAccount(vend.CreditServer, "topup")

// CreditKey implements vend.CreditLedger.
func (l *Ledger) CreditKey(ctx context.Context) ([]byte, error) {
	l.creditKeyMu.Lock()
	defer l.creditKeyMu.Unlock()
	if l.creditKey != nil {
		return l.creditKey, nil
	}
	var key []byte
	if err := l.reader(ctx).QueryRowContext(ctx, "SELECT key FROM credit_key WHERE id = 1").Scan(&key); err != nil {
		return nil, fmt.Errorf("credit key: %w", l.fileError(err))
	}
	l.creditKey = key
	return key, nil
}

// BindTopUp implements vend.CreditLedger.
func (l *Ledger) BindTopUp(ctx context.Context, id vend.CallID, account string) error {
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var cur string
		err := tx.QueryRowContext(ctx, "SELECT account_id FROM credit_topups WHERE call_id = ?", id).Scan(&cur)
		if err == nil {
			if cur != account {
				return fmt.Errorf("%w: call %d tops up another account", vend.ErrRequestReused, id)
			}
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		c, err := getCall(ctx, tx, id)
		if err != nil {
			return err
		}
		if c.Server != vend.CreditServer || c.Name != "topup" {
			return fmt.Errorf("call %d is no top-up", id)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO credit_accounts (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING`,
			account, ms(now)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO credit_topups (call_id, account_id, created_at) VALUES (?, ?, ?)", id, account, ms(now))
		return err
	})
	if err != nil {
		return fmt.Errorf("top-up of call %d: %w", id, l.fileError(err))
	}
	return nil
}

// TopUpAccount implements vend.CreditLedger.
func (l *Ledger) TopUpAccount(ctx context.Context, id vend.CallID) (string, error) {
	var account string
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT account_id FROM credit_topups WHERE call_id = ?", id).Scan(&account)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("top-up of call %d: %w", id, vend.ErrNotFound)
	}
	return account, err
}

// DrawOf implements vend.CreditLedger.
func (l *Ledger) DrawOf(ctx context.Context, id vend.CallID) (string, error) {
	var account string
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT account_id FROM credit_moves WHERE call_id = ? AND kind = 'draw'", id).Scan(&account)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("credit draw of call %d: %w", id, vend.ErrNotFound)
	}
	return account, err
}

// CreditBalance implements vend.CreditLedger.
func (l *Ledger) CreditBalance(ctx context.Context, account string) (vend.Msat, error) {
	var bal vend.Msat
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT balance_msat FROM credit_accounts WHERE id = ?", account).Scan(&bal)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("credit account %s: %w", account, vend.ErrNotFound)
	}
	return bal, err
}

// DrawCredit draws the price of the quoted call id from account and
// claims it for one execution sending b: the balance check, the draw (its
// entry and move), the call's moves to executing and its execution record
// are one transaction. vend records and draws a new call in one
// (RecordCreditCall); this is the draw alone, for a call recorded before.
func (l *Ledger) DrawCredit(ctx context.Context, id vend.CallID, account string, b vend.Binding, by vend.Release) (vend.Call, vend.Msat, error) {
	var c vend.Call
	var bal vend.Msat
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if c, err = getCall(ctx, tx, id); err != nil {
			return err
		}
		bal, err = drawCredit(ctx, tx, &c, account, b, by, now)
		return err
	})
	if err = drawError(err, l); err != nil {
		return vend.Call{}, exhaustedBalance(err), err
	}
	return c, bal, nil
}

// RecordCreditCall implements vend.CreditLedger: RecordCall and, for a
// new call, the draw of DrawCredit, in one transaction. A refused draw
// (*CreditExhaustedError, a binding mismatch) records nothing.
func (l *Ledger) RecordCreditCall(ctx context.Context, nc vend.NewCall, account string, b vend.Binding, by vend.Release) (vend.Call, bool, vend.Msat, error) {
	if err := validateNewCall(nc); err != nil {
		return vend.Call{}, false, 0, err
	}
	var c vend.Call
	var created bool
	var bal vend.Msat
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if c, created, err = recordCall(ctx, tx, nc, now); err != nil || !created {
			return err
		}
		bal, err = drawCredit(ctx, tx, &c, account, b, by, now)
		return err
	})
	if err = drawError(err, l); err != nil {
		return vend.Call{}, false, exhaustedBalance(err), err
	}
	return c, created, bal, nil
}

// drawError is the error of a credit draw's transaction: a
// *CreditExhaustedError as it is, anything else wrapped.
func drawError(err error, l *Ledger) error {
	if err == nil {
		return nil
	}
	if ex, ok := errors.AsType[*vend.CreditExhaustedError](err); ok {
		return ex
	}
	return fmt.Errorf("credit draw: %w", l.fileError(err))
}

// exhaustedBalance is the balance an exhausted draw found, else 0.
func exhaustedBalance(err error) vend.Msat {
	if ex, ok := errors.AsType[*vend.CreditExhaustedError](err); ok {
		return ex.Balance
	}
	return 0
}

// drawCredit is the draw of the quoted call c from account in tx (see
// DrawCredit); it returns the balance left.
func drawCredit(ctx context.Context, tx *wtx, c *vend.Call, account string, b vend.Binding, by vend.Release, now time.Time) (vend.Msat, error) {
	if c.State != vend.CallQuoted {
		return 0, &vend.TransitionError{What: fmt.Sprintf("call %d (credit draw)", c.ID), From: string(c.State), To: string(vend.CallExecuting)}
	}
	if err := checkBinding(*c, b); err != nil {
		return 0, err
	}
	var bal vend.Msat
	if err := tx.QueryRowContext(ctx, "SELECT balance_msat FROM credit_accounts WHERE id = ?", account).Scan(&bal); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	if bal < c.Price {
		return bal, &vend.CreditExhaustedError{Account: account, Balance: bal, Price: c.Price}
	}
	for _, to := range []vend.CallState{vend.CallAwaitingPayment, vend.CallPaid, vend.CallExecuting} {
		if err := setCallState(ctx, tx, c, to, "", now); err != nil {
			return 0, err
		}
	}
	desc := fmt.Sprintf("%s%s/%s call %d drawn from credit %s", kindPrefix(c.Kind), c.Server, c.Name, c.ID, account)
	if err := creditMove(ctx, tx, account, "draw", -c.Price, c.ID, "", desc,
		[]Posting{{Account: CreditAccount(account), Amount: c.Price}, {Account: AccountCreditDrawn, Amount: -c.Price}}, now); err != nil {
		return 0, err
	}
	return bal - c.Price, recordExecution(ctx, tx, c, b, by, now)
}

// creditMove books one move of an account's credit: its journal entry
// (kind adjustment) and its credit_moves row, whose trigger changes the
// balance (the schema refuses a negative one).
func creditMove(ctx context.Context, tx *wtx, account, kind string, amount vend.Msat, call vend.CallID, method, desc string,
	postings []Posting, now time.Time) error {
	entry, err := postEntry(ctx, tx, Entry{Kind: "adjustment", Description: desc, CallID: call, Postings: postings}, now)
	if err != nil {
		return err
	}
	return insertCreditMove(ctx, tx, account, kind, amount, call, method, desc, entry, 0, now)
}

// insertCreditMove writes the credit_moves row of a move booked by entry
// (of payout, if not 0).
func insertCreditMove(ctx context.Context, tx *wtx, account, kind string, amount vend.Msat, call vend.CallID, method, desc string,
	entry int64, payout vend.PayoutID, now time.Time) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO credit_moves (account_id, kind, amount_msat, call_id, entry_id, reason, created_at, method, payout_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, account, kind, amount, nullID(int64(call)), entry, desc, ms(now),
		sql.NullString{String: method, Valid: method != ""}, nullID(int64(payout)))
	if isConstraint(err) {
		if kind == "payout" {
			return fmt.Errorf("%w: credit %s: refused by the ledger's rules: %v", ErrCreditShort, account, err)
		}
		return fmt.Errorf("credit %s of %s: refused by the ledger's rules: %w", kind, account, vend.ErrIllegalTransition)
	}
	return err
}

// creditOfCall returns the account a call drew from and whether its draw
// is still open; account "" if the call drew nothing.
func creditOfCall(ctx context.Context, tx *wtx, id vend.CallID) (account string, open bool, err error) {
	var closed int
	err = tx.QueryRowContext(ctx, `SELECT d.account_id, (SELECT count(*) FROM credit_moves x WHERE x.call_id = d.call_id
		AND x.kind IN ('deliver', 'giveback')) FROM credit_moves d WHERE d.call_id = ? AND d.kind = 'draw'`, id).Scan(&account, &closed)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return account, closed == 0, err
}

// deliverCredit books what delivering c means for credit, in Deliver's
// transaction: a credit call's draw becomes income; a top-up's payment
// becomes its account's credit. Nothing for any other call.
func deliverCredit(ctx context.Context, tx *wtx, c vend.Call, now time.Time) error {
	account, open, err := creditOfCall(ctx, tx, c.ID)
	if err != nil {
		return err
	}
	if account != "" {
		if !open {
			return fmt.Errorf("call %d: its credit draw is closed: %w", c.ID, vend.ErrIllegalTransition)
		}
		desc := fmt.Sprintf("%s%s/%s call %d delivered, paid from credit %s", kindPrefix(c.Kind), c.Server, c.Name, c.ID, account)
		return creditMove(ctx, tx, account, "deliver", 0, c.ID, "", desc,
			[]Posting{{Account: AccountCreditDrawn, Amount: c.Price}, {Account: ItemIncomeAccount(c.Kind, c.Server, c.Name), Amount: -c.Price}}, now)
	}
	if c.Server != vend.CreditServer {
		return nil
	}
	if err := tx.QueryRowContext(ctx, "SELECT account_id FROM credit_topups WHERE call_id = ?", c.ID).Scan(&account); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("top-up call %d names no account", c.ID)
		}
		return err
	}
	desc := fmt.Sprintf("top-up call %d credited to %s", c.ID, account)
	return creditMove(ctx, tx, account, "topup", c.Price, c.ID, "", desc,
		[]Posting{{Account: topUpIncome, Amount: c.Price}, {Account: CreditAccount(account), Amount: -c.Price}}, now)
}

// giveBackCredit gives a refunded credit call's open draw back to its
// account, in Refund's transaction. ok=false if the call drew nothing.
func giveBackCredit(ctx context.Context, tx *wtx, c vend.Call, reason string, now time.Time) (ok bool, err error) {
	account, open, err := creditOfCall(ctx, tx, c.ID)
	if err != nil || account == "" {
		return false, err
	}
	if !open {
		return true, fmt.Errorf("call %d: its credit draw is closed: %w", c.ID, vend.ErrIllegalTransition)
	}
	desc := fmt.Sprintf("%s%s/%s call %d not delivered, given back to credit %s", kindPrefix(c.Kind), c.Server, c.Name, c.ID, account)
	if reason != "" {
		desc += ": " + reason
	}
	return true, creditMove(ctx, tx, account, "giveback", c.Price, c.ID, "", desc,
		[]Posting{{Account: AccountCreditDrawn, Amount: c.Price}, {Account: CreditAccount(account), Amount: -c.Price}}, now)
}

// ExpireCredit implements vend.CreditLedger: each expired balance is one
// transaction booking it to AccountCreditExpired.
func (l *Ledger) ExpireCredit(ctx context.Context, after time.Duration) (int, error) {
	if after <= 0 {
		return 0, errors.New("credit expiry: a positive duration is required")
	}
	cutoff := ms(l.now().Add(-after))
	rows, err := l.reader(ctx).QueryContext(ctx, `SELECT id FROM credit_accounts WHERE balance_msat > 0 AND topped_up_at <= ?`, cutoff)
	if err != nil {
		return 0, fmt.Errorf("credit expiry: %w", l.fileError(err))
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	n := 0
	for _, id := range ids {
		expired := false
		err := l.write(ctx, func(tx *wtx, now time.Time) error {
			var bal vend.Msat
			var topped int64
			if err := tx.QueryRowContext(ctx, "SELECT balance_msat, topped_up_at FROM credit_accounts WHERE id = ?", id).Scan(&bal, &topped); err != nil {
				return err
			}
			if bal <= 0 || topped > ms(now.Add(-after)) { // spent, or topped up since
				return nil
			}
			expired = true
			desc := fmt.Sprintf("credit %s expired: no top-up since %s (credit.expires_after %s)", id, fromMS(topped).Format(time.RFC3339), after)
			return creditMove(ctx, tx, id, "expiry", -bal, 0, "", desc,
				[]Posting{{Account: CreditAccount(id), Amount: bal}, {Account: AccountCreditExpired, Amount: -bal}}, now)
		})
		if err != nil {
			return n, fmt.Errorf("credit expiry of %s: %w", id, l.fileError(err))
		}
		if expired {
			n++
		}
	}
	return n, nil
}

// RefundCredit books a payout of an account's credit made already, in
// one transaction: it is reserved and booked at once (see ReservePayout
// and BookPayout; a payer that has not paid yet reserves first). Paid
// leaves the account to the wallet's ecash at MintURL (the fee an
// expense). A payout larger than the balance is refused (ErrCreditShort)
// and books nothing.
func (l *Ledger) RefundCredit(ctx context.Context, account string, p vend.CreditPayout) error {
	if p.Paid <= 0 || p.Fee < 0 || p.MintURL == "" || (p.Method != vend.RefundCashu && p.Method != vend.RefundBolt11) {
		return fmt.Errorf("credit refund of %s: a method, a mint and a positive amount are required", account)
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		po, err := reservePayout(ctx, tx, vend.NewPayout{Kind: vend.PayoutCredit, Account: account, Method: p.Method,
			MintURL: p.MintURL, Amount: p.Paid}, now)
		if err != nil {
			return err
		}
		_, err = bookPayout(ctx, tx, po, p.Fee, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("credit refund of %s: %w", account, l.fileError(err))
	}
	return nil
}

// CreditAccountInfo is one credit account as the operator sees it.
type CreditAccountInfo struct {
	ID        string
	Balance   vend.Msat
	CreatedAt time.Time
	ToppedUp  time.Time // zero if never
	// Sums of its moves, each positive; Refunded is what its payouts
	// booked, Reserved what payouts in flight hold (not in Balance).
	TopUps, Draws, GiveBacks, Expired, Refunded, Reserved vend.Msat
	Calls                                                 int // calls paid from it (draws)
}

// CreditAccounts returns every credit account, or only id if id is not
// "" (ErrNotFound if it does not exist), by id. Read only.
func (l *Ledger) CreditAccounts(ctx context.Context, id string) ([]CreditAccountInfo, error) {
	rows, err := l.reader(ctx).QueryContext(ctx, `SELECT a.id, a.balance_msat, a.created_at, coalesce(a.topped_up_at, 0),
		coalesce(sum(m.amount_msat) FILTER (WHERE m.kind = 'topup'), 0),
		-coalesce(sum(m.amount_msat) FILTER (WHERE m.kind = 'draw'), 0),
		coalesce(sum(m.amount_msat) FILTER (WHERE m.kind = 'giveback'), 0),
		-coalesce(sum(m.amount_msat) FILTER (WHERE m.kind = 'expiry'), 0),
		-coalesce(sum(m.amount_msat) FILTER (WHERE m.kind = 'refund'), 0)
			+ coalesce((SELECT sum(p.amount_msat) FROM payouts p WHERE p.account_id = a.id AND p.state = 'booked'), 0),
		coalesce((SELECT sum(p.amount_msat) FROM payouts p WHERE p.account_id = a.id AND p.state = 'reserved'), 0),
		count(m.id) FILTER (WHERE m.kind = 'draw')
		FROM credit_accounts a LEFT JOIN credit_moves m ON m.account_id = a.id
		WHERE ? = '' OR a.id = ? GROUP BY a.id ORDER BY a.id`, id, id)
	if err != nil {
		return nil, fmt.Errorf("credit accounts: %w", l.fileError(err))
	}
	defer rows.Close()
	var out []CreditAccountInfo
	for rows.Next() {
		var a CreditAccountInfo
		var created, topped int64
		if err := rows.Scan(&a.ID, &a.Balance, &created, &topped, &a.TopUps, &a.Draws, &a.GiveBacks, &a.Expired, &a.Refunded, &a.Reserved, &a.Calls); err != nil {
			return nil, err
		}
		a.CreatedAt = fromMS(created)
		if topped != 0 {
			a.ToppedUp = fromMS(topped)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if id != "" && len(out) == 0 {
		return nil, fmt.Errorf("credit account %s: %w", id, vend.ErrNotFound)
	}
	return out, nil
}
