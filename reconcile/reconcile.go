// Package reconcile compares what capvend's payment backends hold with its
// ledger: every LND invoice capvend created since a stored add index, every
// invoice an NWC connection made (its list_transactions, by creation
// time), the Cashu wallet's unspent ecash per mint against
// assets:cashu:<mint>, and open mint quotes against the mint's word. An
// NWC connection's differences are those of LND, named by its backend
// ("nwc", "nwc:<name>"). It owns the small interfaces it uses (LND, NWC,
// Wallet, Store); billing/lnd, billing/nwc, billing/cashu and ledger
// implement them, and cmd wires them. docs/OPERATING.md, Reconciliation,
// is the operator's view.
//
// # Differences and repairs
//
// A difference is a WARN log line with its ids, a row in the ledger the
// operator lists (capvend reconcile), and a count by kind for the metrics
// (Config.Observe). Where it is safe, a difference is repaired:
//
//   - settled_unbooked (LND settled an invoice the ledger does not have
//     settled): the late settlement is booked (Store.RepairSettlement), and
//     reported (Config.Report) so vend runs the paid call; one of an
//     invoice capvend made that no payment names (a ledger restored from
//     its replica lost its quote; Config.OwnsPreimage) is booked to
//     liabilities:unattributed (Store.RepairLost), and no call runs;
//   - canceled_unbooked (LND canceled an invoice the ledger holds open or
//     accepted, e.g. canceled behind capvend's back): the payment is ended,
//     and a paid call that never started is refunded (Store.RepairCanceled);
//   - orphan_hold (a hold invoice locked in at LND whose call will never
//     settle it: the call ended, or the ledger ended the payment): the
//     invoice is canceled at LND, returning the money, and the ledger
//     records it (Store.RepairCanceled).
//
// A repair is one ledger transaction through the ledger's own state
// machines and claims, together with its difference row, whose repair
// text starts with "reconcile": of the reconciler and a backend's watcher
// recording the same change at the same moment, the ledger's claim lets
// exactly one through, and the other sees it done (not a difference).
// booked_unsettled, cashu_balance and mint_quote are never repaired
// automatically: they need the operator.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"time"

	"github.com/capvend/capvend/vend"
)

// Kind is what sort of difference was found. The set is fixed (Kinds), so a
// metric labeled by kind stays bounded.
type Kind string

// The kinds of difference.
const (
	// SettledUnbooked: LND settled the invoice; the ledger has it open,
	// accepted, canceled or expired. Repaired: the settlement is booked.
	SettledUnbooked Kind = "settled_unbooked"
	// BookedUnsettled: the ledger has the invoice settled; LND does not.
	BookedUnsettled Kind = "booked_unsettled"
	// CanceledUnbooked: LND canceled the invoice; the ledger holds it open
	// or accepted. Repaired: the payment is ended (its call refunded if it
	// was paid and never started).
	CanceledUnbooked Kind = "canceled_unbooked"
	// OrphanHold: a hold invoice is locked in at LND, but its call will
	// never settle it. Repaired: canceled at LND.
	OrphanHold Kind = "orphan_hold"
	// CashuBalance: the wallet's unspent ecash at a mint (as the mint
	// says, NUT-07) differs from the ledger's assets:cashu:<mint>.
	CashuBalance Kind = "cashu_balance"
	// MintQuote: an open mint quote of the ledger is paid, issued or
	// unknown at its mint.
	MintQuote Kind = "mint_quote"
)

// Kinds lists every Kind, in a fixed order.
func Kinds() []Kind {
	return []Kind{SettledUnbooked, BookedUnsettled, CanceledUnbooked, OrphanHold, CashuBalance, MintQuote}
}

// RepairPrefix starts the repair text of every difference the reconciler
// repaired, and the reason it records with the state changes it makes.
const RepairPrefix = "reconcile"

// Difference is one disagreement between a backend and the ledger.
type Difference struct {
	ID      int64 // set by the Store
	Run     int64 // the run that found it
	Kind    Kind
	Backend vend.Backend
	Ref     string      // payment hash, quote id; "" for a balance
	CallID  vend.CallID // 0 if none
	MintURL string      // Cashu only
	Ledger  string      // what the ledger says (a state, an amount)
	Remote  string      // what LND, the wallet or the mint says
	Detail  string
	// Repair says what the reconciler did ("reconcile: ..."); "" if it
	// is left to the operator.
	Repair  string
	FoundAt time.Time
}

// Summary is one finished run.
type Summary struct {
	Run         int64
	Started     time.Time
	Finished    time.Time
	Differences []Difference
	Repaired    int
	// Err is why a part of the run could not compare (a backend
	// unreachable); what was compared is still in Differences.
	Err error
}

// ByKind counts the run's differences by kind; every Kind is present.
func (s Summary) ByKind() map[Kind]int {
	m := make(map[Kind]int, len(Kinds()))
	for _, k := range Kinds() {
		m[k] = 0
	}
	for _, d := range s.Differences {
		m[d.Kind]++
	}
	return m
}

// Store is the ledger as the reconciler uses it; *ledger.Ledger implements
// it. Every method is one transaction.
type Store interface {
	// Payment returns a payment by ref, or an error matching
	// vend.ErrNotFound.
	Payment(ctx context.Context, ref string) (vend.Payment, error)
	// PaymentsByRef returns the payments of refs it holds, by ref (a ref
	// it does not hold is absent), except those in state skip ("": none
	// skipped), read at once: a run reads the payments of a page of
	// invoices in one query, not one by one, and skips the settled
	// payments of the invoices LND settled (they agree).
	PaymentsByRef(ctx context.Context, refs []string, skip vend.PaymentState) (map[string]vend.Payment, error)
	// Call returns a call by id, or vend.ErrNotFound.
	Call(ctx context.Context, id vend.CallID) (vend.Call, error)
	// UnsettledPayments returns the backend's open or accepted payments.
	UnsettledPayments(ctx context.Context, backend vend.Backend) ([]vend.Payment, error)
	// CashuAssets returns the balance of every assets:cashu:<mint>
	// account, by account name.
	CashuAssets(ctx context.Context) (map[string]vend.Msat, error)
	// ReconcileCursor returns the add index up to which source's
	// invoices were final and agreed (0 if never saved).
	ReconcileCursor(ctx context.Context, source string) (uint64, error)
	// SaveReconcileCursor stores it; it only moves forward.
	SaveReconcileCursor(ctx context.Context, source string, addIndex uint64) error
	// StartReconcile records the start of a run and returns its id.
	StartReconcile(ctx context.Context) (int64, error)
	// FinishReconcile records the end of run s.Run, once.
	FinishReconcile(ctx context.Context, s Summary) error
	// RecordDifference stores a difference that nothing repaired.
	RecordDifference(ctx context.Context, d Difference) (Difference, error)
	// RepairSettlement books s (a settlement LND made) and stores d with
	// its repair, in one transaction: all or nothing. An error matching
	// vend.ErrAlreadySettled means it was booked meanwhile (by the
	// backend's watcher): nothing is written.
	RepairSettlement(ctx context.Context, d Difference, s vend.Settlement) (vend.Payment, error)
	// RepairCanceled ends the open or accepted payment d.Ref as canceled
	// (its call too if it waited for it, and a paid call that never
	// started is refunded) and stores d with its repair, in one
	// transaction. A payment already ended changes nothing but d's row;
	// a settled one is refused (vend.ErrIllegalTransition) and nothing is
	// written.
	RepairCanceled(ctx context.Context, d Difference) (vend.Payment, error)
	// RepairLost books s, the settlement of an invoice capvend made that
	// no payment names (its quote lost with a restored ledger), to
	// UnattributedAccount, with d, in one transaction, once: one booked
	// before, or a ref a payment names, is vend.ErrAlreadySettled and
	// writes nothing.
	RepairLost(ctx context.Context, d Difference, s vend.Settlement) error
	// LostRefs returns which of refs are booked as lost payments
	// (RepairLost) already.
	LostRefs(ctx context.Context, refs []string) (map[string]bool, error)
}

// UnattributedAccount is where RepairLost books money received for a
// call the ledger lost.
const UnattributedAccount = "liabilities:unattributed"

// Config configures a Reconciler. Store is required; LND, Wallet and NWC
// are optional (the backends capvend is configured with).
type Config struct {
	Store Store
	LND   LND
	// Node names the LND node: its cursor is "lnd:<Node>" (default
	// "lnd").
	Node   string
	Wallet Wallet
	// NWC are the NWC connections (their cursors are named by their
	// backend, "nwc" or "nwc:<name>").
	NWC []NWC
	// OwnsPreimage, if set, reports whether a settled LND invoice's
	// preimage carries capvend's mark (billing/lnd.Mark.Owns, keyed by
	// the ledger's identity): such an invoice that no payment names was
	// made by capvend and lost with its ledger, and is booked
	// (Store.RepairLost).
	OwnsPreimage func(preimage []byte) bool
	// Repair enables the automatic repairs (serve: on; capvend reconcile:
	// --repair).
	Repair bool
	// Report, if set, is told of each payment change a repair recorded, as
	// a backend's watcher would report it (vend routes it to the call).
	Report func(vend.PaymentEvent)
	// Observe, if set, is called with every finished run (metrics: the
	// differences by kind, the time of the last run).
	Observe func(Summary)
	// Interval is how often Run reconciles (default DefaultInterval).
	Interval time.Duration
	Log      *slog.Logger
	Now      func() time.Time
}

// DefaultInterval is Config.Interval's default.
const DefaultInterval = 5 * time.Minute

// Reconciler runs reconciliations. It is safe for concurrent use; runs do
// not overlap.
type Reconciler struct {
	cfg  Config
	busy chan struct{}
}

// New returns a Reconciler; it starts nothing.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Store == nil {
		return nil, errors.New("reconcile: no store")
	}
	if cfg.Node == "" {
		cfg.Node = "lnd"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Reconciler{cfg: cfg, busy: make(chan struct{}, 1)}, nil
}

// Run reconciles at once and then every Interval until ctx ends. A run
// that fails is logged and retried at the next interval. It returns ctx's
// error.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.Once(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Log.Error("reconcile: run failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Once runs one reconciliation: it compares every configured backend with
// the ledger, records and logs each difference, repairs what is safe when
// Config.Repair is set, and records the run. A backend that cannot be
// compared (unreachable) does not stop the others: its error is in
// Summary.Err and returned. It waits for a run already under way.
func (r *Reconciler) Once(ctx context.Context) (Summary, error) {
	select {
	case r.busy <- struct{}{}:
	case <-ctx.Done():
		return Summary{}, ctx.Err()
	}
	defer func() { <-r.busy }()
	s := Summary{Started: r.cfg.Now()}
	run, err := r.cfg.Store.StartReconcile(ctx)
	if err != nil {
		return s, fmt.Errorf("reconcile: %w", err)
	}
	s.Run = run
	var errs []error
	add := func(d Difference) {
		d.Run = run
		if d.FoundAt.IsZero() {
			d.FoundAt = r.cfg.Now()
		}
		if d.Repair == "" {
			var err error
			if d, err = r.cfg.Store.RecordDifference(ctx, d); err != nil {
				errs = append(errs, err)
			}
		} else {
			s.Repaired++
		}
		r.logDifference(d)
		s.Differences = append(s.Differences, d)
	}
	if r.cfg.LND != nil {
		if err := r.checkLND(ctx, run, add); err != nil {
			errs = append(errs, fmt.Errorf("lnd: %w", err))
		}
	}
	for _, w := range r.cfg.NWC {
		if err := r.checkNWC(ctx, run, w, add); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w.Backend(), err))
		}
	}
	if r.cfg.Wallet != nil {
		if err := r.checkCashu(ctx, add); err != nil {
			errs = append(errs, fmt.Errorf("cashu: %w", err))
		}
	}
	s.Err = errors.Join(errs...)
	s.Finished = r.cfg.Now()
	sort.SliceStable(s.Differences, func(i, j int) bool { return s.Differences[i].Kind < s.Differences[j].Kind })
	if err := r.cfg.Store.FinishReconcile(context.WithoutCancel(ctx), s); err != nil {
		s.Err = errors.Join(s.Err, err)
	}
	if r.cfg.Observe != nil {
		r.cfg.Observe(s)
	}
	if len(s.Differences) == 0 && s.Err == nil {
		r.cfg.Log.Info("reconcile: the books agree with the backends", "run", run)
	}
	return s, s.Err
}

// logDifference writes the WARN line of a difference: its ids, never a
// secret (payment hashes and quote ids are not).
func (r *Reconciler) logDifference(d Difference) {
	attrs := []any{"kind", string(d.Kind), "backend", string(d.Backend), "run", d.Run}
	if d.Ref != "" {
		attrs = append(attrs, "ref", d.Ref)
	}
	if d.CallID != 0 {
		attrs = append(attrs, "call", int64(d.CallID))
	}
	if d.MintURL != "" {
		attrs = append(attrs, "mint", d.MintURL)
	}
	attrs = append(attrs, "ledger", d.Ledger, "remote", d.Remote, "detail", d.Detail)
	if d.Repair != "" {
		attrs = append(attrs, "repair", d.Repair)
	}
	r.cfg.Log.Warn("reconcile: difference", attrs...)
}

// report tells Config.Report of a change a repair recorded.
func (r *Reconciler) report(p vend.Payment) {
	if r.cfg.Report != nil {
		r.cfg.Report(vend.PaymentEvent{Payment: p})
	}
}
