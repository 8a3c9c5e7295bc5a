package vend

import (
	"context"
	"sync"
	"time"
)

// SharedConfig makes a Vendor one of several capvend instances sharing a
// ledger (PostgreSQL). Without Leases the Vendor is the ledger's only
// user: Run recovers every call of an earlier run once at start.
//
// With Leases, each instance holds a lease on its own run
// ("run:<run id>", renewed every Renew, expiring after LeaseTTL), which
// tells the others it is alive, and one instance at a time holds the
// lease LeaseWork: that one recovers, every Renew, the calls of runs
// whose lease has expired (an instance that died or stopped), and runs
// what WhileLeading is given (the reconciler). A dead instance's calls
// are so taken over within LeaseTTL+Renew; a stopped one releases its
// leases, which are then taken at the next Renew. A payment recorded by
// another instance (each watches the same LND) reaches a call waiting for
// it here within Poll, as does one of a call whose client left (see
// watchOrphans), and a payment change of another instance's call seen
// here is left to that instance.
type SharedConfig struct {
	Leases   Leaser
	Instance string        // this instance's name (the lease holder); required with Leases
	LeaseTTL time.Duration // default 30 s
	Renew    time.Duration // default LeaseTTL/3
	Poll     time.Duration // default 1 s
	// Rates, if set, counts Config.RequestsPerMinute across the
	// instances (one ledger write per call); nil: in this process.
	Rates RateCounter
	// Unpaid, if set, counts the open unpaid payment requests
	// (MaxUnpaidPerClient, MaxUnpaidTotal) across the instances: one
	// ledger read per new quote the instance's own count lets through,
	// and each call records its limit key; nil: in this process only.
	Unpaid UnpaidCounter
}

// LeaseWork is the lease of the work that runs on one instance.
const LeaseWork = "work"

func (c *SharedConfig) defaults() {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 30 * time.Second
	}
	if c.Renew <= 0 {
		c.Renew = c.LeaseTTL / 3
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
}

// runLease is the name of the lease on run's liveness.
func runLease(run string) string { return "run:" + run }

// leadership says whether this instance holds LeaseWork, with a context
// that ends when it stops holding it.
type leadership struct {
	mu      sync.Mutex
	ctx     context.Context // nil while not leading
	cancel  context.CancelFunc
	changed chan struct{} // closed (and replaced) at each change
}

func (l *leadership) set(parent context.Context, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	on = on && parent.Err() == nil // stopping: never leads again
	if on == (l.ctx != nil) {
		return
	}
	if on {
		l.ctx, l.cancel = context.WithCancel(parent)
	} else {
		l.cancel()
		l.ctx, l.cancel = nil, nil
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// current returns the leading context (nil if not leading) and the
// channel closed at the next change.
func (l *leadership) current() (context.Context, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.ctx, l.changed
}

// Leading reports whether this Vendor runs the work that runs once across
// instances: always without SharedConfig.Leases, else while it holds
// LeaseWork.
func (v *Vendor) Leading() bool {
	if v.cfg.Shared.Leases == nil {
		return true
	}
	ctx, _ := v.lead.current()
	return ctx != nil
}

// WhileLeading runs fn whenever this Vendor leads (see Leading), with a
// context that ends when it stops leading or ctx ends, until ctx ends;
// it returns fn's error if fn fails while leading. Without Leases it is
// fn(ctx).
func (v *Vendor) WhileLeading(ctx context.Context, fn func(context.Context) error) error {
	if v.cfg.Shared.Leases == nil {
		return fn(ctx)
	}
	for {
		lctx, changed := v.lead.current()
		if lctx == nil {
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
				continue
			}
		}
		fctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(lctx, cancel)
		err := fn(fctx)
		stop()
		lost := lctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case !lost:
			return err
		}
	}
}

// runShared is Run's recovery with SharedConfig.Leases: it keeps this
// run's lease and tries for LeaseWork every Renew; while it holds that,
// it recovers the calls of dead runs after each renewal. On return
// (ctx ended) it releases both leases.
func (v *Vendor) runShared(ctx context.Context) {
	sh := v.cfg.Shared
	t := time.NewTicker(sh.Renew)
	defer t.Stop()
	var wg sync.WaitGroup
	defer func() {
		v.lead.set(ctx, false)
		wg.Wait() // a recovery under way ends with the leadership
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, name := range []string{LeaseWork, runLease(v.runID)} {
			if err := sh.Leases.ReleaseLease(rctx, name, sh.Instance); err != nil {
				v.cfg.Log.Warn("vend: releasing a lease", "lease", name, "err", err)
			}
		}
	}()
	recovering := make(chan struct{}, 1) // one recovery at a time
	for {
		if _, err := sh.Leases.TakeLease(ctx, runLease(v.runID), sh.Instance, sh.LeaseTTL); err != nil && ctx.Err() == nil {
			v.cfg.Log.Error("vend: renewing this run's lease", "err", err)
		}
		held, err := sh.Leases.TakeLease(ctx, LeaseWork, sh.Instance, sh.LeaseTTL)
		if err != nil && ctx.Err() == nil {
			v.cfg.Log.Error("vend: taking the work lease", "err", err)
		}
		if held && !v.Leading() {
			v.cfg.Log.Info("vend: this instance now recovers interrupted calls and reconciles", "instance", sh.Instance)
		}
		v.lead.set(ctx, held)
		if lctx, _ := v.lead.current(); lctx != nil {
			select {
			case recovering <- struct{}{}:
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-recovering }()
					if err := v.Recover(lctx); err != nil && lctx.Err() == nil {
						v.cfg.Log.Error("vend: recover", "err", err)
					}
					v.recoveredOnce.Do(func() { close(v.recovered) })
				}()
			default: // the last one still runs
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// liveRuns tells, during one Recover, whether a run other than this one
// is alive (its instance holds its lease). Without Leases none is.
type liveRuns struct {
	v    *Vendor
	seen map[string]bool
}

func (l *liveRuns) alive(ctx context.Context, run string) (bool, error) {
	if l.v.cfg.Shared.Leases == nil || run == "" {
		return false, nil
	}
	if alive, ok := l.seen[run]; ok {
		return alive, nil
	}
	holder, err := l.v.cfg.Shared.Leases.LeaseHolder(ctx, runLease(run))
	if err != nil {
		return false, err
	}
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[run] = holder != ""
	return holder != "", nil
}

// watchOrphans, sharing the ledger, reads every Poll the payments this
// instance issued whose client left while they were open (see
// waiterSet.leave), and takes the orphan path for each the ledger shows
// changed: another instance (each watches the same LND) may have
// recorded the change first, and then this instance's backend reports
// nothing. Without this watch such a paid call would wait for this
// instance's next start, and a locked-in hold invoice for its expiry.
// One ledger query per Poll reads them all.
func (v *Vendor) watchOrphans(ctx context.Context) {
	t := time.NewTicker(v.cfg.Shared.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		refs := v.waiters.orphanRefs(time.Now())
		if len(refs) == 0 {
			continue
		}
		changed, err := v.cfg.Ledger.PaymentsByRef(ctx, refs, PaymentOpen)
		if err != nil {
			if ctx.Err() == nil {
				v.cfg.Log.Warn("vend: reading the payments of calls whose client left", "err", err)
			}
			continue
		}
		for ref, p := range changed {
			if p.State == PaymentOpen || !v.waiters.claimOrphan(ref, time.Now()) {
				continue
			}
			v.unpaid.end(ref)
			v.orphanPath(PaymentEvent{Payment: p})
		}
	}
}
