package nwc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	decodepay "github.com/nbd-wtf/ln-decodepay"

	"github.com/capvend/capvend/vend"
)

// Payouts: a refund owed, or what is left of a credit account, paid to
// the client's bolt11 from the wallet of a connection that was granted
// pay_invoice (and lookup_invoice, to learn afterwards what became of a
// payment). Like every payout (vend.Payout) it is reserved in the ledger
// before the request is sent, with the invoice's payment hash, then
// booked with the fee the wallet reports (fees_paid), or released if the
// wallet did not pay:
//
//   - a refusal that sends nothing (INSUFFICIENT_BALANCE, QUOTA_EXCEEDED,
//     RESTRICTED, UNAUTHORIZED, RATE_LIMITED, NOT_IMPLEMENTED) releases it;
//   - any other answer, or none (a timeout, the relay gone), is checked
//     with lookup_invoice: settled is booked, failed or expired released,
//     pending (or unknown) left in flight; PAYMENT_FAILED with no payment
//     at the wallet is released.
//
// A payout left in flight (a process killed between the wallet paying
// and the booking, a payment still pending) belongs to the connection
// that made it (its client key: Payout.Wallet) and is resolved from
// lookup_invoice by the next payout command on that connection, and by
// capvend serve on it (at every connect, then every
// payoutRetry while any is left): settled is booked with its fees_paid,
// failed or expired released, pending left. NOT_FOUND is no proof that
// nothing was paid (a request may reach the wallet late): it is released
// only once the invoice has expired (no wallet can pay it then) and
// payoutGrace has passed, and left in flight until then.

// FailAfterPayout is the Payer's failpoint step (PayerConfig.Failpoint)
// between the wallet paying and the booking: the crash tests kill the
// process there.
const FailAfterPayout = "after_payout"

// PayoutMethods are what a connection needs to pay refunds from its
// wallet: pay_invoice, and lookup_invoice to learn what became of a
// payment whose answer was lost.
var PayoutMethods = []string{MethodPayInvoice, MethodLookupInvoice}

// ErrNoRefundInvoice: a refund is to be paid to a bolt11 but none was
// given, by the client or the operator.
var ErrNoRefundInvoice = errors.New("nwc: no invoice to pay the refund to (the client gave none: pass one)")

// ErrPayoutLeft: the payout is reserved and its money may have left:
// the wallet did not say (a timeout, the relay gone) or says it is
// pending. It stays in flight, and is booked or released when the wallet
// tells (the next payout command on the connection, or capvend serve).
var ErrPayoutLeft = errors.New("nwc: the payout stays in flight")

const (
	// payoutGrace is how long past its invoice's expiry a payout the
	// wallet does not know stays in flight before it is released.
	payoutGrace = 10 * time.Minute
	// payoutRetry is how often capvend serve looks up the payouts it
	// could not resolve yet.
	payoutRetry = 10 * time.Second
)

// Book is the part of the ledger payouts from the wallet use;
// *ledger.Ledger implements it (see its methods for their contracts).
type Book interface {
	// ReservePayout reserves a payout before its money leaves.
	ReservePayout(ctx context.Context, np vend.NewPayout) (vend.Payout, error)
	// BookPayout books a reserved payout whose money left, once.
	BookPayout(ctx context.Context, id vend.PayoutID, fee vend.Msat) (vend.Payout, error)
	// ReleasePayout ends a reserved payout whose money did not leave.
	ReleasePayout(ctx context.Context, id vend.PayoutID, reason string) (vend.Payout, error)
	// PayoutByID returns a payout, or vend.ErrNotFound.
	PayoutByID(ctx context.Context, id vend.PayoutID) (vend.Payout, error)
	// Payouts lists the payouts in flight (all: every payout).
	Payouts(ctx context.Context, all bool) ([]vend.Payout, error)
	// RefundByID returns a refund, or vend.ErrNotFound.
	RefundByID(ctx context.Context, id vend.RefundID) (vend.Refund, error)
	// CreditBalance returns a credit account's balance, or vend.ErrNotFound.
	CreditBalance(ctx context.Context, account string) (vend.Msat, error)
}

// PayerConfig tunes a Payer.
type PayerConfig struct {
	// Name names the connection (as Config.Name): its payouts are
	// booked out of ledger.NWCAccount(vend.NWCBackend(Name)).
	Name string
	// PayTimeout bounds one pay_invoice: the request and the wallet's
	// answer (default 2 min; the request expires then, NIP-40).
	PayTimeout time.Duration
	// Failpoint is the crash tests' hook (FailAfterPayout); nil
	// otherwise.
	Failpoint func(step string)
	// Log receives a line per payout resolved; never the URI's secret.
	Log *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Payer pays refunds and credit back from the wallet of one connection.
// Its methods are safe for concurrent use; the ledger decides between
// payers (one reservation per refund, per payment hash).
type Payer struct {
	c      *Client
	book   Book
	cfg    PayerConfig
	name   vend.Backend
	wallet string
}

// NewPayer returns the payer of connection c, booking into book. It
// connects nothing.
func NewPayer(c *Client, book Book, cfg PayerConfig) (*Payer, error) {
	if cfg.Name != "" && !vend.ValidNWCName(cfg.Name) {
		return nil, fmt.Errorf("nwc: connection name %q: use lower-case letters, digits, '_' and '-'", cfg.Name)
	}
	if cfg.PayTimeout <= 0 {
		cfg.PayTimeout = 2 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Payer{c: c, book: book, cfg: cfg, name: vend.NWCBackend(cfg.Name), wallet: WalletID(c)}, nil
}

// WalletID identifies connection c in the ledger's payouts
// (vend.Payout.Wallet): "nwc:" and the first 16 hex digits of its client
// public key, public (every request is signed with it), and the same
// for every process holding the same URI.
func WalletID(c *Client) string { return "nwc:" + c.clientPub[:16] }

// PayResult is a payment the wallet made.
type PayResult struct {
	Payout      vend.Payout // as booked
	PaymentHash string
	Amount      vend.Msat // what the recipient got
	Fee         vend.Msat // the routing fee the wallet reported (fees_paid)
	Preimage    string    // proof of payment, hex ("" if the wallet's answer was lost)
}

// PayRefund pays owed refund id from the wallet to invoice, or if "" to
// the one the client gave with its call (ErrNoRefundInvoice if none). An
// invoice for more than is owed is refused before anything is reserved
// or paid; one for less settles the refund (the rest was given up by the
// client and stays income:overpayments); one without an amount is paid
// exactly what is owed. The payout is reserved first (a refund another
// payer has in flight is refused, vend.ErrPayoutInFlight; one paid
// before is vend.ErrRefundPaid), then pay_invoice, then booked in one
// entry: liabilities:refunds to assets:lightning:<conn>, the fee an
// expense. It first resolves the payouts this connection left in flight.
// An error wrapping ErrPayoutLeft means the money may have left: the
// payout stays reserved until the wallet tells.
func (p *Payer) PayRefund(ctx context.Context, id vend.RefundID, invoice string) (vend.Refund, PayResult, error) {
	r, err := p.book.RefundByID(ctx, id)
	if err != nil {
		return r, PayResult{}, err
	}
	if r.State != vend.RefundOwed {
		return r, PayResult{}, fmt.Errorf("%w: refund %d (call %d) was paid %s", vend.ErrRefundPaid, r.ID, r.CallID, r.PaidAt.Format(time.RFC3339))
	}
	if invoice == "" {
		invoice = r.Invoice
	}
	if invoice == "" {
		return r, PayResult{}, ErrNoRefundInvoice
	}
	invoice, inv, err := decodeInvoice(invoice)
	if err != nil {
		return r, PayResult{}, err
	}
	amount := inv.amount
	if amount == 0 {
		amount = r.Amount
	}
	if amount > r.Amount {
		return r, PayResult{}, fmt.Errorf("nwc: refund %d: the invoice asks %s, more than the %s owed: refused, nothing was paid", r.ID, amount, r.Amount)
	}
	if err := p.prepare(ctx, inv); err != nil {
		return r, PayResult{}, err
	}
	// A payout of it left in flight may have been booked just now.
	if r, err = p.book.RefundByID(ctx, id); err == nil && r.State != vend.RefundOwed {
		return r, PayResult{}, fmt.Errorf("%w: refund %d (call %d) was paid %s", vend.ErrRefundPaid, r.ID, r.CallID, r.PaidAt.Format(time.RFC3339))
	}
	res, err := p.pay(ctx, vend.NewPayout{Kind: vend.PayoutRefund, Refund: r.ID, Amount: amount}, invoice, inv)
	if err != nil {
		return r, res, fmt.Errorf("refund %d: %w", r.ID, err)
	}
	r, err = p.book.RefundByID(context.WithoutCancel(ctx), r.ID)
	return r, res, err
}

// PayCredit pays what is left of credit account to invoice from the
// wallet: the invoice's amount (at most the balance: more is refused
// before anything is reserved or paid), or the whole balance for an
// invoice without an amount. The payout is reserved first (the amount
// taken out of the balance at once: no call can spend it meanwhile), then
// pay_invoice, then booked (liabilities:credit_reserved to
// assets:lightning:<conn>, the fee an expense), or released back to the
// balance if the wallet did not pay. It first resolves the payouts this
// connection left in flight; ErrPayoutLeft as for PayRefund.
func (p *Payer) PayCredit(ctx context.Context, account, invoice string) (vend.CreditPayout, PayResult, error) {
	bal, err := p.book.CreditBalance(ctx, account)
	if err != nil {
		return vend.CreditPayout{}, PayResult{}, err
	}
	if bal <= 0 {
		return vend.CreditPayout{}, PayResult{}, fmt.Errorf("nwc: credit %s holds %s: nothing to refund", account, bal)
	}
	invoice, inv, err := decodeInvoice(invoice)
	if err != nil {
		return vend.CreditPayout{}, PayResult{}, err
	}
	amount := inv.amount
	if amount == 0 {
		amount = bal
	}
	if amount > bal {
		return vend.CreditPayout{}, PayResult{}, fmt.Errorf("nwc: credit %s: the invoice asks %s, more than the %s left: refused, nothing was paid", account, amount, bal)
	}
	if err := p.prepare(ctx, inv); err != nil {
		return vend.CreditPayout{}, PayResult{}, err
	}
	res, err := p.pay(ctx, vend.NewPayout{Kind: vend.PayoutCredit, Account: account, Amount: amount}, invoice, inv)
	if err != nil {
		return vend.CreditPayout{}, res, fmt.Errorf("credit %s: %w", account, err)
	}
	return vend.CreditPayout{Method: vend.RefundBolt11, NWC: p.name, Paid: res.Amount, Fee: res.Fee}, res, nil
}

// invoice is what a payout needs of a bolt11.
type invoice struct {
	hash    string    // its payment hash, lower-case hex
	amount  vend.Msat // 0: the payer says how much
	expires time.Time
}

// decodeInvoice normalizes and decodes a bolt11 ("lightning:" prefix
// allowed, any case).
func decodeInvoice(s string) (string, invoice, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "lightning:")
	inv, err := decodepay.Decodepay(s)
	if err != nil {
		return "", invoice{}, fmt.Errorf("nwc: invalid invoice: %w", err)
	}
	if inv.MSatoshi < 0 || !isHash(inv.PaymentHash) {
		return "", invoice{}, errors.New("nwc: invalid invoice: no payment hash or a negative amount")
	}
	expiry := inv.Expiry
	if expiry <= 0 {
		expiry = 3600 // BOLT 11's default
	}
	return s, invoice{hash: strings.ToLower(inv.PaymentHash), amount: vend.Msat(inv.MSatoshi),
		expires: time.Unix(int64(inv.CreatedAt)+int64(expiry), 0)}, nil
}

// ready makes sure the payer has a session whose connection may pay
// (PayoutMethods), connecting if there is none.
func (p *Payer) ready(ctx context.Context) error {
	if p.c.Current() == nil {
		if _, err := p.c.Connect(ctx); err != nil {
			return err
		}
	}
	if err := Granted(p.c.Info(), PayoutMethods...); err != nil {
		return fmt.Errorf("%w: needed to pay refunds from this wallet (give the connection a budget: a leaked URI then spends no more)", err)
	}
	return nil
}

// prepare checks that inv has not expired, connects (the connection may
// pay: ready) and resolves the payouts this connection left in flight:
// those it cannot resolve stay reserved, and still count.
func (p *Payer) prepare(ctx context.Context, inv invoice) error {
	if !p.cfg.Now().Before(inv.expires) {
		return fmt.Errorf("nwc: the invoice expired at %s: ask the client for a new one: refused, nothing was paid",
			inv.expires.UTC().Format(time.RFC3339))
	}
	if err := p.ready(ctx); err != nil {
		return err
	}
	ended, _, err := p.Resolve(ctx)
	p.logResolved(ended)
	if err != nil {
		p.cfg.Log.Warn("nwc: payouts left in flight not resolved yet", "backend", string(p.name), "err", err)
	}
	return nil
}

// pay reserves np (Amount set) for invoice and pays it from the wallet
// (see the comment at the top of the file); prepare ran before.
func (p *Payer) pay(ctx context.Context, np vend.NewPayout, bolt11 string, inv invoice) (PayResult, error) {
	res := PayResult{PaymentHash: inv.hash, Amount: np.Amount}
	if np.Amount <= 0 {
		return res, errors.New("nwc: a payout of nothing")
	}
	np.Method, np.NWC, np.Wallet, np.Invoice, np.Quote = vend.RefundBolt11, p.name, p.wallet, bolt11, inv.hash
	po, err := p.book.ReservePayout(ctx, np)
	if err != nil {
		return res, err
	}
	res.Payout = po
	ctx = context.WithoutCancel(ctx) // reserved: it must end, booked or released, or be left for the wallet to tell
	params := map[string]any{"invoice": bolt11}
	if inv.amount == 0 {
		params["amount"] = int64(po.Amount)
	}
	var out struct {
		Preimage string `json:"preimage"`
		FeesPaid *int64 `json:"fees_paid"`
	}
	payErr := p.c.doWithin(ctx, p.cfg.PayTimeout, MethodPayInvoice, params, &out)
	if payErr == nil && !preimageOf(out.Preimage, inv.hash) {
		// A wallet that answers without a proof is asked what happened.
		payErr = fmt.Errorf("nwc: pay_invoice: the wallet's preimage %q does not match payment hash %s", short(out.Preimage), inv.hash)
	}
	if payErr == nil {
		res.Preimage = out.Preimage
		fee := vend.Msat(0)
		if out.FeesPaid != nil {
			fee = vend.Msat(max(*out.FeesPaid, 0))
		} else if tx, err := p.lookup(ctx, inv.hash); err == nil && txState(tx) == stateSettled {
			fee = vend.Msat(max(tx.FeesPaid, 0)) // the wallet tells the fee in its transaction only
		}
		return p.book1(ctx, po, fee, res)
	}
	var we *WalletError
	if errors.As(payErr, &we) && notSent(payErr) {
		if _, err := p.book.ReleasePayout(ctx, po.ID, "the wallet refused to pay: "+we.Error()); err != nil {
			return res, fmt.Errorf("%w; releasing payout %d failed too (%v): it stays in flight until the connection is used again", explain(payErr), po.ID, err)
		}
		return res, fmt.Errorf("%w (nothing was paid)", explain(payErr))
	}
	// The wallet may have paid with its answer lost, or failed after
	// trying: ask it.
	tx, err := p.lookup(ctx, inv.hash)
	switch {
	case err == nil && txState(tx) == stateSettled && tx.Type != "incoming":
		res.Preimage = tx.Preimage
		return p.book1(ctx, po, vend.Msat(max(tx.FeesPaid, 0)), res)
	case err == nil && txState(tx) == stateEnded && tx.Type != "incoming",
		errors.Is(err, ErrNotFound) && errors.Is(payErr, ErrPaymentFailed):
		why := "the wallet did not pay the invoice: " + payErr.Error()
		if _, err := p.book.ReleasePayout(ctx, po.ID, why); err != nil {
			return res, fmt.Errorf("%w; releasing payout %d failed too (%v): it stays in flight until the connection is used again", explain(payErr), po.ID, err)
		}
		return res, fmt.Errorf("%w (nothing was paid)", explain(payErr))
	}
	state := "unknown to it"
	if err == nil {
		state = "pending"
	} else if !errors.Is(err, ErrNotFound) {
		state = "not known yet (" + err.Error() + ")"
	}
	return res, fmt.Errorf("%w: payout %d of %s (payment hash %s): the wallet answered %v, and says the payment is %s; it is booked or released by the next payout command on this connection or 'capvend serve'",
		ErrPayoutLeft, po.ID, po.Amount, inv.hash, payErr, state)
}

// book1 books a payout the wallet paid, once: one booked meanwhile by
// another process (capvend serve resolving it) is returned as it is.
func (p *Payer) book1(ctx context.Context, po vend.Payout, fee vend.Msat, res PayResult) (PayResult, error) {
	p.failpoint(FailAfterPayout)
	booked, err := p.book.BookPayout(ctx, po.ID, fee)
	if errors.Is(err, vend.ErrPayoutEnded) {
		if now, rerr := p.book.PayoutByID(ctx, po.ID); rerr == nil && now.State == vend.PayoutBooked {
			booked, err = now, nil
		}
	}
	if err != nil {
		return res, fmt.Errorf("the wallet PAID invoice %s (payment hash %s, %s + %s fee) but booking it failed: %w; payout %d stays reserved and is booked when the connection is used again",
			short(po.Invoice), res.PaymentHash, po.Amount, fee, err, po.ID)
	}
	res.Payout, res.Fee = booked, booked.Fee
	return res, nil
}

func (p *Payer) failpoint(step string) {
	if p.cfg.Failpoint != nil {
		p.cfg.Failpoint(step)
	}
}

// lookup asks the wallet for the transaction of payment hash ref.
func (p *Payer) lookup(ctx context.Context, ref string) (Transaction, error) {
	var tx Transaction
	err := p.c.Do(ctx, MethodLookupInvoice, map[string]any{"payment_hash": ref}, &tx)
	return tx, err
}

// Resolve ends the payouts this connection left in flight (see the
// comment at the top of the file), from lookup_invoice, and returns
// those it ended and how many it could not end yet, with why. It
// connects if there is no session. Idempotent: the ledger books or
// releases a payout once.
func (p *Payer) Resolve(ctx context.Context) (ended []vend.Payout, left int, err error) {
	ps, err := p.book.Payouts(ctx, false)
	if err != nil {
		return nil, 0, err
	}
	var errs []error
	for _, po := range ps {
		if po.Wallet != p.wallet || po.NWC == "" {
			continue // another wallet's: its holder resolves it
		}
		if p.c.Current() == nil {
			if _, err := p.c.Connect(ctx); err != nil {
				return ended, left + 1, err
			}
		}
		e, err := p.resolveOne(ctx, po)
		if err != nil {
			errs = append(errs, fmt.Errorf("payout %d: %w", po.ID, err))
		}
		if e.State != vend.PayoutBooked && e.State != vend.PayoutReleased {
			left++
			continue
		}
		ended = append(ended, e)
	}
	return ended, left, errors.Join(errs...)
}

// resolveOne ends one payout this connection left in flight, from the
// wallet's word.
func (p *Payer) resolveOne(ctx context.Context, po vend.Payout) (vend.Payout, error) {
	ctx = context.WithoutCancel(ctx)
	tx, err := p.lookup(ctx, po.Quote)
	switch {
	case errors.Is(err, ErrNotFound):
		_, inv, derr := decodeInvoice(po.Invoice)
		if derr == nil && p.cfg.Now().After(inv.expires.Add(payoutGrace)) {
			return p.book.ReleasePayout(ctx, po.ID, fmt.Sprintf("left in flight; the wallet has no payment of it and the invoice expired at %s",
				inv.expires.UTC().Format(time.RFC3339)))
		}
		return po, fmt.Errorf("the wallet has no payment %s (yet): left in flight until the invoice expires", short(po.Quote))
	case err != nil:
		return po, err
	case tx.Type == "incoming":
		return po, fmt.Errorf("the wallet's transaction %s is an incoming one, not this payout", short(po.Quote))
	}
	switch txState(tx) {
	case stateSettled:
		b, err := p.book.BookPayout(ctx, po.ID, vend.Msat(max(tx.FeesPaid, 0)))
		if errors.Is(err, vend.ErrPayoutEnded) {
			return p.book.PayoutByID(ctx, po.ID)
		}
		return b, err
	case stateEnded:
		r, err := p.book.ReleasePayout(ctx, po.ID, "left in flight; the wallet's payment "+strings.ToLower(tx.State))
		if errors.Is(err, vend.ErrPayoutEnded) {
			return p.book.PayoutByID(ctx, po.ID)
		}
		return r, err
	}
	return po, fmt.Errorf("the wallet's payment %s is %s", short(po.Quote), strings.ToLower(tx.State))
}

// logResolved logs each payout Resolve ended.
func (p *Payer) logResolved(ended []vend.Payout) {
	for _, po := range ended {
		p.cfg.Log.Warn("nwc: payout left in flight resolved", "backend", string(p.name), "payout", int64(po.ID), "kind", string(po.Kind),
			"state", string(po.State), "amount_msat", int64(po.Amount), "fee_msat", int64(po.Fee), "reason", po.Reason)
	}
}

// notSent reports whether a wallet error says the payment was refused
// before anything was sent.
func notSent(err error) bool {
	for _, e := range []error{ErrInsufficientBalance, ErrQuotaExceeded, ErrRestricted, ErrUnauthorized, ErrRateLimited,
		ErrNotImplemented, ErrUnsupportedEncryption} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// explain adds to a wallet's refusal to pay what the operator can do.
func explain(err error) error {
	switch {
	case errors.Is(err, ErrInsufficientBalance):
		return fmt.Errorf("%w: top the wallet up (the amount and a routing fee), or pay from the Cashu wallet", err)
	case errors.Is(err, ErrQuotaExceeded):
		return fmt.Errorf("%w: raise the connection's budget in the wallet (Alby Hub: Connections, the app, budget), or wait for it to renew", err)
	case errors.Is(err, ErrRestricted):
		return fmt.Errorf("%w: grant the connection pay_invoice in the wallet", err)
	case errors.Is(err, ErrUnauthorized):
		return fmt.Errorf("%w: the connection was revoked? make a new one and put its URI in the configured file", err)
	case errors.Is(err, ErrRateLimited):
		return fmt.Errorf("%w: try again in a minute", err)
	case errors.Is(err, ErrPaymentFailed):
		return fmt.Errorf("%w: the wallet found no route or the invoice was refused; try again later, or ask the client for another invoice", err)
	case errors.Is(err, ErrNotImplemented):
		return fmt.Errorf("%w: this wallet cannot pay invoices through NWC; pay from the Cashu wallet", err)
	}
	return err
}

// preimageOf reports whether hex preimage hashes to payment hash h.
func preimageOf(preimage, h string) bool {
	b, err := hex.DecodeString(preimage)
	if err != nil || len(b) != 32 {
		return false
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]) == h
}

// short abbreviates a long identifier for a message.
func short(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}
