// Package lnd is capvend's Lightning payment backend on an LND node
// (lnrpc v0.20.2-beta): plain invoices, and hold invoices that are settled
// only after the tool succeeded and canceled (returning the client's money)
// when it failed. It needs nothing beyond LND's invoice macaroon. It
// implements vend.PaymentBackend (and reconcile's LND) for internal/cli to
// wire; docs/OPERATING.md, "Connecting to a real LND node", sets it up.
//
// # Watching payments
//
// Settlements are learned from SubscribeInvoices, resumed from the settle
// index stored in the ledger, so a settlement that happened while capvend was
// down is found at start (with no index stored yet LND replays nothing, so
// unsettled plain invoices are also looked up until the stream shows that
// LND registered it); hold invoices are watched one by one with
// SubscribeSingleInvoice (LND's all-invoices stream reports only additions
// and settlements: lnd v0.20.2's invoice registry dispatches neither
// ACCEPTED nor CANCELED to it, for backwards compatibility); and anything
// still unsettled past its expiry is looked up invoice by invoice (the
// reconcile sweep, which also restarts a hold invoice's watcher whose
// stream broke). Every change is recorded in the ledger exactly once, then
// reported.
//
// # Skipped settlements
//
// LND's all-invoices stream can skip a settlement: lnd v0.20.2's invoice
// registry hands each event to its subscribers one by one and stops at
// the first whose stream is being closed, so every subscriber after it
// (in map order) never gets that event. Any application leaving the node
// at that moment (another capvend, a wallet, a reconnect) can cause it.
// LND numbers the node's settlements 1, 2, 3, ... over all its invoices,
// so the backend knows the settle index up to which it saw every one; a
// settlement arriving past the next one shows a gap, and the backend
// subscribes again from that index: LND replays the settlements after it
// from its database, the skipped one included. The stored cursor never
// passes a settlement the stream skipped (a restart replays it too). A
// skipped settlement with none after it shows no gap: every
// Config.TailCheck the newest TailInvoices unsettled plain invoices are
// looked up (at worst, under a flood of newer unpaid invoices, it waits
// for the next settlement on the node or its expiry's sweep). Hold
// invoices are watched one by one, a stream LND does not stop early.
//
// # Bounds
//
// At most Config.MaxHold hold invoices are open at once (issued and not
// yet settled or canceled), so at most that many SubscribeSingleInvoice
// streams (and goroutines) run. Beyond it Request issues a plain invoice
// instead, followed by the one SubscribeInvoices stream: the call is
// served the same, but if it fails after payment its refund is owed
// (liabilities:refunds) rather than returned by Lightning. vend's unpaid
// limits withdraw the oldest unpaid quotes before this bound is reached
// with the default settings.
//
// An unpaid invoice capvend cancels (withdrawn, or past its expiry) or
// finds canceled by LND's own expiry is then deleted from LND with
// DeleteCanceledInvoice, so an invoice flood leaves nothing there. New
// probes that the macaroon allows it (invoices:write, as for canceling:
// LND's invoice.macaroon does); if not, it logs once and canceled invoices
// stay at LND. A hold invoice canceled after its payment was locked in (a
// refund) is kept.
package lnd

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

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capvend/capvend/internal/retry"
	"github.com/capvend/capvend/vend"
)

// Lightning is the part of lnrpc.LightningClient the backend calls.
type Lightning interface {
	AddInvoice(ctx context.Context, in *lnrpc.Invoice, opts ...grpc.CallOption) (*lnrpc.AddInvoiceResponse, error)
	LookupInvoice(ctx context.Context, in *lnrpc.PaymentHash, opts ...grpc.CallOption) (*lnrpc.Invoice, error)
	SubscribeInvoices(ctx context.Context, in *lnrpc.InvoiceSubscription, opts ...grpc.CallOption) (lnrpc.Lightning_SubscribeInvoicesClient, error)
	DeleteCanceledInvoice(ctx context.Context, in *lnrpc.DelCanceledInvoiceReq, opts ...grpc.CallOption) (*lnrpc.DelCanceledInvoiceResp, error)
}

// Invoices is the part of invoicesrpc.InvoicesClient the backend calls.
type Invoices interface {
	AddHoldInvoice(ctx context.Context, in *invoicesrpc.AddHoldInvoiceRequest, opts ...grpc.CallOption) (*invoicesrpc.AddHoldInvoiceResp, error)
	SettleInvoice(ctx context.Context, in *invoicesrpc.SettleInvoiceMsg, opts ...grpc.CallOption) (*invoicesrpc.SettleInvoiceResp, error)
	CancelInvoice(ctx context.Context, in *invoicesrpc.CancelInvoiceMsg, opts ...grpc.CallOption) (*invoicesrpc.CancelInvoiceResp, error)
	SubscribeSingleInvoice(ctx context.Context, in *invoicesrpc.SubscribeSingleInvoiceRequest, opts ...grpc.CallOption) (invoicesrpc.Invoices_SubscribeSingleInvoiceClient, error)
}

// Ledger is what the backend records into: payments (vend's PaymentBook)
// and where the invoice subscription resumes. *ledger.Ledger implements
// it.
type Ledger interface {
	vend.PaymentBook
	LNDCursor(ctx context.Context, node string) (addIndex, settleIndex uint64, err error)
	SaveLNDCursor(ctx context.Context, node string, addIndex, settleIndex uint64) error
}

// Config tunes the backend.
type Config struct {
	// Node names the LND node in the ledger's cursor table (default
	// "lnd"). One ledger may watch several nodes under different names.
	Node string
	// Hold makes Request issue hold invoices when asked (and invoicesrpc
	// is available). Default on: see New.
	Hold bool
	// MaxHold bounds the open hold invoices, and so the
	// SubscribeSingleInvoice streams (see Bounds in the package doc);
	// beyond it Request issues plain invoices. 0: DefaultMaxHold.
	MaxHold int
	// Sweep is how often unsettled payments past their expiry are looked
	// up one by one (default 1 s).
	Sweep time.Duration
	// TailCheck is how often the newest unsettled plain invoices (at most
	// TailInvoices of them) are looked up at LND (default 10 s): LND's
	// stream can skip a settlement (see "Skipped settlements" in the
	// package doc), and one with no settlement on the node after it
	// shows no gap.
	TailCheck time.Duration
	// Log receives one line per settlement, expiry and reconnect; never
	// preimages.
	Log *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Mark keys the mark of every preimage the backend makes (see Mark):
	// the ledger's identity. Empty: unmarked random preimages, which a
	// restored ledger cannot recognize.
	Mark Mark
}

// DefaultMaxHold is Config.MaxHold's default.
const DefaultMaxHold = 1_000

// TailInvoices is how many of the newest unsettled plain invoices each
// Config.TailCheck looks up.
const TailInvoices = 32

// Errors.
var (
	// ErrPermission: the macaroon lacks a permission the backend needs.
	ErrPermission = errors.New("lnd: macaroon permission missing")
	// ErrSettled: the payment is settled and cannot be canceled.
	ErrSettled = errors.New("lnd: payment already settled")
)

// Backend is the LND payment backend. It is safe for concurrent use.
type Backend struct {
	ln        Lightning
	inv       Invoices
	led       Ledger
	cfg       Config
	canHold   bool
	canDelete bool        // the macaroon allows DeleteCanceledInvoice
	connected atomic.Bool // see Connected

	// applyMu serializes recording what LND reports, so a change seen by
	// two watchers (the stream, a hold watcher, a sweep, SettleHeld) is
	// recorded and reported once.
	applyMu sync.Mutex

	mu       sync.Mutex
	report   func(vend.PaymentEvent)
	watchCtx context.Context       // the running Run's context, nil when not running
	watching map[string]*holdWatch // hold invoices with a live SubscribeSingleInvoice
	holds    map[string]time.Time  // open hold invoices (when recorded; zero while being issued): at most cfg.MaxHold new ones
	wg       sync.WaitGroup
}

var (
	_ vend.PaymentBackend = (*Backend)(nil)
	_ vend.HoldSettler    = (*Backend)(nil)
)

// New checks that the macaroon allows what the backend needs (reading and
// writing invoices) with side-effect-free calls, and returns the backend.
// It returns an error wrapping ErrPermission naming the missing permission,
// or a connection error. Hold invoices are used when cfg.Hold is set and
// the node serves invoicesrpc.
func New(ctx context.Context, ln Lightning, inv Invoices, led Ledger, cfg Config) (*Backend, error) {
	if cfg.Node == "" {
		cfg.Node = "lnd"
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = time.Second
	}
	if cfg.TailCheck <= 0 {
		cfg.TailCheck = 10 * time.Second
	}
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = DefaultMaxHold
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &Backend{ln: ln, inv: inv, led: led, cfg: cfg, watching: map[string]*holdWatch{}, holds: map[string]time.Time{}}
	probe := make([]byte, 32)
	rand.Read(probe)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: probe})
	if err := permission(err, "invoices:read", "look up and watch invoices"); err != nil {
		return nil, err
	}
	_, err = inv.CancelInvoice(ctx, &invoicesrpc.CancelInvoiceMsg{PaymentHash: probe})
	switch {
	case status.Code(err) == codes.Unimplemented:
		b.canHold = false // lnd built without invoicesrpc
		cfg.Log.Warn("lnd has no invoicesrpc: no hold invoices, and unpaid invoices are left to expire at LND")
	default:
		if err := permission(err, "invoices:write", "create, settle and cancel invoices"); err != nil {
			return nil, err
		}
		b.canHold = cfg.Hold
	}
	_, err = ln.DeleteCanceledInvoice(ctx, &lnrpc.DelCanceledInvoiceReq{InvoiceHash: hex.EncodeToString(probe)})
	switch perr := permission(err, "invoices:write", "delete canceled invoices"); {
	case perr == nil:
		b.canDelete = true
	case errors.Is(perr, ErrPermission):
		cfg.Log.Warn("lnd: the macaroon does not allow DeleteCanceledInvoice: canceled unpaid invoices stay at LND")
	default:
		cfg.Log.Warn("lnd: DeleteCanceledInvoice unavailable: canceled unpaid invoices stay at LND", "err", perr)
	}
	return b, nil
}

// Connected reports whether the invoice stream is open and the unsettled
// payments were reconciled on it: payments made now are seen.
func (b *Backend) Connected() bool { return b.connected.Load() }

// deleteCanceled deletes a canceled unpaid invoice from LND, where the
// macaroon allows it. Failures are logged at debug level: the invoice
// just stays at LND.
func (b *Backend) deleteCanceled(ctx context.Context, hash []byte) {
	if !b.canDelete {
		return
	}
	_, err := b.ln.DeleteCanceledInvoice(context.WithoutCancel(ctx), &lnrpc.DelCanceledInvoiceReq{InvoiceHash: hex.EncodeToString(hash)})
	if err != nil && !isNotFound(err) {
		b.cfg.Log.Debug("lnd: could not delete a canceled invoice", "payment_hash", hex.EncodeToString(hash), "err", rpcError(err))
	}
}

// permission maps a probe's error: "not found" is what a permitted probe of
// a random hash gets; "permission denied" names the missing permission;
// anything else is a connection or server error.
func permission(err error, perm, why string) error {
	if err == nil || isNotFound(err) {
		return nil
	}
	msg := strings.ToLower(status.Convert(err).Message())
	switch {
	case strings.Contains(msg, "permission denied") || strings.Contains(msg, "verification failed"):
		return fmt.Errorf("%w: the macaroon lacks %s (needed to %s); use LND's invoice.macaroon or bake one with invoices:read and invoices:write",
			ErrPermission, perm, why)
	}
	return fmt.Errorf("lnd: %w", err)
}

// Backend implements vend.PaymentBackend.
func (b *Backend) Name() vend.Backend { return vend.BackendLND }

// CanHold implements vend.HoldSettler.
func (b *Backend) CanHold() bool { return b.canHold }

// Request implements vend.PaymentBackend. With r.Hold (and CanHold) it
// issues a hold invoice whose preimage capvend keeps in the ledger. The
// preimage of every invoice, plain or hold, is capvend's, marked under
// Config.Mark.
func (b *Backend) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	if r.Amount <= 0 {
		return vend.Payment{}, fmt.Errorf("lnd: request of %d msat", r.Amount)
	}
	expiry := int64((r.Expiry + time.Second - 1) / time.Second)
	if expiry < 1 {
		expiry = 1
	}
	np := vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Amount: r.Amount,
		ExpiresAt: b.cfg.Now().Add(time.Duration(expiry) * time.Second)}
	var hash []byte
	pre, err := b.cfg.Mark.NewPreimage()
	if err != nil {
		return vend.Payment{}, err
	}
	sum := sha256.Sum256(pre)
	if r.Hold && b.canHold && b.takeHold(hex.EncodeToString(sum[:])) {
		hash = sum[:]
		resp, err := b.inv.AddHoldInvoice(ctx, &invoicesrpc.AddHoldInvoiceRequest{
			Memo: r.Memo, Hash: hash, ValueMsat: int64(r.Amount), Expiry: expiry,
		})
		if err != nil {
			b.dropHold(hex.EncodeToString(hash))
			return vend.Payment{}, fmt.Errorf("lnd: add hold invoice: %w", rpcError(err))
		}
		np.Kind, np.Bolt11, np.HoldPreimage = vend.KindHoldInvoice, resp.PaymentRequest, pre
	} else {
		resp, err := b.ln.AddInvoice(ctx, &lnrpc.Invoice{Memo: r.Memo, RPreimage: pre, ValueMsat: int64(r.Amount), Expiry: expiry})
		if err != nil {
			return vend.Payment{}, fmt.Errorf("lnd: add invoice: %w", rpcError(err))
		}
		hash, np.Bolt11 = resp.RHash, resp.PaymentRequest
	}
	np.Ref = hex.EncodeToString(hash)
	p, err := b.led.RecordPayment(ctx, r.CallID, np)
	if err != nil {
		// Withdraw the invoice the client will never see.
		if _, cerr := b.inv.CancelInvoice(context.WithoutCancel(ctx), &invoicesrpc.CancelInvoiceMsg{PaymentHash: hash}); cerr != nil {
			b.cfg.Log.Warn("lnd: could not cancel an unrecorded invoice; it will expire", "payment_hash", np.Ref, "err", cerr)
		} else {
			b.deleteCanceled(ctx, hash)
		}
		b.dropHold(np.Ref)
		return vend.Payment{}, err
	}
	if np.Kind == vend.KindHoldInvoice {
		b.heldHold(np.Ref)
	}
	if p.Kind == vend.KindHoldInvoice {
		b.watchHold(p.Ref)
	}
	return p, nil
}

// Cancel implements vend.PaymentBackend.
func (b *Backend) Cancel(ctx context.Context, ref string) error {
	p, err := b.led.Payment(ctx, ref)
	if err != nil {
		return err
	}
	switch p.State {
	case vend.PaymentCanceled, vend.PaymentExpired:
		b.endWatch(ref) // ended elsewhere
		return nil
	case vend.PaymentSettled:
		return fmt.Errorf("%w: %s", ErrSettled, ref)
	}
	hash, err := hex.DecodeString(ref)
	if err != nil {
		return fmt.Errorf("lnd: payment %s: bad hash", ref)
	}
	if _, err := b.inv.CancelInvoice(ctx, &invoicesrpc.CancelInvoiceMsg{PaymentHash: hash}); err != nil {
		// It may have been settled meanwhile: learn what LND has.
		if inv, lerr := b.ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash}); lerr == nil {
			b.apply(ctx, inv)
			if inv.State == lnrpc.Invoice_SETTLED {
				return fmt.Errorf("%w: %s", ErrSettled, ref)
			}
			if inv.State == lnrpc.Invoice_CANCELED {
				return nil
			}
		}
		return fmt.Errorf("lnd: cancel invoice %s: %w", ref, rpcError(err))
	}
	b.record(ctx, ref, func() (vend.Payment, error) {
		p, err := b.led.Payment(ctx, ref)
		if err != nil || paymentOver(p.State) {
			return p, errUnchanged // a watcher saw the cancel first
		}
		return b.led.EndPayment(ctx, ref, vend.PaymentCanceled, "canceled")
	})
	if p.State == vend.PaymentOpen { // unpaid: nothing to keep at LND
		b.deleteCanceled(ctx, hash)
	}
	return nil
}

// Run implements vend.PaymentBackend. It reconnects with exponential
// backoff (100 ms doubling to 10 s, each wait jittered to between half and
// all of its step; back to 100 ms after a connection that lasted 30 s) when
// the connection or a stream breaks, and reconciles every unsettled payment
// each time it (re)connects. It returns ctx's error when ctx ends.
func (b *Backend) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	b.mu.Lock()
	if b.watchCtx != nil {
		b.mu.Unlock()
		return errors.New("lnd: Run is already running")
	}
	b.report, b.watchCtx = report, ctx
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.watchCtx = nil
		b.mu.Unlock()
		b.wg.Wait()
	}()
	policy := retry.Policy{
		Base:  100 * time.Millisecond,
		Max:   10 * time.Second,
		Reset: 30 * time.Second, // it worked for a while
		Now:   b.cfg.Now,
		OnRetry: func(err error, _ int, wait time.Duration) {
			b.cfg.Log.Warn("lnd: invoice watch interrupted; reconnecting", "err", err, "in", wait)
		},
	}
	err := policy.Do(ctx, func(ctx context.Context) error {
		if err := b.runOnce(ctx); err != nil {
			return err
		}
		return errStreamEnded
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err // not reached: nothing but ctx stops this policy
}

// errStreamEnded: runOnce returned without an error (it does not today;
// Run reconnects all the same).
var errStreamEnded = errors.New("lnd: invoice stream ended")

// runOnce reconciles, then follows the settlement stream and sweeps expired
// payments until the stream breaks or ctx ends.
func (b *Backend) runOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, settleIndex, err := b.led.LNDCursor(ctx, b.cfg.Node)
	if err != nil {
		return err
	}
	// Subscribe first, then reconcile: a settlement between the two is
	// seen by both, and recorded once.
	sctx, stopStream := context.WithCancel(ctx)
	stream, err := b.ln.SubscribeInvoices(sctx, &lnrpc.InvoiceSubscription{SettleIndex: settleIndex})
	if err != nil {
		stopStream()
		return rpcError(err)
	}
	defer func() { stopStream() }()
	if err := b.reconcile(ctx, false); err != nil {
		return err
	}
	b.connected.Store(true) // until this stream breaks
	defer b.connected.Store(false)
	// LND registers the stream only after SubscribeInvoices returned and,
	// from settle index 0, replays nothing (its InvoicesSettledSince
	// ignores 0): a plain invoice settled between the reconcile above and
	// the registration is on no stream, and would wait for its expiry's
	// sweep. LND sends nothing on a stream before registering it, so
	// bookSettled runs on each sweep until the first message arrives,
	// and once more on it. From a stored settle index LND replays all
	// settled after it: no gap at the start.
	var registered atomic.Bool
	registered.Store(settleIndex > 0)
	errs := make(chan error, 1)
	var sweeper sync.WaitGroup
	defer sweeper.Wait()
	defer cancel()
	sweeper.Add(1)
	go func() {
		defer sweeper.Done()
		t := time.NewTicker(b.cfg.Sweep)
		defer t.Stop()
		nextTail := b.cfg.Now().Add(b.cfg.TailCheck)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				err := b.reconcile(ctx, true)
				switch {
				case err != nil:
				case !registered.Load():
					err = b.bookSettled(ctx, 0)
				case !b.cfg.Now().Before(nextTail):
					err = b.bookSettled(ctx, TailInvoices)
					nextTail = b.cfg.Now().Add(b.cfg.TailCheck)
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					cancel()
					return
				}
			}
		}
	}()
	// seen is the settle index up to which the stream delivered every
	// settlement (LND numbers the node's settlements 1, 2, 3, ...): the
	// cursor stored, never past one skipped. 0: none seen yet.
	seen := settleIndex
	// replayedTo: the stream was subscribed again from seen after a gap
	// up to this index; LND replays the settlements up to it from its
	// database, so an index the replay passes over is no plain
	// settlement (an AMP payment's, which this stream shows as none):
	// not a gap again.
	var replayedTo uint64
	for {
		inv, err := stream.Recv()
		if err != nil {
			select {
			case serr := <-errs:
				return serr
			default:
			}
			return rpcError(err)
		}
		first := !registered.Swap(true)
		if first {
			if err := b.bookSettled(ctx, 0); err != nil {
				return err
			}
		}
		if inv.State != lnrpc.Invoice_SETTLED {
			continue // additions: we made them
		}
		b.apply(ctx, inv)
		switch {
		case seen == 0:
			// The first settlement on a stream from index 0: those
			// before it are on no stream; bookSettled finds ours (it
			// just did if this is the stream's first message).
			if !first {
				if err := b.bookSettled(ctx, 0); err != nil {
					return err
				}
			}
		case inv.SettleIndex <= seen:
			continue // replayed, recorded once
		case inv.SettleIndex <= replayedTo:
		case inv.SettleIndex > seen+1:
			// Skipped settlements (see "Skipped settlements" in the
			// package doc): subscribe again from seen, so LND replays
			// them from its database, and drop this stream. The new one
			// is registered before LND reads what to replay: nothing
			// falls between the two.
			b.cfg.Log.Warn("lnd: the invoice stream skipped settlements; LND replays them", "after_settle_index", seen,
				"got_settle_index", inv.SettleIndex)
			rctx, stop := context.WithCancel(ctx)
			again, err := b.ln.SubscribeInvoices(rctx, &lnrpc.InvoiceSubscription{SettleIndex: seen})
			if err != nil {
				stop()
				return rpcError(err)
			}
			stopStream()
			stream, stopStream, replayedTo = again, stop, inv.SettleIndex
			continue
		}
		seen = inv.SettleIndex
		if err := b.led.SaveLNDCursor(ctx, b.cfg.Node, 0, seen); err != nil {
			return err
		}
	}
}

// reconcile looks up unsettled payments at LND (all of them, or with
// expiredOnly those past their expiry) and records what changed; it makes
// sure every unsettled hold invoice has a watcher.
func (b *Backend) reconcile(ctx context.Context, expiredOnly bool) error {
	asked := time.Now()
	ps, err := b.led.UnsettledPayments(ctx, vend.BackendLND)
	if err != nil {
		return err
	}
	b.countHolds(ps, asked)
	now := b.cfg.Now()
	for _, p := range ps {
		if p.Kind == vend.KindHoldInvoice {
			b.watchHold(p.Ref)
		}
		if expiredOnly && now.Before(p.ExpiresAt) {
			continue
		}
		hash, err := hex.DecodeString(p.Ref)
		if err != nil {
			continue
		}
		inv, err := b.ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash})
		if err != nil {
			if isNotFound(err) { // not at LND: it never reached the client
				b.record(ctx, p.Ref, func() (vend.Payment, error) {
					return b.led.EndPayment(ctx, p.Ref, vend.PaymentCanceled, "invoice not found at LND")
				})
				continue
			}
			return rpcError(err)
		}
		if inv.State == lnrpc.Invoice_OPEN && !now.Before(p.ExpiresAt) {
			// Past its expiry and still payable at LND (its own
			// expiry watcher has not run yet): withdraw it first, so
			// no payment can arrive after we call it expired.
			if _, err := b.inv.CancelInvoice(ctx, &invoicesrpc.CancelInvoiceMsg{PaymentHash: hash}); err != nil {
				if inv, err = b.ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash}); err != nil {
					return rpcError(err)
				}
			} else {
				inv.State = lnrpc.Invoice_CANCELED
			}
		}
		b.apply(ctx, inv)
	}
	return nil
}

// bookSettled looks up the unsettled plain invoices (the newest newest of
// them; 0: all) and records those LND reports settled, and nothing else: a
// cancel made at LND behind capvend's back is the reconciler's to report
// as a difference. Hold invoices need no look-up: their watcher's stream
// starts with their current state. Recording is idempotent, so one the
// stream also reports is booked once.
func (b *Backend) bookSettled(ctx context.Context, newest int) error {
	ps, err := b.led.UnsettledPayments(ctx, vend.BackendLND)
	if err != nil {
		return err
	}
	ps = slices.DeleteFunc(ps, func(p vend.Payment) bool { return p.Kind != vend.KindInvoice })
	if newest > 0 && len(ps) > newest {
		slices.SortFunc(ps, func(a, b vend.Payment) int { return b.CreatedAt.Compare(a.CreatedAt) })
		ps = ps[:newest]
	}
	for _, p := range ps {
		hash, err := hex.DecodeString(p.Ref)
		if err != nil {
			continue
		}
		inv, err := b.ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash})
		switch {
		case err != nil && isNotFound(err):
		case err != nil:
			return rpcError(err)
		case inv.State == lnrpc.Invoice_SETTLED:
			b.apply(ctx, inv)
		}
	}
	return nil
}

// holdWatch is one hold invoice's SubscribeSingleInvoice watch.
type holdWatch struct{ cancel context.CancelFunc }

// paymentOver reports whether a payment in state s is over: neither payable
// nor held.
func paymentOver(s vend.PaymentState) bool {
	return s != vend.PaymentOpen && s != vend.PaymentAccepted
}

// apply records what LND says of one invoice, if it is ours and changed.
func (b *Backend) apply(ctx context.Context, inv *lnrpc.Invoice) {
	ref := hex.EncodeToString(inv.RHash)
	var unpaid bool // canceled while open: delete it from LND
	if inv.State == lnrpc.Invoice_SETTLED || inv.State == lnrpc.Invoice_ACCEPTED {
		ctx = vend.Urgent(ctx) // money arrived: its reads go first
	}
	switch inv.State {
	case lnrpc.Invoice_SETTLED:
		b.record(ctx, ref, func() (vend.Payment, error) {
			return b.led.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: vend.Msat(inv.AmtPaidMsat),
				AddIndex: inv.AddIndex, SettleIndex: inv.SettleIndex})
		})
	case lnrpc.Invoice_ACCEPTED:
		b.record(ctx, ref, func() (vend.Payment, error) {
			p, err := b.led.Payment(ctx, ref)
			if err != nil || p.State != vend.PaymentOpen {
				return p, errUnchanged
			}
			return b.led.AcceptPayment(ctx, ref)
		})
	case lnrpc.Invoice_CANCELED:
		b.record(ctx, ref, func() (vend.Payment, error) {
			p, err := b.led.Payment(ctx, ref)
			if err != nil || paymentOver(p.State) {
				return p, errUnchanged
			}
			to, why := vend.PaymentCanceled, "canceled at LND"
			if !b.cfg.Now().Before(p.ExpiresAt) {
				to, why = vend.PaymentExpired, "invoice expired unpaid"
			}
			unpaid = p.State == vend.PaymentOpen
			return b.led.EndPayment(ctx, ref, to, why)
		})
		if unpaid {
			b.deleteCanceled(ctx, inv.RHash)
		}
	}
}

var errUnchanged = errors.New("unchanged")

// endedMeanwhile says whether the ledger has payment ref in an end state.
func (b *Backend) endedMeanwhile(ctx context.Context, ref string) bool {
	p, err := b.led.Payment(ctx, ref)
	return err == nil && paymentOver(p.State)
}

// record runs one ledger change under applyMu and reports it if it
// happened. Changes already recorded (or of payments that are not ours)
// are silently skipped: LND reports some changes more than once. A
// payment whose end is in the ledger, recorded now or before (by a
// watcher, a reconcile, another instance), has its hold watch ended.
func (b *Backend) record(ctx context.Context, ref string, change func() (vend.Payment, error)) {
	b.applyMu.Lock()
	p, err := change()
	b.applyMu.Unlock()
	switch {
	case err == nil:
		if paymentOver(p.State) {
			b.dropHold(ref)
			b.endWatch(ref)
		}
		b.cfg.Log.Info("lnd: payment "+string(p.State), "payment_hash", ref, "amount_msat", int64(p.Amount), "call", int64(p.CallID))
		b.mu.Lock()
		report := b.report
		b.mu.Unlock()
		if report != nil {
			report(vend.PaymentEvent{Payment: p})
		}
	case errors.Is(err, vend.ErrAlreadySettled), errors.Is(err, errUnchanged) && p.State != "" && paymentOver(p.State):
		b.endWatch(ref)
	case errors.Is(err, vend.ErrIllegalTransition) && b.endedMeanwhile(ctx, ref):
		// Another writer ended the payment between change's read and its
		// write (vend expiring a quote as LND reports it canceled): what
		// LND said is already recorded, in other words.
		b.cfg.Log.Debug("lnd: payment already ended", "payment_hash", ref, "err", err)
		b.endWatch(ref)
	case errors.Is(err, errUnchanged), errors.Is(err, vend.ErrNotFound):
	case ctx.Err() != nil:
	default:
		b.cfg.Log.Error("lnd: recording a payment change failed", "payment_hash", ref, "err", err)
	}
}

// isNotFound reports whether LND answered that it has no such invoice.
func isNotFound(err error) bool {
	msg := strings.ToLower(status.Convert(err).Message())
	return status.Code(err) == codes.NotFound || strings.Contains(msg, "unable to locate invoice") ||
		strings.Contains(msg, "there are no existing invoices") || strings.Contains(msg, "invoice not found")
}

// rpcError turns a gRPC status into a plain error with LND's message.
func rpcError(err error) error {
	if s, ok := status.FromError(err); ok {
		if s.Code() == codes.Unavailable {
			return fmt.Errorf("LND unreachable: %s", s.Message())
		}
		return errors.New(s.Message())
	}
	return err
}
