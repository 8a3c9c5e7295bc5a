// Package nwc is capvend's payment backend on a wallet reached by Nostr
// Wallet Connect (NIP-47): the seller's own wallet (Alby Hub, Coinos,
// Primal, Zeus, LNbits, ...) issues the invoices, and the money lands
// there. It speaks NIP-47 over the wallet's relay with go-nostr: NIP-44
// encryption, or NIP-04 for a wallet whose info event (kind 13194) offers
// nothing else. It implements vend.PaymentBackend (and reconcile's NWC);
// docs/OPERATING.md, "Getting paid into your wallet", sets it up.
//
// # Invoices
//
// At start the backend connects and asks get_info what the connection
// may do. With make_hold_invoice, settle_hold_invoice and
// cancel_hold_invoice granted (and Config.Hold), a request that asks for a
// hold invoice gets one, its preimage made by capvend and kept in the
// ledger, as with LND: settled after the tool succeeded, canceled (the
// money returns by Lightning) when it failed. Every other request gets the
// wallet's plain invoice (make_invoice), a vend.KindWalletInvoice: NIP-47
// cannot withdraw it, so it stays payable Config.Grace past capvend's
// expiry, and money that arrives after capvend gave up is booked and owed
// back (vend.LatePayable), like a plain LND invoice's refund.
//
// # Watching payments
//
// Payments are learned from the payment_received and hold_invoice_accepted
// notifications, and by lookup_invoice: of every unsettled payment each
// time the connection is (re)made, before any notification is taken
// (notifications are ephemeral events: those sent while the relay was
// out of reach are lost, the lookups find what they said), of those past
// their expiry every Config.Sweep, of all open ones every Sweep when the
// connection is not sent the notifications, and of the newest open ones
// every Config.TailCheck when it is (a notification lost while the
// connection stayed up: the relay dropped it, or the wallet never sent
// it). Every change is recorded
// in the ledger exactly once (its claims decide between a notification, a
// lookup and SettleHeld seeing the same change), then reported.
//
// A connection granted pay_invoice can also pay refunds and credit back
// from the wallet (Payer, payout.go: `capvend refunds pay --nwc`), reserved
// in the ledger first. The backend resolves the payouts its connection
// left in flight each time it connects, from lookup_invoice.
package nwc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capvend/capvend/internal/retry"
	"github.com/capvend/capvend/vend"
)

// Config tunes the backend.
type Config struct {
	// Name names the connection: its payments are recorded under
	// vend.NWCBackend(Name) ("" is "nwc").
	Name string
	// Hold makes Request issue hold invoices when asked and the
	// connection may (make_hold_invoice, settle_hold_invoice,
	// cancel_hold_invoice).
	Hold bool
	// Grace is how long a wallet's plain invoice stays payable past
	// capvend's expiry (default 1 min): capvend stops waiting at its
	// expiry, and keeps watching for a late payment until the invoice
	// itself expires.
	Grace time.Duration
	// Sweep is how often payments past their expiry are looked up
	// (default 1 s).
	Sweep time.Duration
	// TailCheck is how often the newest open payments (at most
	// TailPayments of them) are looked up on a connection that is sent
	// the notifications (default 15 s): a notification the relay or the
	// wallet lost while the connection stayed up would otherwise leave a
	// paid invoice waiting for its expiry.
	TailCheck time.Duration
	// Log receives one line per payment change and reconnect; never
	// the URI's secret or a preimage.
	Log *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// TailPayments is how many of the newest open payments each
// Config.TailCheck looks up.
const TailPayments = 8

// The methods the backend needs from every connection; hold invoices need
// HoldMethods too.
var (
	NeededMethods = []string{MethodMakeInvoice, MethodLookupInvoice}
	HoldMethods   = []string{MethodMakeHoldInvoice, MethodSettleHoldInvoice, MethodCancelHoldInvoice}
)

// Backend is the NWC payment backend. It is safe for concurrent use.
type Backend struct {
	c    *Client
	led  vend.PaymentBook
	cfg  Config
	name vend.Backend

	ready atomic.Bool // connected, and the open invoices looked up on this connection

	// payer resolves the payouts this connection left in flight; nil
	// when the ledger keeps no payouts (not a Book).
	payer *Payer

	// applyMu serializes recording what the wallet says, so that a change
	// seen twice (a notification, a lookup, SettleHeld) is recorded and
	// reported once.
	applyMu sync.Mutex

	mu       sync.Mutex
	report   func(vend.PaymentEvent)
	running  bool
	late     map[string]time.Time // wallet invoices ended unpaid, payable at the wallet until then
	accepted map[string]vend.Msat // what a held HTLC brought, from hold_invoice_accepted
}

var (
	_ vend.PaymentBackend = (*Backend)(nil)
	_ vend.HoldSettler    = (*Backend)(nil)
	_ vend.Availability   = (*Backend)(nil)
)

// New returns the backend of the connection c, recording into led. It
// connects, if c has no session, to learn what the connection may do: an
// error wrapping ErrMethodNotGranted names a method the backend needs
// that the connection lacks. A wallet out of reach is no error: the
// backend starts unavailable (Available) and Run keeps connecting.
func New(ctx context.Context, c *Client, led vend.PaymentBook, cfg Config) (*Backend, error) {
	if cfg.Name != "" && !vend.ValidNWCName(cfg.Name) {
		return nil, fmt.Errorf("nwc: connection name %q: use lower-case letters, digits, '_' and '-'", cfg.Name)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = time.Minute
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = time.Second
	}
	if cfg.TailCheck <= 0 {
		cfg.TailCheck = 15 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &Backend{c: c, led: led, cfg: cfg, name: vend.NWCBackend(cfg.Name),
		late: map[string]time.Time{}, accepted: map[string]vend.Msat{}}
	if book, ok := led.(Book); ok {
		b.payer, _ = NewPayer(c, book, PayerConfig{Name: cfg.Name, Log: cfg.Log, Now: cfg.Now}) // the name was checked above
	}
	if c.Current() == nil {
		if _, err := c.Connect(ctx); err != nil {
			if !errors.Is(err, ErrUnreachable) && !errors.Is(err, ErrTimeout) {
				return nil, err
			}
			cfg.Log.Warn("nwc: the wallet is out of reach; connecting in the background", "backend", string(b.name), "err", err)
			return b, nil
		}
	}
	if err := Granted(c.Info(), NeededMethods...); err != nil {
		return nil, err
	}
	return b, nil
}

// Granted returns an error wrapping ErrMethodNotGranted naming the
// methods of need that info does not list, nil if it lists them all.
func Granted(info WalletInfo, need ...string) error {
	var missing []string
	for _, m := range need {
		if !info.Can(m) {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (grant it to the connection in the wallet)", ErrMethodNotGranted, strings.Join(missing, ", "))
	}
	return nil
}

// Backend implements vend.PaymentBackend.
func (b *Backend) Name() vend.Backend { return b.name }

// Client is the connection the backend uses.
func (b *Backend) Client() *Client { return b.c }

// CanHold implements vend.HoldSettler: Config.Hold, and the connection
// (as last connected) may make, settle and cancel hold invoices.
func (b *Backend) CanHold() bool {
	return b.cfg.Hold && Granted(b.c.Info(), HoldMethods...) == nil
}

// Available implements vend.Availability: the wallet is connected and
// its open invoices were looked up on this connection.
func (b *Backend) Available() bool { return b.ready.Load() && b.c.Current() != nil }

// Request implements vend.PaymentBackend. With r.Hold (and CanHold) it
// issues a hold invoice whose preimage capvend makes and keeps in the
// ledger; otherwise the wallet's plain invoice, payable Config.Grace past
// the expiry. ErrUnreachable while the wallet is out of reach.
func (b *Backend) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	if r.Amount <= 0 {
		return vend.Payment{}, fmt.Errorf("nwc: request of %d msat", r.Amount)
	}
	if b.c.Current() == nil {
		return vend.Payment{}, fmt.Errorf("%w: not connected", ErrUnreachable)
	}
	expiry := int64((r.Expiry + time.Second - 1) / time.Second)
	if expiry < 1 {
		expiry = 1
	}
	np := vend.NewPayment{Backend: b.name, Kind: vend.KindWalletInvoice, Amount: r.Amount,
		ExpiresAt: b.cfg.Now().Add(time.Duration(expiry) * time.Second)}
	var tx Transaction
	if r.Hold && b.CanHold() {
		pre := make([]byte, 32)
		if _, err := rand.Read(pre); err != nil {
			return vend.Payment{}, err
		}
		sum := sha256.Sum256(pre)
		np.Ref = hex.EncodeToString(sum[:])
		err := b.c.Do(ctx, MethodMakeHoldInvoice, map[string]any{"amount": int64(r.Amount), "description": r.Memo,
			"expiry": expiry, "payment_hash": np.Ref}, &tx)
		if err != nil {
			return vend.Payment{}, err
		}
		if !strings.EqualFold(tx.PaymentHash, np.Ref) {
			b.cancelHold(ctx, np.Ref)
			return vend.Payment{}, fmt.Errorf("nwc: make_hold_invoice: the wallet's invoice has another payment hash")
		}
		np.Kind, np.HoldPreimage = vend.KindHoldInvoice, pre
	} else {
		grace := int64(b.cfg.Grace / time.Second)
		if err := b.c.Do(ctx, MethodMakeInvoice, map[string]any{"amount": int64(r.Amount), "description": r.Memo,
			"expiry": expiry + grace}, &tx); err != nil {
			return vend.Payment{}, err
		}
		if !isHash(tx.PaymentHash) {
			return vend.Payment{}, fmt.Errorf("nwc: make_invoice: the wallet's answer has no payment hash")
		}
		np.Ref = strings.ToLower(tx.PaymentHash)
	}
	if tx.Invoice == "" {
		if np.Kind == vend.KindHoldInvoice {
			b.cancelHold(ctx, np.Ref)
		}
		return vend.Payment{}, fmt.Errorf("nwc: %s: the wallet's answer has no invoice", np.Kind)
	}
	np.Bolt11 = tx.Invoice
	p, err := b.led.RecordPayment(ctx, r.CallID, np)
	if err != nil {
		if np.Kind == vend.KindHoldInvoice { // withdraw what the client will never see
			b.cancelHold(ctx, np.Ref)
		}
		return vend.Payment{}, err
	}
	return p, nil
}

func (b *Backend) cancelHold(ctx context.Context, ref string) {
	err := b.c.Do(context.WithoutCancel(ctx), MethodCancelHoldInvoice, map[string]any{"payment_hash": ref}, nil)
	if err != nil {
		b.cfg.Log.Warn("nwc: could not cancel an unrecorded hold invoice; it will expire", "payment_hash", ref, "err", err)
	}
}

// Cancel implements vend.PaymentBackend. A hold invoice is canceled at
// the wallet (cancel_hold_invoice: a locked-in payment goes back); a
// wallet's plain invoice cannot be withdrawn: it is recorded canceled,
// and money that still arrives is booked and owed back.
func (b *Backend) Cancel(ctx context.Context, ref string) error {
	p, err := b.led.Payment(ctx, ref)
	if err != nil {
		return err
	}
	switch p.State {
	case vend.PaymentCanceled, vend.PaymentExpired:
		return nil
	case vend.PaymentSettled:
		return fmt.Errorf("%w: %s", ErrSettled, ref)
	}
	if p.Kind == vend.KindHoldInvoice {
		if err := b.c.Do(ctx, MethodCancelHoldInvoice, map[string]any{"payment_hash": ref}, nil); err != nil {
			// It may have been settled or canceled meanwhile: learn
			// what the wallet has.
			tx, lerr := b.lookup(ctx, ref)
			if lerr != nil {
				return fmt.Errorf("nwc: cancel hold invoice %s: %w", ref, err)
			}
			b.apply(ctx, tx)
			switch txState(tx) {
			case stateSettled:
				return fmt.Errorf("%w: %s", ErrSettled, ref)
			case stateEnded:
				return nil
			}
			return fmt.Errorf("nwc: cancel hold invoice %s: %w", ref, err)
		}
	} else {
		b.watchLate(ref, p.ExpiresAt.Add(b.cfg.Grace))
	}
	b.record(ctx, ref, func() (vend.Payment, error) {
		p, err := b.led.Payment(ctx, ref)
		if err != nil || paymentOver(p.State) {
			return p, errUnchanged
		}
		return b.led.EndPayment(ctx, ref, vend.PaymentCanceled, "canceled")
	})
	return nil
}

// SettleHeld implements vend.HoldSettler.
func (b *Backend) SettleHeld(ctx context.Context, ref string) (vend.Payment, error) {
	p, err := b.led.Payment(ctx, ref)
	if err != nil {
		return p, err
	}
	if p.State == vend.PaymentSettled {
		return p, nil
	}
	if p.Kind != vend.KindHoldInvoice || p.State != vend.PaymentAccepted {
		return p, &vend.TransitionError{What: "payment " + ref, From: string(p.State), To: string(vend.PaymentSettled)}
	}
	pre, err := b.led.HoldPreimage(ctx, ref)
	if err != nil {
		return p, err
	}
	if err := b.c.Do(ctx, MethodSettleHoldInvoice, map[string]any{"preimage": hex.EncodeToString(pre)}, nil); err != nil {
		// An answer lost, or a settle repeated: the wallet's state says.
		tx, lerr := b.lookup(ctx, ref)
		if lerr != nil || txState(tx) != stateSettled {
			return p, fmt.Errorf("nwc: settle hold invoice %s: %w", ref, err)
		}
		b.apply(ctx, tx)
		return b.led.Payment(ctx, ref)
	}
	b.mu.Lock()
	amount := b.accepted[ref]
	delete(b.accepted, ref)
	b.mu.Unlock()
	if amount < p.Amount {
		amount = p.Amount // the wallet accepted only what covers the invoice
	}
	b.record(vend.Urgent(ctx), ref, func() (vend.Payment, error) {
		return b.led.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: amount})
	})
	return b.led.Payment(ctx, ref)
}

// Run implements vend.PaymentBackend. It connects (again, with
// exponential backoff, 100 ms doubling to 10 s) whenever the wallet's
// relay connection breaks; on each connection it first looks up every
// unsettled payment, and only then takes the notifications, which were
// subscribed to before the lookups. It returns ctx's error when ctx ends.
func (b *Backend) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	b.mu.Lock()
	if b.running {
		b.mu.Unlock()
		return errors.New("nwc: Run is already running")
	}
	b.running, b.report = true, report
	b.mu.Unlock()
	defer func() {
		b.ready.Store(false)
		b.c.Close()
		b.mu.Lock()
		b.running = false
		b.mu.Unlock()
	}()
	policy := retry.Policy{
		Base:  100 * time.Millisecond,
		Max:   10 * time.Second,
		Reset: 30 * time.Second,
		Now:   b.cfg.Now,
		OnRetry: func(err error, _ int, wait time.Duration) {
			b.cfg.Log.Warn("nwc: wallet connection interrupted; reconnecting", "backend", string(b.name), "err", err, "in", wait)
		},
	}
	err := policy.Do(ctx, func(ctx context.Context) error { return b.runOnce(ctx) })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// runOnce uses the current session (connecting one if there is none):
// looks up the open invoices, then follows notifications and sweeps until
// the session ends or ctx does.
func (b *Backend) runOnce(ctx context.Context) error {
	s := b.c.Current()
	if s == nil {
		var err error
		if s, err = b.c.Connect(ctx); err != nil {
			return err
		}
	}
	defer b.ready.Store(false)
	if err := Granted(b.c.Info(), NeededMethods...); err != nil {
		b.cfg.Log.Error("nwc: the connection lacks what capvend needs", "backend", string(b.name), "err", err)
		s.Close()
		return err
	}
	if err := b.reconcile(ctx, false); err != nil {
		s.Close() // a fresh session next time
		return err
	}
	b.ready.Store(true)
	b.cfg.Log.Info("nwc: wallet connected", "backend", string(b.name), "encryption", string(s.Encryption()),
		"hold", b.CanHold(), "notifications", strings.Join(b.c.Info().Notifications, " "))
	payoutsLeft := b.resolvePayouts(ctx)
	nextPayouts := b.cfg.Now().Add(payoutRetry)
	poll := !b.c.Info().Notifies(NotePaymentReceived) || (b.CanHold() && !b.c.Info().Notifies(NoteHoldInvoiceAccepted))
	t := time.NewTicker(b.cfg.Sweep)
	defer t.Stop()
	nextTail := b.cfg.Now().Add(b.cfg.TailCheck)
	for {
		if payoutsLeft && !b.cfg.Now().Before(nextPayouts) {
			payoutsLeft, nextPayouts = b.resolvePayouts(ctx), b.cfg.Now().Add(payoutRetry)
		}
		notes, more := s.Notifications()
		for _, n := range notes {
			b.note(ctx, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.Done():
			return s.Err()
		case <-more:
		case <-t.C:
			err := b.reconcile(ctx, !poll)
			if err == nil && !poll && !b.cfg.Now().Before(nextTail) {
				err = b.lookUpNewest(ctx)
				nextTail = b.cfg.Now().Add(b.cfg.TailCheck)
			}
			if err != nil && !errors.Is(err, ErrTimeout) {
				s.Close()
				return err
			}
		}
	}
}

// resolvePayouts ends the payouts this connection left in flight (a
// payout command killed between the wallet paying and the booking, a
// payment pending), from lookup_invoice (payout.go), and reports whether
// any is left.
func (b *Backend) resolvePayouts(ctx context.Context) bool {
	if b.payer == nil {
		return false
	}
	ended, left, err := b.payer.Resolve(ctx)
	b.payer.logResolved(ended)
	if err != nil {
		b.cfg.Log.Warn("nwc: payouts left in flight not resolved yet; looked up again later", "backend", string(b.name), "payouts", left, "err", err)
	}
	return left > 0
}

// note applies one notification.
func (b *Backend) note(ctx context.Context, n Notification) {
	switch n.Type {
	case NotePaymentReceived:
		n.Tx.State = "settled"
	case NoteHoldInvoiceAccepted:
		n.Tx.State = "accepted"
	default:
		return
	}
	if n.Tx.Type != "" && n.Tx.Type != "incoming" {
		return
	}
	b.apply(ctx, n.Tx)
}

// reconcile looks up unsettled payments at the wallet (all of them, or
// with expiredOnly those past their expiry), and the wallet invoices still
// payable late, and records what changed.
func (b *Backend) reconcile(ctx context.Context, expiredOnly bool) error {
	ps, err := b.led.UnsettledPayments(ctx, b.name)
	if err != nil {
		return err
	}
	now := b.cfg.Now()
	refs := make([]string, 0, len(ps))
	for _, p := range ps {
		if !expiredOnly || !now.Before(p.ExpiresAt) {
			refs = append(refs, p.Ref)
		}
	}
	if !expiredOnly {
		refs = append(refs, b.lateRefs(now)...)
	}
	return b.lookUp(ctx, refs)
}

// lookUpNewest looks up the newest TailPayments open payments not past
// their expiry (the sweep looks up those) and records what changed.
func (b *Backend) lookUpNewest(ctx context.Context) error {
	ps, err := b.led.UnsettledPayments(ctx, b.name)
	if err != nil {
		return err
	}
	now := b.cfg.Now()
	ps = slices.DeleteFunc(ps, func(p vend.Payment) bool { return !now.Before(p.ExpiresAt) })
	slices.SortFunc(ps, func(a, b vend.Payment) int { return b.CreatedAt.Compare(a.CreatedAt) })
	refs := make([]string, 0, TailPayments)
	for _, p := range ps[:min(len(ps), TailPayments)] {
		refs = append(refs, p.Ref)
	}
	return b.lookUp(ctx, refs)
}

// lookUp asks the wallet for the invoices refs and records what changed.
func (b *Backend) lookUp(ctx context.Context, refs []string) error {
	for _, ref := range refs {
		tx, err := b.lookup(ctx, ref)
		if errors.Is(err, ErrNotFound) {
			b.record(ctx, ref, func() (vend.Payment, error) {
				p, err := b.led.Payment(ctx, ref)
				if err != nil || paymentOver(p.State) {
					return p, errUnchanged
				}
				return b.led.EndPayment(ctx, ref, vend.PaymentCanceled, "invoice not found at the wallet")
			})
			continue
		}
		if err != nil {
			return err
		}
		b.apply(ctx, tx)
	}
	return nil
}

func (b *Backend) lookup(ctx context.Context, ref string) (Transaction, error) {
	var tx Transaction
	err := b.c.Do(ctx, MethodLookupInvoice, map[string]any{"payment_hash": ref}, &tx)
	if err == nil && tx.PaymentHash == "" {
		tx.PaymentHash = ref
	}
	return tx, err
}

// The states of a transaction as the backend reads them.
const (
	stateOpen     = "open"
	stateAccepted = "accepted"
	stateSettled  = "settled"
	stateEnded    = "ended" // expired, failed or canceled at the wallet
)

// txState reads NIP-47's state, and settled_at of wallets that send no
// state.
func txState(tx Transaction) string {
	switch strings.ToLower(tx.State) {
	case "settled":
		return stateSettled
	case "accepted", "held":
		return stateAccepted
	case "expired", "failed", "canceled", "cancelled":
		return stateEnded
	case "":
		if tx.SettledAt > 0 {
			return stateSettled
		}
	}
	return stateOpen
}

// apply records what the wallet says of one invoice, if it is ours and
// changed.
func (b *Backend) apply(ctx context.Context, tx Transaction) {
	ref := strings.ToLower(tx.PaymentHash)
	if !isHash(ref) {
		return
	}
	switch txState(tx) {
	case stateSettled:
		ctx = vend.Urgent(ctx) // money arrived: its reads go first
		b.record(ctx, ref, func() (vend.Payment, error) {
			p, err := b.led.Payment(ctx, ref)
			if err != nil || p.Backend != b.name {
				return p, errUnchanged
			}
			amount := vend.Msat(tx.Amount)
			if amount <= 0 {
				amount = p.Amount
			}
			return b.led.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: amount})
		})
		b.dropLate(ref)
	case stateAccepted:
		ctx = vend.Urgent(ctx)
		b.record(ctx, ref, func() (vend.Payment, error) {
			p, err := b.led.Payment(ctx, ref)
			if err != nil || p.Backend != b.name || p.State != vend.PaymentOpen || p.Kind != vend.KindHoldInvoice {
				return p, errUnchanged
			}
			if tx.Amount > 0 {
				b.mu.Lock()
				b.accepted[ref] = vend.Msat(tx.Amount)
				b.mu.Unlock()
			}
			return b.led.AcceptPayment(ctx, ref)
		})
	case stateEnded:
		b.record(ctx, ref, func() (vend.Payment, error) {
			p, err := b.led.Payment(ctx, ref)
			if err != nil || p.Backend != b.name || paymentOver(p.State) {
				return p, errUnchanged
			}
			to, why := vend.PaymentCanceled, "canceled at the wallet"
			if !b.cfg.Now().Before(p.ExpiresAt) {
				to, why = vend.PaymentExpired, "invoice expired unpaid"
			}
			return b.led.EndPayment(ctx, ref, to, why)
		})
		b.dropLate(ref)
	default: // open
		b.expire(ctx, ref)
	}
}

// expire ends an open payment past its expiry: a hold invoice is canceled
// at the wallet first, so nothing is paid after capvend called it
// expired; a wallet invoice cannot be, and is watched for a late payment
// until it expires at the wallet.
func (b *Backend) expire(ctx context.Context, ref string) {
	p, err := b.led.Payment(ctx, ref)
	if err != nil || p.Backend != b.name || p.State != vend.PaymentOpen || b.cfg.Now().Before(p.ExpiresAt) {
		return
	}
	if p.Kind == vend.KindHoldInvoice {
		if err := b.c.Do(ctx, MethodCancelHoldInvoice, map[string]any{"payment_hash": ref}, nil); err != nil {
			return // the next sweep looks again
		}
	} else {
		b.watchLate(ref, p.ExpiresAt.Add(b.cfg.Grace))
	}
	b.record(ctx, ref, func() (vend.Payment, error) {
		p, err := b.led.Payment(ctx, ref)
		if err != nil || p.State != vend.PaymentOpen {
			return p, errUnchanged
		}
		return b.led.EndPayment(ctx, ref, vend.PaymentExpired, "invoice expired unpaid")
	})
}

// watchLate keeps a wallet invoice capvend ended looked up on reconnect
// until its deadline (its expiry at the wallet, and a minute).
func (b *Backend) watchLate(ref string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.late[ref] = until.Add(time.Minute)
}

func (b *Backend) dropLate(ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.late, ref)
}

func (b *Backend) lateRefs(now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for ref, until := range b.late {
		if now.After(until) {
			delete(b.late, ref)
			continue
		}
		out = append(out, ref)
	}
	return out
}

// paymentOver reports whether a payment in state s is over: neither payable
// nor held.
func paymentOver(s vend.PaymentState) bool {
	return s != vend.PaymentOpen && s != vend.PaymentAccepted
}

var errUnchanged = errors.New("unchanged")

// record runs one ledger change under applyMu and reports it if it
// happened. Changes already recorded (or of payments that are not this
// connection's) are skipped silently: the wallet may say a thing twice.
func (b *Backend) record(ctx context.Context, ref string, change func() (vend.Payment, error)) {
	b.applyMu.Lock()
	p, err := change()
	b.applyMu.Unlock()
	switch {
	case err == nil:
		b.cfg.Log.Info("nwc: payment "+string(p.State), "backend", string(b.name), "payment_hash", ref,
			"amount_msat", int64(p.Amount), "call", int64(p.CallID))
		b.mu.Lock()
		report := b.report
		b.mu.Unlock()
		if report != nil {
			report(vend.PaymentEvent{Payment: p})
		}
	case errors.Is(err, vend.ErrAlreadySettled), errors.Is(err, errUnchanged), errors.Is(err, vend.ErrNotFound):
	case ctx.Err() != nil:
	default:
		b.cfg.Log.Error("nwc: recording a payment change failed", "backend", string(b.name), "payment_hash", ref, "err", err)
	}
}

func isHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// Connected reports whether the wallet is connected and its open
// invoices looked up: capvend's readiness (/readyz) asks it.
func (b *Backend) Connected() bool { return b.Available() }
