package cashu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/wallet"
	"golang.org/x/sync/errgroup"

	"github.com/capvend/capvend/internal/retry"
	"github.com/capvend/capvend/vend"
)

// shutdownWait bounds how long Run waits for its workers once ctx ended.
const shutdownWait = 15 * time.Second

// watchedQuote is a mint quote Run checks at the mint.
type watchedQuote struct {
	ref       string
	mint      string
	callID    vend.CallID
	expiresAt time.Time // capvend's expiry: the payment is expired after it
	// quoteExpiry is the mint's: after it the quote can no longer be paid
	// and watching stops (after one last check).
	quoteExpiry time.Time
	ended       bool // capvend expired or canceled it: a payment is late
	busy        bool // a worker is handling it
	// covered: an acknowledged NUT-17 subscription reports its changes,
	// so it is polled only every SafetyPoll.
	covered bool
	created time.Time // when the quote was requested
	urgent  bool      // the mint said PAID: check now
	foreign bool      // minted by someone else: never settle it
	// lost: a quote of the wallet's store that no payment names (the
	// ledger lost it): minted once paid and booked as lost
	// (settleLost), for no call.
	lost      bool
	amount    uint64    // lost: the quote's amount, sats
	nextCheck time.Time // when to poll it next
	checks    int       // checks ended (tests wait for one: CheckNow)
}

// Request implements vend.PaymentBackend: it asks the quote mint for a
// NUT-04 mint quote for the amount rounded up to whole sats, records it
// (KindMintQuote, ref = quote id) and starts watching it. The quote's bolt11
// is what the client pays. On error nothing is recorded (a quote the mint
// issued but capvend failed to record is never watched; it expires unpaid
// at the mint unless someone pays an invoice they were never given).
func (b *Backend) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	if !b.cfg.MintQuotes {
		return vend.Payment{}, fmt.Errorf("request: mint quotes: %w", ErrDisabled)
	}
	if r.Amount <= 0 {
		return vend.Payment{}, errors.New("cashu: request: amount must be positive")
	}
	if err := ctx.Err(); err != nil {
		return vend.Payment{}, err
	}
	sats := r.Amount.SatsCeil()
	amount, err := vend.FromSats(sats)
	if err != nil {
		return vend.Payment{}, fmt.Errorf("cashu: request: %w", err)
	}
	mint := b.mints[0]
	if err := b.loadWallet(); err != nil {
		return vend.Payment{}, fmt.Errorf("cashu: request: %w", err)
	}
	var q *nut04.PostMintQuoteBolt11Response
	err = b.withWalletShared(func(w *wallet.Wallet) error {
		var err error
		q, err = w.RequestMint(uint64(sats), mint)
		return err
	})
	if err != nil {
		var ce cashu.Error
		switch {
		case errors.Is(err, ErrClosed):
			return vend.Payment{}, err
		case errors.As(err, &ce):
			return vend.Payment{}, fmt.Errorf("cashu: mint quote at %s: %w: %v", mint, ErrMintRejected, err)
		}
		return vend.Payment{}, fmt.Errorf("cashu: mint quote at %s: %w: %v", mint, ErrMintUnavailable, err)
	}
	now := b.now()
	expiry := r.Expiry
	if expiry <= 0 {
		expiry = b.cfg.DefaultExpiry
	}
	expiresAt := now.Add(expiry)
	quoteExpiry := time.Unix(int64(q.Expiry), 0)
	if q.Expiry > 0 && quoteExpiry.Before(expiresAt) {
		expiresAt = quoteExpiry
	}
	if q.Expiry == 0 {
		quoteExpiry = now.Add(time.Hour) // gonuts' mint quotes live 1 h
	}
	p, err := b.ledger.RecordPayment(ctx, r.CallID, vend.NewPayment{
		Backend:   vend.BackendCashu,
		Kind:      vend.KindMintQuote,
		Ref:       q.Quote,
		Bolt11:    q.Request,
		MintURL:   mint,
		Amount:    amount,
		ExpiresAt: expiresAt,
	})
	if err != nil {
		b.log.Warn("mint quote issued but not recorded", logRef, short(q.Quote), logCall, int64(r.CallID), logErr, err)
		return vend.Payment{}, fmt.Errorf("cashu: request: %w", err)
	}
	b.watch(&watchedQuote{ref: p.Ref, mint: mint, callID: p.CallID, expiresAt: p.ExpiresAt, quoteExpiry: quoteExpiry, created: now})
	b.log.Debug("mint quote requested", logRef, short(p.Ref), logCall, int64(p.CallID), logAmount, int64(amount))
	return p, nil
}

// Cancel implements vend.PaymentBackend. A mint quote cannot be withdrawn
// at the mint: the payment is recorded canceled, and Run keeps watching the
// quote until the mint's expiry so a late payment is still found and
// recorded (owed back). Canceling a canceled or expired payment is not an
// error; canceling a settled one is (vend.ErrIllegalTransition).
func (b *Backend) Cancel(ctx context.Context, ref string) error {
	p, err := b.ledger.Payment(ctx, ref)
	if err != nil {
		return fmt.Errorf("cashu: cancel %s: %w", ref, err)
	}
	if p.Backend != vend.BackendCashu {
		return fmt.Errorf("cashu: cancel %s: a %s payment", ref, p.Backend)
	}
	switch p.State {
	case vend.PaymentCanceled, vend.PaymentExpired:
		return nil
	case vend.PaymentSettled:
		return fmt.Errorf("cashu: cancel %s: %w", ref, &vend.TransitionError{What: "payment " + ref, From: string(p.State), To: string(vend.PaymentCanceled)})
	}
	if _, err := b.ledger.EndPayment(ctx, ref, vend.PaymentCanceled, "canceled"); err != nil {
		return fmt.Errorf("cashu: cancel %s: %w", ref, err)
	}
	b.qmu.Lock()
	if q, ok := b.watched[ref]; ok {
		q.ended = true
	}
	b.qmu.Unlock()
	return nil
}

func (b *Backend) watch(q *watchedQuote) {
	b.qmu.Lock()
	if _, ok := b.watched[q.ref]; !ok {
		if q.created.IsZero() {
			q.created = b.now()
		}
		if q.nextCheck.IsZero() {
			q.nextCheck = b.now().Add(b.cfg.PollInterval)
		}
		b.watched[q.ref] = q
	}
	b.qmu.Unlock()
	select {
	case b.wsKick <- struct{}{}:
	default:
	}
}

// checkInterval is how long until q is polled again: quotes are paid soon
// after they are handed out or not at all, so older quotes, late-payment
// watches and quotes a subscription covers are polled less often. The
// caller holds qmu.
func (b *Backend) checkInterval(q *watchedQuote) time.Duration {
	age := b.now().Sub(q.created)
	switch {
	case q.covered || q.ended || age > 10*time.Minute:
		return b.cfg.SafetyPoll
	case age > time.Minute:
		return min(4*b.cfg.PollInterval, b.cfg.SafetyPoll)
	}
	return b.cfg.PollInterval
}

// watchedRefs lists the watched quotes of mint.
func (b *Backend) watchedRefs(mint string) []string {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	refs := make([]string, 0, len(b.watched))
	for ref, q := range b.watched {
		if q.mint == mint {
			refs = append(refs, ref)
		}
	}
	sort.Strings(refs)
	return refs
}

// urgent marks a watched quote for checking now and wakes Run.
func (b *Backend) urgent(ref string) {
	b.qmu.Lock()
	q, ok := b.watched[ref]
	if ok {
		q.urgent = true
	}
	b.qmu.Unlock()
	if ok {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
}

// cover records whether quotes have an acknowledged subscription.
func (b *Backend) cover(on bool, refs ...string) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for _, ref := range refs {
		if q, ok := b.watched[ref]; ok {
			q.covered = on
			if next := b.now().Add(b.checkInterval(q)); !on && q.nextCheck.After(next) {
				q.nextCheck = next
			}
		}
	}
}

// uncoverAll: the websocket is down, every quote is polled again.
func (b *Backend) uncoverAll() {
	b.qmu.Lock()
	refs := make([]string, 0, len(b.watched))
	for ref := range b.watched {
		refs = append(refs, ref)
	}
	b.qmu.Unlock()
	b.cover(false, refs...)
}

// Run implements vend.PaymentBackend. It loads the wallet (retrying with
// backoff while the mint is unreachable), reconciles what happened while
// capvend was down, then watches every open mint quote: quotes are polled
// (see Config.PollInterval) and, with Config.Websocket, the mint also
// pushes state changes over a NUT-17 websocket (reconnected with backoff).
// A PAID quote is minted into the wallet and
// recorded settled; an ISSUED quote the wallet minted before a crash is
// recorded (one whose mint answer was lost is restored first, NUT-09); an
// open quote past capvend's expiry is recorded expired and still watched
// until the mint's own expiry, so a late payment is recorded too (owed
// back). Each settlement and expiry is recorded once, then reported; report
// is never called concurrently. When ctx ends Run waits (at most 15 s) for
// its workers, closes the wallet and returns ctx's error; Run may be
// called once per Backend.
func (b *Backend) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	b.qmu.Lock()
	if b.running {
		b.qmu.Unlock()
		return errors.New("cashu: Run called twice")
	}
	b.running = true
	b.qmu.Unlock()
	var wg sync.WaitGroup
	defer func() {
		// gonuts' wallet calls the mint without timeouts: do not let a
		// hung call keep Run from returning. The wallet is closed
		// once the call returns.
		done := make(chan struct{})
		go func() {
			wg.Wait()
			b.Close()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(shutdownWait):
			b.log.Error("a mint call did not return within the shutdown grace; the wallet closes when it does", "grace", shutdownWait)
		}
	}()
	var repMu sync.Mutex
	emit := func(p vend.Payment) {
		repMu.Lock()
		defer repMu.Unlock()
		if report != nil {
			report(vend.PaymentEvent{Payment: p})
		}
	}

	// gonuts' LoadWallet needs the mint: retry while it is unreachable
	// (PollInterval doubling to MaxBackoff); a closed backend is final.
	load := retry.Policy{
		Base: b.cfg.PollInterval,
		Max:  b.cfg.MaxBackoff,
		OnRetry: func(err error, _ int, wait time.Duration) {
			b.log.Warn("cashu wallet not loaded; retrying", logMint, b.mints[0], logErr, err, logBackoff, wait)
		},
	}
	if err := load.Do(ctx, func(context.Context) error {
		err := b.loadWallet()
		if errors.Is(err, ErrClosed) {
			return retry.Permanent(err)
		}
		return err
	}); err != nil {
		return err
	}
	// Reconcile until it succeeds, every MaxBackoff (jittered).
	rec := retry.Policy{
		Base: b.cfg.MaxBackoff,
		OnRetry: func(err error, _ int, wait time.Duration) {
			b.log.Warn("cashu reconcile failed; retrying", logErr, err, logBackoff, wait)
		},
	}
	if err := rec.Do(ctx, b.reconcile); err != nil {
		return err
	}

	if b.cfg.Websocket {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.runWS(ctx)
		}()
	}
	interval := b.cfg.PollInterval
	nextSwapCheck := b.now().Add(b.cfg.SafetyPoll)
	for {
		if now := b.now(); now.After(nextSwapCheck) {
			// Swaps whose outcome the mint could not tell before.
			b.resolveSwapping(ctx)
			if b.payoutsLeft.Load() {
				b.resolvePayouts(ctx)
			}
			nextSwapCheck = now.Add(b.cfg.SafetyPoll)
		}
		checks, failures, err := b.checkRound(ctx, &wg, b.dueQuotes(emit), emit)
		if err != nil {
			return err // the deferred wait covers started checks
		}
		b.caughtUpOnce.Do(func() { close(b.caughtUp) })
		// Back off while the mint is unreachable; back to the poll
		// interval as soon as one check gets through.
		down := checks > 0 && failures == checks
		switch {
		case down && interval < b.cfg.MaxBackoff:
			interval = min(interval*2, b.cfg.MaxBackoff)
			b.log.Warn("mint unreachable; backing off", logMint, b.mints[0], logBackoff, interval)
		case checks > 0 && !down && interval != b.cfg.PollInterval:
			interval = b.cfg.PollInterval
			b.log.Info("mint reachable again", logMint, b.mints[0])
		}
		// Sleep until the next quote is due, but not less than 10 ms
		// (nor less than the backoff while the mint is down).
		lo := 10 * time.Millisecond
		if interval > b.cfg.PollInterval {
			lo = interval
		}
		t := time.NewTimer(max(lo, b.nextWake(interval)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-b.wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// checkWorkers bounds the mint checks Run makes at once.
const checkWorkers = 8

// checkRound checks the due quotes, at most checkWorkers at a time, and
// waits for them. It returns how many checks ran and how many did not
// reach the mint, or ctx's error as soon as ctx ends: checks already
// started go on (a gonuts wallet call has no timeout) and are tracked by
// wg, so that Run's deferred wait covers them; due quotes not yet started
// are left.
func (b *Backend) checkRound(ctx context.Context, wg *sync.WaitGroup, due []*watchedQuote, emit func(vend.Payment)) (checks, failures int, err error) {
	if len(due) == 0 {
		return 0, 0, nil
	}
	var nChecks, nFailures atomic.Int64
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		var g errgroup.Group
		g.SetLimit(checkWorkers)
		for _, q := range due {
			if ctx.Err() != nil {
				break
			}
			g.Go(func() error {
				nChecks.Add(1)
				if !b.check(ctx, q, emit) {
					nFailures.Add(1)
				}
				return nil
			})
		}
		g.Wait()
	}()
	select {
	case <-done:
		return int(nChecks.Load()), int(nFailures.Load()), nil
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// nextWake is how long Run may sleep: until the earliest quote's next
// check or expiry, at most max.
func (b *Backend) nextWake(limit time.Duration) time.Duration {
	now := b.now()
	d := limit
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for _, q := range b.watched {
		if q.busy {
			continue
		}
		next := q.nextCheck
		if !q.ended && q.expiresAt.Before(next) {
			next = q.expiresAt
		}
		if w := next.Sub(now); w < d {
			d = w
		}
	}
	return d
}

// dueQuotes expires quotes past capvend's expiry (recording and reporting
// each once), drops quotes past the mint's expiry, and returns the quotes
// to check now, marked busy.
func (b *Backend) dueQuotes(emit func(vend.Payment)) []*watchedQuote {
	now := b.now()
	b.qmu.Lock()
	var expire []*watchedQuote
	var due []*watchedQuote
	for ref, q := range b.watched {
		if q.busy {
			continue
		}
		if !q.ended && now.After(q.expiresAt) {
			expire = append(expire, q)
			continue
		}
		// One last check a little after the mint's expiry, then stop.
		if now.After(q.quoteExpiry.Add(30 * time.Second)) {
			delete(b.watched, ref)
			continue
		}
		if !q.urgent && now.Before(q.nextCheck) {
			continue
		}
		q.busy, q.urgent = true, false
		due = append(due, q)
	}
	b.qmu.Unlock()
	for _, q := range expire {
		p, err := b.ledger.EndPayment(context.Background(), q.ref, vend.PaymentExpired, "payment request expired")
		switch {
		case err == nil:
			b.log.Info("mint quote expired", logRef, short(q.ref), logCall, int64(q.callID))
			emit(p)
		case errors.Is(err, vend.ErrIllegalTransition):
			// Settled or canceled meanwhile: the next check sorts it out.
		default:
			b.log.Error("recording mint quote expiry", logRef, short(q.ref), logErr, err)
			continue
		}
		b.qmu.Lock()
		q.ended = true
		b.qmu.Unlock()
	}
	return due
}

// check asks the mint for q's state and acts on it. It reports whether the
// mint answered.
func (b *Backend) check(ctx context.Context, q *watchedQuote, emit func(vend.Payment)) (reached bool) {
	done := false
	defer func() {
		b.qmu.Lock()
		q.busy = false
		q.checks++
		q.nextCheck = b.now().Add(b.checkInterval(q))
		if done {
			delete(b.watched, q.ref)
		}
		b.qmu.Unlock()
	}()
	b.qmu.Lock()
	foreign := q.foreign
	b.qmu.Unlock()
	if foreign {
		return true // only its expiry is left to record
	}
	st, err := b.quoteState(ctx, q.mint, q.ref)
	if err != nil {
		if ctx.Err() == nil {
			b.log.Debug("mint quote check failed", logRef, short(q.ref), logErr, err)
		}
		return false
	}
	switch st {
	case nut04.Unpaid, nut04.Pending:
		return true
	case nut04.Paid:
		if err := b.mintQuote(q.ref); err != nil {
			if alreadySigned(err) {
				// The wallet's counter is behind the mint (an
				// earlier answer was lost): repair, retry next round.
				if _, rerr := b.recoverWallet(ctx, q.mint, ""); rerr != nil {
					b.log.Error("recovering the wallet failed", logMint, q.mint, logErr, rerr)
				}
				return true
			}
			b.log.Warn("minting a paid quote failed; will retry", logRef, short(q.ref), logErr, err)
			return true
		}
		// Minted: a crash before the settlement below is recorded finds
		// the quote ISSUED at the mint and in the wallet at the next
		// start, and records it then (the mint's quote state is this
		// path's durable "swapping" record).
		b.failpoint(FailAfterMint)
	case nut04.Issued:
		// Minted already: by this wallet before a crash (its quote
		// store says issued), or the answer to our mint request was
		// lost, or someone else who knows the quote id minted it.
		var walletIssued bool
		var want uint64
		_ = b.withWalletShared(func(w *wallet.Wallet) error {
			if wq := w.GetMintQuoteById(q.ref); wq != nil {
				walletIssued, want = wq.State == nut04.Issued, wq.Amount
			}
			return nil
		})
		if !walletIssued {
			// Restore what the mint signed for this wallet's
			// outputs but the wallet never saved.
			n, err := b.recoverWallet(ctx, q.mint, q.ref)
			if err != nil {
				b.log.Error("mint quote issued at the mint but not in the wallet, and restoring it failed; will retry", logRef, short(q.ref), logErr, err)
				return true
			}
			if n < want {
				// Not ours to book: the ecash went to whoever
				// minted it (a leaked quote id; gonuts v0.4.2 has
				// no NUT-20 quote locking). The call stays unpaid
				// and expires.
				b.log.Error("mint quote was minted by someone else: not recorded as paid", logRef, short(q.ref), logCall, int64(q.callID), "restored_sat", n, "quote_sat", want)
				b.qmu.Lock()
				q.foreign = true
				b.qmu.Unlock()
				return true
			}
		}
	default:
		b.log.Warn("mint quote in unknown state", logRef, short(q.ref), logState, st.String())
		return true
	}
	if q.lost {
		if err := b.settleLost(ctx, q); err != nil {
			b.log.Error("booking a lost mint quote; will retry", logRef, short(q.ref), logErr, err)
			return true
		}
		done = true
		return true
	}
	p, err := b.settleQuote(ctx, q.ref)
	if err != nil {
		if !errors.Is(err, vend.ErrAlreadySettled) {
			b.log.Error("recording mint quote settlement; will retry", logRef, short(q.ref), logErr, err)
			return true
		}
		done = true
		return true
	}
	done = true
	emit(p)
	return true
}

// mintQuote mints a paid quote's ecash into the wallet.
func (b *Backend) mintQuote(ref string) error {
	return b.withWallet(func(w *wallet.Wallet) error {
		if wq := w.GetMintQuoteById(ref); wq != nil && wq.State == nut04.Issued {
			return nil
		}
		_, err := w.MintTokens(ref)
		return err
	})
}

// settleQuote records a minted quote's settlement.
func (b *Backend) settleQuote(ctx context.Context, ref string) (vend.Payment, error) {
	p, err := b.ledger.Payment(ctx, ref)
	if err != nil {
		return vend.Payment{}, err
	}
	if p.State == vend.PaymentSettled {
		return p, fmt.Errorf("%w: %s", vend.ErrAlreadySettled, ref)
	}
	sp, err := b.ledger.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: p.Amount})
	if err != nil {
		return sp, err
	}
	b.log.Info("mint quote settled", logRef, short(ref), logCall, int64(sp.CallID), logAmount, int64(sp.Settled), logState, string(p.State))
	return sp, nil
}

// quoteState asks the mint for a mint quote's state (NUT-04 GET), with
// capvend's HTTP client (bounded by ctx and its timeout).
func (b *Backend) quoteState(ctx context.Context, mint, id string) (nut04.State, error) {
	var q nut04.PostMintQuoteBolt11Response
	if err := b.getJSON(ctx, mint+"/v1/mint/quote/bolt11/"+url.PathEscape(id), &q); err != nil {
		return 0, err
	}
	if q.Quote != "" && q.Quote != id {
		return 0, fmt.Errorf("mint answered for quote %q", q.Quote)
	}
	return q.State, nil
}

// getJSON GETs u and decodes a 200 answer into v.
func (b *Backend) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	return b.doJSON(req, v)
}

func (b *Backend) doJSON(req *http.Request, v any) error {
	resp, err := b.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMintUnavailable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMintUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &mintError{status: resp.StatusCode, body: body}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("mint answer: %w", err)
	}
	return nil
}

// mintError is a non-200 answer of the mint.
type mintError struct {
	status int
	body   []byte
}

func (e *mintError) Error() string {
	var ce struct {
		Detail string `json:"detail"`
		Code   int    `json:"code"`
	}
	if json.Unmarshal(e.body, &ce) == nil && ce.Detail != "" {
		return fmt.Sprintf("mint: %s (code %d, HTTP %d)", ce.Detail, ce.Code, e.status)
	}
	return fmt.Sprintf("mint: HTTP %d", e.status)
}
