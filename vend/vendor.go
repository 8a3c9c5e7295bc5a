package vend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Config wires a Vendor.
type Config struct {
	Ledger Ledger
	// Backends take payments, in order of preference for Lightning
	// invoices (an LND backend first, a Cashu mint-quote backend second).
	// A backend that is also a TokenAcceptor takes Cashu tokens.
	Backends []PaymentBackend
	Tools    ToolSource
	// Prices is the initial price book; SetPrices replaces it.
	Prices PriceBook
	// TTL is how long a payment request stays payable (default 10 min).
	TTL time.Duration
	// Heartbeat is how often a call waiting for payment sends a progress
	// notification when the client gave a progressToken (default 10 s).
	Heartbeat time.Duration
	// ExecTimeout bounds one upstream execution (default 10 min).
	ExecTimeout time.Duration
	// ToolWait is how long a paid call run from the ledger (at start,
	// or paid after its client left) waits for an upstream to offer its
	// tool (prompt, resource) before it is refunded (default 1 min).
	ToolWait time.Duration
	// MaxUnpaidPerClient and MaxUnpaidTotal bound the open unpaid
	// payment requests of one client and of all (see Limits in limits.go;
	// defaults DefaultMaxUnpaidPerClient, DefaultMaxUnpaidTotal).
	MaxUnpaidPerClient, MaxUnpaidTotal int
	// RequestsPerMinute bounds the calls (free or priced) of one client
	// (Source, else Client); 0: unlimited.
	RequestsPerMinute int
	Log               *slog.Logger
	// Credit turns prepaid credit on (see docs/ARCHITECTURE.md, Credit
	// accounts).
	Credit CreditConfig
	// Failpoint, if set, is called at the named steps of a priced call
	// (FailAfterQuote, FailAfterInvoice, FailAfterSettlement,
	// FailDuringExecution, FailAfterResult). Crash tests make it kill the
	// process; production leaves it nil.
	Failpoint func(step string)
	// Observer, if set, is told about free calls and upstream calls (see
	// Observer; the ledger reports its own changes to it).
	Observer Observer
	// Shared makes this Vendor one of several instances sharing the
	// ledger (see SharedConfig); zero: the ledger's only user.
	Shared SharedConfig
}

// The steps of a priced call a Failpoint is called at.
const (
	FailAfterQuote      = "after_quote"      // the call is recorded, no payment requested yet
	FailAfterInvoice    = "after_invoice"    // the payment request is recorded, not yet sent to the client
	FailAfterSettlement = "after_settlement" // the payment is recorded, the call has not started
	FailDuringExecution = "during_execution" // the call is claimed and its upstream call under way
	FailAfterResult     = "after_result"     // the result is stored, the answer not yet sent
)

func (v *Vendor) failpoint(step string) {
	if v.cfg.Failpoint != nil {
		v.cfg.Failpoint(step)
	}
}

// Vendor is capvend's vending runtime: it prices a tools/call, takes the
// payment through a backend, runs the tool exactly once on its upstream,
// and records every step in the ledger. Fronts (MCP HTTP, stdio, Nostr)
// call Tools and CallItem; Run must be running for payments to be seen.
type Vendor struct {
	cfg     Config
	schemas schemaCache
	prices  atomic.Pointer[bookRef] // the current price book; cfg.Prices is only the first

	unpaid *unpaidBook  // open unpaid payment requests (limits.go)
	issue  *issueQueue  // turns to issue a payment request (issue.go)
	payers payerSet     // limit keys that paid in this run (issue.go)
	rate   *rateLimiter // calls per client and minute (limits.go)

	waiters waiterSet                       // requests waiting for a payment's report (waiters.go)
	running runningSet                      // calls executing in this process (waiters.go)
	bg      atomic.Pointer[context.Context] // Run's context, for work started by payment reports
	bgWG    sync.WaitGroup                  // that work; Run waits for it
	// runID is this Vendor's run id, recorded with every call it records
	// (NewCall.Run): Recover leaves the calls of its own run alone.
	runID string
	// recovered is closed when Run's Recover has returned.
	recovered     chan struct{}
	recoveredOnce sync.Once
	lead          leadership // with Shared.Leases: whether this instance holds LeaseWork
	// reserved holds the tools logged as not offered because their
	// schema declares PaymentArg (grants.go), each logged once.
	reserved sync.Map
	// l402 caches the L402 root key (see l402.go).
	l402 l402Key

	obs    Observer // cfg.Observer, or NopObserver
	flight inflight // requests being served (InFlight)
}

// New checks cfg and returns a Vendor. It starts nothing.
func New(cfg Config) (*Vendor, error) {
	if cfg.Ledger == nil || cfg.Tools == nil || cfg.Prices == nil {
		return nil, errors.New("vend: a ledger, a tool source and a price book are required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Minute
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.ExecTimeout <= 0 {
		cfg.ExecTimeout = 10 * time.Minute
	}
	if cfg.ToolWait <= 0 {
		cfg.ToolWait = time.Minute
	}
	if cfg.MaxUnpaidPerClient <= 0 {
		cfg.MaxUnpaidPerClient = DefaultMaxUnpaidPerClient
	}
	if cfg.MaxUnpaidTotal <= 0 {
		cfg.MaxUnpaidTotal = DefaultMaxUnpaidTotal
	}
	if cfg.Credit.MaxTopUp <= 0 {
		cfg.Credit.MaxTopUp = DefaultMaxTopUp
	}
	if cfg.Credit.ExpirySweep <= 0 {
		cfg.Credit.ExpirySweep = time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Shared.Leases != nil {
		if cfg.Shared.Instance == "" {
			return nil, errors.New("vend: Shared.Leases without an Instance")
		}
		cfg.Shared.defaults()
	}
	v := &Vendor{cfg: cfg, obs: cfg.Observer,
		unpaid: newUnpaidBook(cfg.MaxUnpaidPerClient, cfg.MaxUnpaidTotal), issue: newIssueQueue(maxIssuing, maxWaiting),
		rate:  &rateLimiter{perMinute: cfg.RequestsPerMinute, maxKeys: DefaultMaxRateKeys},
		runID: randomHex(16), recovered: make(chan struct{})}
	if v.obs == nil {
		v.obs = NopObserver{}
	}
	v.SetPrices(cfg.Prices)
	return v, nil
}

// bookRef holds a PriceBook for atomic.Pointer.
type bookRef struct{ b PriceBook }

// SetPrices makes b the price book, atomically, for a configuration
// reload: calls quoted from now on, Tools and ListedPrice use b at once;
// calls already quoted keep the price they were recorded with. b must not
// be nil (SetPrices panics).
func (v *Vendor) SetPrices(b PriceBook) {
	if b == nil {
		panic("vend: SetPrices(nil)")
	}
	v.prices.Store(&bookRef{b})
}

func (v *Vendor) book() PriceBook { return v.prices.Load().b }

// Run runs every backend's watcher until ctx ends, routing what they
// report to the calls waiting for it. It returns ctx's error, or the first
// backend error that makes watching impossible.
func (v *Vendor) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v.bg.Store(&ctx)
	defer v.bgWG.Wait() // after cancel: background work sees ctx end
	errs := make(chan error, len(v.cfg.Backends))
	var wg sync.WaitGroup
	for _, b := range v.cfg.Backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.Run(ctx, v.onPayment)
			if ctx.Err() == nil {
				errs <- fmt.Errorf("%s backend: %w", b.Name(), err)
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		v.expireCredit(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if v.cfg.Shared.Leases != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v.watchOrphans(ctx)
			}()
			v.runShared(ctx) // recovery on the lease holder
			return
		}
		defer v.recoveredOnce.Do(func() { close(v.recovered) })
		if err := v.Recover(ctx); err != nil && ctx.Err() == nil {
			v.cfg.Log.Error("vend: recover", "err", err)
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// Recovered is closed once Run's Recover has finished what the previous
// run left (or Run stopped first).
func (v *Vendor) Recovered() <-chan struct{} { return v.recovered }

// Report routes a payment change that something other than a backend's
// watcher recorded in the ledger (a reconcile repair booking a late
// settlement or ending a canceled payment) exactly as a backend's report:
// to the call waiting for it, or, nobody waiting, a settled call is run
// and a locked-in hold invoice canceled. Report each recorded change
// once; a change the backend's watcher also recorded is recorded (and so
// reported) by only one of them: the ledger's claim decides.
func (v *Vendor) Report(e PaymentEvent) { v.onPayment(e) }

// onPayment routes a backend's report to the call waiting for it. A hold
// invoice locked in for a call nobody waits for any more (the client left)
// is canceled at once: the money goes back to the client by Lightning.
func (v *Vendor) onPayment(e PaymentEvent) {
	if e.Payment.State != PaymentOpen {
		v.unpaid.end(e.Payment.Ref)
	}
	// A waiter either gets the event or has left, and the event takes
	// the orphan path below (see waiterSet.deliver).
	if v.waiters.deliver(e) > 0 {
		return
	}
	v.orphanPath(e)
}

// orphanPath handles a payment change nobody waits for.
func (v *Vendor) orphanPath(e PaymentEvent) {
	switch {
	case e.Payment.State == PaymentAccepted && e.Payment.Kind == KindHoldInvoice:
		v.background(func(ctx context.Context) {
			if !v.othersCall(ctx, e.Payment.CallID) {
				v.abandonHold(e.Payment)
			}
		})
	case e.Payment.State == PaymentSettled && e.Payment.Kind != KindHoldInvoice:
		// Paid, and nobody waits (the client left, or capvend restarted):
		// run it now and keep the answer for the client's replay.
		v.background(func(ctx context.Context) {
			if !v.othersCall(ctx, e.Payment.CallID) {
				v.runStored(ctx, e.Payment.CallID, false, time.Now().Add(v.cfg.ToolWait))
			}
		})
	}
}

// othersCall reports whether, sharing the ledger (Config.Shared), call id
// is not this run's: its instance serves it (a call waiting there reads
// the payment from the ledger), or, that instance dead, the lease
// holder's recovery does. Unreadable counts as another's (recovery
// finds it). Without Shared.Leases every call is this instance's.
func (v *Vendor) othersCall(ctx context.Context, id CallID) bool {
	if v.cfg.Shared.Leases == nil {
		return false
	}
	c, err := v.cfg.Ledger.Call(ctx, id)
	return err != nil || c.Run != v.runID
}

// background runs fn in a goroutine tracked by Run, with Run's context
// (reports only arrive while Run runs).
func (v *Vendor) background(fn func(ctx context.Context)) {
	ctx := context.Background()
	if bg := v.bg.Load(); bg != nil {
		ctx = *bg
	}
	v.bgWG.Add(1)
	go func() {
		defer v.bgWG.Done()
		fn(withoutClient(ctx))
	}()
}
