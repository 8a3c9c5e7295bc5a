package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capvend/capvend/internal/journal"
	"github.com/capvend/capvend/vend"
)

// Accounts of the journal. Names are colon-separated segments of
// [A-Za-z0-9._-]; the first segment is the account type.
const (
	AccountLND         = "assets:lightning:lnd"
	AccountRefunds     = "liabilities:refunds"
	AccountOverpayment = "income:overpayments"
)

// IncomeAccount is where revenue from one tool is booked:
// income:tools:<server>:<tool>.
func IncomeAccount(server, tool string) string {
	return "income:tools:" + Segment(server) + ":" + Segment(tool)
}

// ItemIncomeAccount is where revenue from one tool, prompt or resource is
// booked: IncomeAccount for a tool, income:prompts:<server>:<prompt> for a
// prompt, income:resources:<server>:<uri> for a resource (its URI or URI
// template made one segment by Segment: "docs://guide" is "docs---guide").
func ItemIncomeAccount(kind vend.ItemKind, server, name string) string {
	switch kind {
	case vend.ItemPrompt:
		return "income:prompts:" + Segment(server) + ":" + Segment(name)
	case vend.ItemResource:
		return "income:resources:" + Segment(server) + ":" + Segment(name)
	}
	return IncomeAccount(server, name)
}

// incomeAccountsWhere selects every item income account (tools, prompts,
// resources) in a query joining accounts as a, and the income of expired
// credit; not the top-ups' (income only until delivered as credit).
const incomeAccountsWhere = `(a.name LIKE 'income:tools:%' OR a.name LIKE 'income:prompts:%' OR a.name LIKE 'income:resources:%'
	OR a.name = 'income:credit_expired') AND a.name <> 'income:tools:capvend:topup'`

// Account names and journal types shared with the billing backends live
// in the leaf package internal/journal; these are the same names.

// CashuAccount is the ecash held at one mint: journal.CashuAccount.
func CashuAccount(mintURL string) string { return journal.CashuAccount(mintURL) }

// CashuFeeAccount is what a mint charged us: journal.CashuFeeAccount.
func CashuFeeAccount(mintURL string) string { return journal.CashuFeeAccount(mintURL) }

// Segment makes s safe as one account name segment: journal.Segment.
func Segment(s string) string { return journal.Segment(s) }

// LightningFeeAccount is routing fees we paid: expenses:fees:lightning.
const LightningFeeAccount = journal.LightningFeeAccount

var accountTypes = []string{"assets", "liabilities", "equity", "income", "expenses"}

// accountType validates an account name and returns its type.
func accountType(name string) (string, error) {
	segs := strings.Split(name, ":")
	for _, s := range segs {
		if s == "" || Segment(s) != s {
			return "", fmt.Errorf("account %q: segments must be non-empty and use only A-Z a-z 0-9 . _ -", name)
		}
	}
	for _, t := range accountTypes {
		if segs[0] == t {
			return t, nil
		}
	}
	return "", fmt.Errorf("account %q: must start with one of %s", name, strings.Join(accountTypes, ", "))
}

// Posting is one line of a journal entry (see journal.Posting).
type Posting = journal.Posting

// Entry is a balanced journal entry (see journal.Entry).
type Entry = journal.Entry

// ErrUnbalanced is returned for an entry whose postings do not sum to zero.
var ErrUnbalanced = errors.New("journal entry does not balance")

// Post books a balanced entry in its own transaction. It exists for the
// money movements that are not a call's settlement or refund (mint fees,
// melts, adjustments); settlements and refunds are booked by
// SettlePayment and Refund in the same transaction as their state change.
func (l *Ledger) Post(ctx context.Context, e Entry) error {
	if e.Kind == "settlement" || e.Kind == "refund" {
		return fmt.Errorf("post: %s entries are booked by SettlePayment and Refund", e.Kind)
	}
	return l.write(ctx, func(tx *wtx, now time.Time) error { return post(ctx, tx, e, now) })
}

// post writes an entry, its postings, and seals it: the schema refuses the
// seal unless the postings sum to zero.
func post(ctx context.Context, tx *wtx, e Entry, now time.Time) error {
	_, err := postEntry(ctx, tx, e, now)
	return err
}

// postEntry is post, returning the entry's id.
func postEntry(ctx context.Context, tx *wtx, e Entry, now time.Time) (int64, error) {
	var sum vend.Msat
	for _, p := range e.Postings {
		if p.Amount == 0 {
			return 0, fmt.Errorf("post: zero posting on %s", p.Account)
		}
		sum += p.Amount
	}
	if len(e.Postings) < 2 || sum != 0 {
		return 0, fmt.Errorf("post %q: %w (%d postings, sum %d msat)", e.Description, ErrUnbalanced, len(e.Postings), sum)
	}
	var entryID int64
	err := tx.QueryRowContext(ctx, `INSERT INTO entries (ts, kind, description, call_id, payment_id) VALUES (?, ?, ?, ?, ?) RETURNING id`,
		ms(now), e.Kind, e.Description, nullID(int64(e.CallID)), nullID(int64(e.PaymentID))).Scan(&entryID)
	if err != nil {
		return 0, fmt.Errorf("post: %w", err)
	}
	for _, p := range e.Postings {
		acct, err := ensureAccount(ctx, tx, p.Account, now)
		if err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO postings (entry_id, account_id, amount_msat) VALUES (?, ?, ?)",
			entryID, acct, p.Amount); err != nil {
			return 0, fmt.Errorf("post: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, "UPDATE entries SET sealed = 1 WHERE id = ?", entryID); err != nil {
		if isConstraint(err) {
			return 0, fmt.Errorf("post %q: %w", e.Description, ErrUnbalanced)
		}
		return 0, fmt.Errorf("post: %w", err)
	}
	return entryID, nil
}

func nullID(v int64) sql.NullInt64 { return sql.NullInt64{Int64: v, Valid: v != 0} }

func ensureAccount(ctx context.Context, tx *wtx, name string, now time.Time) (int64, error) {
	typ, err := accountType(name)
	if err != nil {
		return 0, err
	}
	// Look first, insert only a new name: an insert that meets the
	// existing row would still use up an id of PostgreSQL's sequence, and
	// account ids stay dense on both engines (exports name accounts by id).
	var id int64
	err = tx.QueryRowContext(ctx, "SELECT id FROM accounts WHERE name = ?", name).Scan(&id)
	if !errors.Is(err, sql.ErrNoRows) {
		return id, err
	}
	err = tx.QueryRowContext(ctx, `INSERT INTO accounts (name, type, created_at) VALUES (?, ?, ?) RETURNING id`,
		name, typ, ms(now)).Scan(&id)
	return id, err
}

// assetAccount is where a payment's money lands.
func assetAccount(p vend.Payment) string {
	switch {
	case p.Backend == vend.BackendCashu:
		return CashuAccount(p.MintURL)
	case p.Backend.IsNWC():
		return NWCAccount(p.Backend)
	}
	return AccountLND
}

// NWCAccount is the money received into the wallet of an NWC connection:
// assets:lightning:nwc, or assets:lightning:nwc:<name>. Refunds and credit
// paid back from that wallet leave it.
func NWCAccount(b vend.Backend) string {
	return "assets:lightning:" + string(b)
}

// NWCFeeAccount is what paying from the wallet of an NWC connection cost
// (the routing fees its pay_invoice reports): expenses:fees:nwc, or
// expenses:fees:nwc:<name>.
func NWCFeeAccount(b vend.Backend) string {
	return "expenses:fees:" + string(b)
}

// postSettlement books the one income entry of a settled payment:
// the asset receives what arrived less fees, the tool's income account the
// call's price, overpayment its own income account, fees an expense. A
// note (who booked it, if not the backend) ends the description.
func postSettlement(ctx context.Context, tx *wtx, p vend.Payment, c vend.Call, s vend.Settlement, now time.Time, note string) error {
	e := Entry{
		Kind:        "settlement",
		Description: fmt.Sprintf("%s%s/%s call %d paid by %s %s", kindPrefix(c.Kind), c.Server, c.Name, c.ID, p.Backend, p.Kind),
		CallID:      c.ID,
		PaymentID:   p.ID,
	}
	if note != "" {
		e.Description += " (" + note + ")"
	}
	if net := s.Amount - s.Fee; net > 0 {
		e.Postings = append(e.Postings, Posting{Account: assetAccount(p), Amount: net})
	}
	if s.Fee > 0 {
		fee := LightningFeeAccount
		if p.Backend == vend.BackendCashu {
			fee = CashuFeeAccount(p.MintURL)
		}
		e.Postings = append(e.Postings, Posting{Account: fee, Amount: s.Fee})
	}
	e.Postings = append(e.Postings, Posting{Account: ItemIncomeAccount(c.Kind, c.Server, c.Name), Amount: -c.Price})
	if over := s.Amount - c.Price; over > 0 {
		e.Postings = append(e.Postings, Posting{Account: AccountOverpayment, Amount: -over})
	}
	return post(ctx, tx, e, now)
}

// kindPrefix starts the description of a prompt's or resource's entry
// ("prompt demo/summarize call 3 ..."); tools have none, as before.
func kindPrefix(k vend.ItemKind) string {
	if k.Or() == vend.ItemTool {
		return ""
	}
	return string(k) + " "
}
