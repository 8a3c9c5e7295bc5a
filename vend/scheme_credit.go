package vend

import (
	"context"
	"fmt"
	"time"
)

// schemeCreditToken: a credit token (_meta[MetaCredit], the HeaderCredit
// header, the CreditArg argument) names its account, whose balance pays
// any priced call at once (see docs/ARCHITECTURE.md, Credit accounts).
// Whoever holds the token owns the account, so it never travels on a
// public channel, and a top-up's answer hands it back only on a private
// one.
var schemeCreditToken = Scheme{Name: SchemeCreditToken, Credential: "a credit token (cvc_...) naming its account", Bearer: true,
	Releases: ReleasesAccount, Private: true, HandsBack: "the account's credit token (a top-up's answer)"}

// schemeCreditKey: a Nostr request with _meta[MetaCredit] = true pays from
// the account of the key that signed it (CallRequest.CreditSelf): the
// signature is the credential, so a plaintext request may use it, and no
// token exists that spends the account without the key.
var schemeCreditKey = Scheme{Name: SchemeCreditKey, Credential: "a request signed by the account's Nostr key",
	Releases: ReleasesAccount}

// CreditLedger is the ledger's role of the credit schemes
// (scheme_credit.go): credit accounts. Each method is one atomic
// transaction. The ledger's Deliver and Refund also book a top-up call's credit
// (delivered) and a credit call's draw (delivered: to income; refunded:
// given back), in their own transaction.
type CreditLedger interface {
	// CreditKey returns the secret credit tokens are derived from (32
	// bytes, made once by the ledger). Read only.
	CreditKey(ctx context.Context) ([]byte, error)
	// BindTopUp records that the top-up call id credits account (created
	// with a zero balance if new) once delivered. Idempotent for the same
	// account; a call bound to another account is an error matching
	// ErrRequestReused and nothing changes.
	BindTopUp(ctx context.Context, id CallID, account string) error
	// TopUpAccount returns the account a top-up call credits, or
	// ErrNotFound. Read only.
	TopUpAccount(ctx context.Context, id CallID) (string, error)
	// RecordCreditCall records the new call nc like Ledger.RecordCall
	// and, if it is new (created), pays it from account and claims it for
	// one execution sending b, in the same transaction: the call's price
	// moves from the account to the drawn credit, the call becomes
	// executing and its execution is recorded. It returns the call,
	// created, and the balance left. A request key known already
	// (created false) draws nothing: its call is returned as RecordCall
	// returns it. A balance short of the price (or no such account) is a
	// *CreditExhaustedError and nothing is recorded; of any number of
	// concurrent draws only those the balance covers succeed. b not nc's
	// Binding is ErrExecutionMismatch.
	// by is who released it (Release), recorded with its execution.
	RecordCreditCall(ctx context.Context, nc NewCall, account string, b Binding, by Release) (call Call, created bool, balance Msat, err error)
	// DrawOf returns the account call id drew its price from, or
	// ErrNotFound. Read only.
	DrawOf(ctx context.Context, id CallID) (string, error)
	// CreditBalance returns an account's balance, or ErrNotFound. Read
	// only.
	CreditBalance(ctx context.Context, account string) (Msat, error)
	// ExpireCredit books to income, with a journal reason, the balance of
	// every account whose last top-up is older than after, and returns
	// how many accounts expired.
	ExpireCredit(ctx context.Context, after time.Duration) (int, error)
}

// isCredit reports whether a scheme pays a new call from an account.
func isCredit(s SchemeName) bool {
	return s == SchemeCreditToken || s == SchemeCreditKey || s == SchemeL402Credit
}

// byCredit reports whether r is paid from credit: it names an account and
// is not a top-up.
func byCredit(t *Item, r *CallRequest) bool {
	return (r.Credit != "" || r.CreditSelf || r.account != "") && !isTopUp(t)
}

// admitCredit records the new call nc paid from r's credit account and
// draws its price, in one ledger transaction (CreditLedger.RecordCreditCall):
// the admitted call is drawn and executing, ready to run (runDrawn), or
// known (a replay: nothing drawn). A balance short of the price records
// nothing and is a *CreditExhaustedError.
func (v *Vendor) admitCredit(ctx context.Context, nc NewCall, bind Binding, p pending) (*admitted, CallResult, error) {
	cl, _ := v.creditLedger() // r.account is set only with credit on
	call, created, bal, err := cl.RecordCreditCall(Urgent(ctx), nc, p.r.account, bind, p.release())
	if err != nil {
		return nil, CallResult{}, err
	}
	p.call = call
	if !created {
		p.scheme = SchemeReplay
	}
	return &admitted{pending: p, known: !created, drawn: created, balance: bal}, CallResult{}, nil
}

// creditAccount returns the account r pays from or tops up: its token's,
// or its Nostr identity's (CreditSelf); "" if r names none. A bad token,
// or credit off while r names an account, is an error and nothing is done.
func (v *Vendor) creditAccount(ctx context.Context, r *CallRequest) (string, error) {
	if r.Credit == "" && !r.CreditSelf {
		return "", nil
	}
	cl, ok := v.creditLedger()
	if !ok {
		return "", ErrCreditOff
	}
	if r.Credit == "" {
		if !validAccount(NostrAccount(r.Client)) {
			return "", fmt.Errorf("%w: no Nostr identity to hold credit", ErrCreditToken)
		}
		return NostrAccount(r.Client), nil
	}
	key, err := cl.CreditKey(ctx)
	if err != nil {
		return "", err
	}
	return accountOfToken(key, r.Credit)
}

// bindTopUp names the account the top-up call a credits: the one recorded
// with the call if it is known, else r's, else a new token account.
func (a *admitted) bindTopUp(ctx context.Context, account string) (string, error) {
	cl, _ := a.v.creditLedger()
	if a.known {
		if acct, err := cl.TopUpAccount(ctx, a.call.ID); err == nil {
			return acct, nil
		}
	}
	if account == "" {
		account = "t" + randomHex(12)
	}
	if err := cl.BindTopUp(ctx, a.call.ID, account); err != nil {
		return "", err
	}
	return account, nil
}

// runDrawn runs the new call admitCredit drew from account (it is
// executing, its execution recorded): there is no payment to wait for.
func (c *admitted) runDrawn(ctx context.Context, account string) (CallResult, error) {
	v := c.v
	ctx = Urgent(ctx) // paid
	done := v.running.start(c.call.ID)
	if done == nil { // a new call runs nowhere else
		return CallResult{}, fmt.Errorf("call %d: %w", c.call.ID, ErrAlreadyClaimed)
	}
	defer v.running.stop(c.call.ID, done)
	p := creditPayment(c.call, account)
	c.pay = &p
	v.paid(c.r)
	// The ledger recorded the request's own item and arguments with the
	// call (admit), and bound the execution to them: they are what runs.
	// Drawn: the run and its records go ahead even if the client leaves.
	return c.finish(context.WithoutCancel(ctx), &c.t, c.args)
}
