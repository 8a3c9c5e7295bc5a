// Package cashu is capvend's Cashu payment backend (gonuts v0.4.2): it
// implements vend.PaymentBackend and vend.RefundPayer (and reconcile's
// Wallet) for internal/cli to wire. docs/OPERATING.md, "Connecting to a
// Cashu mint", sets it up.
//
// # Taking payment
//
//   - Mint quotes (NUT-04): Request asks the first trusted mint for a quote
//     whose bolt11 the client pays; Run watches open quotes, mints the ecash
//     into capvend's own wallet once a quote is PAID, and records the
//     settlement in the ledger exactly once. A seller without a Lightning
//     node is paid over Lightning this way.
//   - Tokens: AcceptToken takes a cashuA/cashuB token handed over with a
//     call, checks it offline (trusted mint, unit sat, amount covering the
//     price and the mint's input fees, not seen before), claims its proofs
//     in the ledger (swapping, before the swap), swaps them at the mint
//     (NUT-03) and records the payment settled, returning any change as a
//     new token. A swap whose outcome capvend did not learn (a crash, the
//     mint failing) is settled from the mint's word on the proofs (NUT-07)
//     later: never a silent gain, never a burnt token (swap.go).
//
// # Paying out
//
// A failed call paid in Cashu is paid back at once with a token made by
// the wallet (refund.go), and the operator's `capvend refunds pay` uses
// PayRefundToken and PayRefundInvoice on the wallet file. Every payout
// (refunds, credit paid back, withdrawals) is reserved in the ledger
// before its money leaves, then booked or released; one left in flight by
// a crash is resolved from the mint's word by the next process holding
// the wallet (payout.go).
//
// # The wallet
//
// The wallet is gonuts' bbolt wallet in Config.WalletDir. Loading it contacts
// the mint, so a Backend never loads it in New: the first operation that
// needs it does, and Run keeps retrying with backoff while the mint is
// unreachable. Proofs, tokens and secrets are never logged.
package cashu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/vend"
)

// Sentinel errors. AcceptToken's refusals wrap exactly one of the token
// errors; test with errors.Is.
var (
	// ErrMalformedToken: the token does not decode, or its content is not
	// a well-formed set of proofs.
	ErrMalformedToken = fmt.Errorf("cashu: malformed token: %w", vend.ErrBadToken)
	// ErrUntrustedMint: the token's mint is not one of the configured
	// mints.
	ErrUntrustedMint = fmt.Errorf("cashu: token from an untrusted mint: %w", vend.ErrForeignMint)
	// ErrWrongUnit: the token is not denominated in sat.
	ErrWrongUnit = fmt.Errorf("cashu: token unit is not sat: %w", vend.ErrWrongUnit)
	// ErrLockedToken: the token's proofs carry spending conditions
	// (NUT-10/11/14); capvend only takes bearer proofs.
	ErrLockedToken = fmt.Errorf("cashu: token is locked to spending conditions: %w", vend.ErrBadToken)
	// ErrTokenUnderpaid: the token is worth less than the price plus the
	// mint's input fees. It matches vend.ErrUnderpaid too.
	ErrTokenUnderpaid = fmt.Errorf("cashu: token underpays: %w", vend.ErrUnderpaid)
	// ErrTokenReplayed: the token (or one of its proofs) was handed to
	// capvend before; refused without contacting the mint. It matches
	// vend.ErrProofSpent too.
	ErrTokenReplayed = fmt.Errorf("cashu: token was received before: %w", vend.ErrProofSpent)
	// ErrTokenSpent: the mint says the token's proofs are spent (double
	// spend). It matches vend.ErrProofSpent too.
	ErrTokenSpent = fmt.Errorf("cashu: token is already spent at the mint: %w", vend.ErrProofSpent)
	// ErrMintRejected: the mint refused a request: a token's swap for a
	// reason other than spent proofs (invalid proof, unknown keyset ...),
	// or a quote (amount limits, minting disabled ...).
	ErrMintRejected = errors.New("cashu: the mint refused the request")
	// ErrMintUnavailable: the mint could not be reached (or failed);
	// nothing was recorded as settled. Retrying later may succeed: a
	// token refused with it was not spent by capvend and may be sent
	// again. It matches vend.ErrMintUnavailable too.
	ErrMintUnavailable error = &matching{"cashu: mint unavailable", vend.ErrMintUnavailable}
	// ErrDisabled: the operation is switched off in the configuration
	// (AcceptTokens or MintQuotes).
	ErrDisabled = errors.New("cashu: disabled by configuration")
	// ErrClosed: the backend's Run returned (or Close was called); the
	// wallet is closed.
	ErrClosed = errors.New("cashu: backend closed")
)

// matching is a sentinel error with its own text that also matches a
// vend sentinel.
type matching struct {
	msg string
	is  error
}

func (e *matching) Error() string { return e.msg }
func (e *matching) Unwrap() error { return e.is }

// Config configures a Backend. Mints and WalletDir are required.
type Config struct {
	// Mints are the trusted mints, http(s) URLs. The first issues mint
	// quotes; tokens of any of them are accepted.
	Mints []string
	// WalletDir holds the gonuts wallet (bbolt file wallet.db and its
	// seed: a secret).
	WalletDir string
	// AcceptTokens enables AcceptToken.
	AcceptTokens bool
	// MintQuotes enables Request (mint-quote mode).
	MintQuotes bool
	// PollInterval is how often a young open mint quote (under a minute
	// old) is checked at the mint (default 250 ms): it bounds settlement
	// detection latency. Older quotes are checked every 4 PollIntervals,
	// quotes over ten minutes old and late-payment watches every
	// SafetyPoll. Each check is one GET at the mint, which asks its
	// Lightning node.
	PollInterval time.Duration
	// SafetyPoll is the slowest check interval (default 5 s): old quotes,
	// and quotes covered by a NUT-17 subscription (the mint may miss a
	// payment: gonuts' mint forgets its invoice watchers when it
	// restarts).
	SafetyPoll time.Duration
	// Websocket opts in to NUT-17 subscriptions: the mint pushes quote
	// state changes, detection drops to a few ms and polling slows to
	// SafetyPoll. Off by default: gonuts v0.4.2's mint (and gonuts'
	// master of April 2025) panics ("send on closed channel",
	// mint/websocket.go:260) and dies when a subscriber's connection
	// closes while it is still sending (a subscription's initial quote
	// states, or a notification). capvend never closes its connection
	// that way itself (it unsubscribes and waits for the mint first), but
	// a network blip at that moment still takes such a mint down unless
	// something in front of it holds the connection, as the regtest
	// stack's mint does (testnet/mintws.go). Other mints are not
	// affected.
	Websocket bool
	// MaxBackoff caps the wait between attempts while the mint is
	// unreachable (default 5 s). Run's retries (loading the wallet, the
	// NUT-17 websocket) start at PollInterval and double up to it;
	// reconcile is retried every MaxBackoff; each wait is drawn between
	// half and all of its step (package internal/retry).
	MaxBackoff time.Duration
	// DefaultExpiry is used when a PaymentRequest has none (default 10
	// min). A request's expiry is capped at the mint quote's own.
	DefaultExpiry time.Duration
	// Log receives structured lines; nil discards.
	Log *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// HTTPClient makes capvend's own calls to the mint (quote state,
	// keysets, proof state); nil means a client with a 15 s timeout.
	// gonuts' wallet uses http.DefaultClient for its own calls; those to
	// the configured mints time out after MintCallTimeout (deadline.go).
	HTTPClient *http.Client
	// Failpoint, if set, is called at the named steps (FailAfterSwap,
	// FailAfterMint): between the mint's answer and its record. Crash
	// tests make it kill the process; production leaves it nil.
	Failpoint func(step string)
}

// Log attribute keys.
const (
	logRef     = "ref"
	logMint    = "mint"
	logCall    = "call"
	logAmount  = "amount_msat"
	logFee     = "fee_msat"
	logState   = "state"
	logErr     = "err"
	logBackoff = "backoff"
)

// Backend is the Cashu payment backend. Its methods are safe for concurrent
// use. Run owns the wallet's lifetime: when Run returns, the wallet is
// closed and later calls fail with ErrClosed.
type Backend struct {
	cfg    Config
	mints  []string // normalised, cfg.Mints order
	ledger vend.PaymentBook
	tl     tokenLedger // the same ledger: token swaps and refunds
	born   time.Time   // token payments open from before were a previous run's
	log    *slog.Logger
	now    func() time.Time
	http   *http.Client

	// wmu guards the wallet. gonuts' Wallet is not safe for concurrent
	// use: operations deriving secrets from the keyset counter (mint,
	// swap, send, melt) must never overlap or two would use the same
	// counter. RequestMint only reads its mint map and writes a quote to
	// bbolt, so it runs under the read lock.
	wmu    sync.RWMutex
	w      *wallet.Wallet
	wid    string // walletID(w), once loaded
	closed bool

	// refundMu serializes this process's payouts and their resolution:
	// held, no payout of this wallet is in flight here, so every one the
	// ledger has in flight was left by an earlier process.
	refundMu sync.Mutex
	// payoutsLeft: payouts of this wallet left in flight that Run could
	// not resolve yet (it tries again every SafetyPoll).
	payoutsLeft atomic.Bool

	// fees caches input_fee_ppk per keyset id, per mint.
	feeMu sync.Mutex
	fees  map[string]map[string]uint

	// The watch set of mint quotes; see watch.go.
	qmu     sync.Mutex
	watched map[string]*watchedQuote
	wake    chan struct{} // a NUT-17 notification: check urgent quotes now
	wsKick  chan struct{} // a quote was added: subscribe it
	running bool
	// caughtUp is closed once Run has reconciled the wallet with the
	// ledger and checked every quote it then watched once (CaughtUp).
	caughtUp     chan struct{}
	caughtUpOnce sync.Once
}

var (
	_ vend.PaymentBackend = (*Backend)(nil)
	_ vend.TokenAcceptor  = (*Backend)(nil)
	_ vend.RefundPayer    = (*Backend)(nil)
)

// Ledger is what the backend records into: payments (vend's PaymentBook),
// the swapping state of token proofs, and refunds. *ledger.Ledger
// implements it.
type Ledger interface {
	vend.PaymentBook
	tokenLedger
}

// New returns a Backend recording into l. It validates cfg and touches
// neither the mint nor the wallet file.
func New(cfg Config, l Ledger) (*Backend, error) {
	if l == nil {
		return nil, errors.New("cashu: nil ledger")
	}
	if len(cfg.Mints) == 0 {
		return nil, errors.New("cashu: no mint configured")
	}
	if cfg.WalletDir == "" {
		return nil, errors.New("cashu: no wallet directory configured")
	}
	b := &Backend{
		cfg:      cfg,
		ledger:   l,
		tl:       l,
		log:      cfg.Log,
		now:      cfg.Now,
		http:     cfg.HTTPClient,
		fees:     map[string]map[string]uint{},
		watched:  map[string]*watchedQuote{},
		wake:     make(chan struct{}, 1),
		caughtUp: make(chan struct{}),
		wsKick:   make(chan struct{}, 1),
	}
	seen := map[string]bool{}
	for _, m := range cfg.Mints {
		n, err := NormalizeMintURL(m)
		if err != nil {
			return nil, err
		}
		if !seen[n] {
			seen[n] = true
			b.mints = append(b.mints, n)
		}
	}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if b.now == nil {
		b.now = time.Now
	}
	// The ledger stamps milliseconds.
	b.born = b.now().Truncate(time.Millisecond)
	if b.http == nil {
		b.http = &http.Client{Timeout: 15 * time.Second}
	}
	if b.cfg.PollInterval <= 0 {
		b.cfg.PollInterval = 250 * time.Millisecond
	}
	if b.cfg.SafetyPoll <= 0 {
		b.cfg.SafetyPoll = 5 * time.Second
	}
	if b.cfg.MaxBackoff <= 0 {
		b.cfg.MaxBackoff = 5 * time.Second
	}
	if b.cfg.DefaultExpiry <= 0 {
		b.cfg.DefaultExpiry = 10 * time.Minute
	}
	return b, nil
}

// NormalizeMintURL returns the canonical form of a mint URL capvend uses
// everywhere (wallet keys, token checks, ledger accounts): scheme and host
// lower-case, no trailing slash, no query or fragment.
func NormalizeMintURL(s string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("cashu: mint URL %q: want http(s)://host[:port][/path]", s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("cashu: mint URL %q: no query, fragment or credentials allowed", s)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	u.Host = strings.ToLower(u.Host)
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u.String(), nil
}

// Backend implements vend.PaymentBackend.
func (b *Backend) Name() vend.Backend { return vend.BackendCashu }

// Mints returns the trusted mints, normalised, the quote mint first.
func (b *Backend) Mints() []string { return append([]string(nil), b.mints...) }

// loadWallet loads the wallet if it is not loaded. It contacts the mint
// (gonuts does on load). The caller must not hold wmu.
func (b *Backend) loadWallet() error {
	b.wmu.RLock()
	ok, closed := b.w != nil, b.closed
	b.wmu.RUnlock()
	if closed {
		return ErrClosed
	}
	if ok {
		return nil
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if b.w != nil {
		return nil
	}
	// gonuts opens the bbolt file without a timeout: a wallet held by
	// another process (or a Backend of this one still closing) would
	// block forever.
	if err := checkWalletFree(b.cfg.WalletDir); err != nil {
		return err
	}
	w, err := openWallet(b.cfg.WalletDir, b.mints)
	if err != nil {
		return err
	}
	b.w, b.wid = w, walletID(w)
	b.log.Info("cashu wallet loaded", logMint, b.mints[0], "wallet", b.wid)
	return nil
}

// openWallet loads the wallet in dir with mints[0] as its default mint and
// adds the other mints it does not know yet. Errors reaching a mint match
// ErrMintUnavailable.
func openWallet(dir string, mints []string) (*wallet.Wallet, error) {
	mintDeadlines.cover(MintCallTimeout, mints...)
	w, err := wallet.LoadWallet(wallet.Config{WalletPath: dir, CurrentMintURL: mints[0]})
	if err != nil {
		return nil, fmt.Errorf("%w: load wallet at %s: %v", ErrMintUnavailable, mints[0], err)
	}
	known := map[string]bool{}
	for _, m := range w.TrustedMints() {
		known[m] = true
	}
	for _, m := range mints[1:] {
		if known[m] {
			continue
		}
		// A secondary mint that is down must not stop capvend: its
		// tokens are refused until it is added (AcceptToken retries).
		_, _ = w.AddMint(m)
	}
	return w, nil
}

// withWallet runs fn holding the wallet exclusively, loading it first.
func (b *Backend) withWallet(fn func(w *wallet.Wallet) error) error {
	if err := b.loadWallet(); err != nil {
		return err
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.w == nil {
		return b.notLoaded()
	}
	defer b.slow("wallet operation")()
	return fn(b.w)
}

// slow logs a warning if the operation it starts takes over 10 s (each of
// gonuts' calls to the mint times out after MintCallTimeout).
func (b *Backend) slow(what string) (done func()) {
	t := time.AfterFunc(10*time.Second, func() {
		b.log.Warn("mint call slow", "op", what)
	})
	return func() { t.Stop() }
}

// withWalletShared runs fn holding the wallet shared (see wmu).
func (b *Backend) withWalletShared(fn func(w *wallet.Wallet) error) error {
	if err := b.loadWallet(); err != nil {
		return err
	}
	b.wmu.RLock()
	defer b.wmu.RUnlock()
	if b.w == nil {
		return b.notLoaded()
	}
	defer b.slow("wallet operation (shared)")()
	return fn(b.w)
}

// notLoaded is the error for a wallet that is not open; the caller holds
// wmu.
func (b *Backend) notLoaded() error {
	if b.closed {
		return ErrClosed
	}
	return fmt.Errorf("%w: the wallet is not loaded", ErrMintUnavailable)
}

// Close closes the wallet; later calls fail with ErrClosed. Run calls it
// when it returns. It is idempotent.
func (b *Backend) Close() error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.closed = true
	if b.w == nil {
		return nil
	}
	err := b.w.Shutdown()
	b.w = nil
	return err
}

// short abbreviates a payment ref for logs. A mint quote's id is a bearer
// secret until the quote is minted (whoever knows it can mint the paid
// ecash), so logs carry only a prefix, enough to find the ledger row.
func short(ref string) string {
	if len(ref) > 12 {
		return ref[:12] + "…"
	}
	return ref
}

// payer is the payer of the backend's wallet (payout.go), loading it.
func (b *Backend) payer() (*payer, error) {
	if err := b.loadWallet(); err != nil {
		return nil, err
	}
	b.wmu.RLock()
	id := b.wid
	b.wmu.RUnlock()
	if id == "" {
		return nil, b.notLoaded()
	}
	return &payer{with: b.withWallet, book: b.tl, wallet: id, mint: b, fail: b.cfg.Failpoint}, nil
}

// resolvePayouts ends the payouts this wallet left in flight (a capvend
// killed between paying and booking), from the mint's word (payout.go),
// and returns how many it could not end yet.
func (b *Backend) resolvePayouts(ctx context.Context) int {
	b.refundMu.Lock()
	defer b.refundMu.Unlock()
	p, err := b.payer()
	if err != nil {
		b.payoutsLeft.Store(true)
		return 1
	}
	ended, left, err := p.resolve(ctx)
	for _, po := range ended {
		b.log.Warn("payout left in flight resolved", "payout", int64(po.ID), "kind", string(po.Kind), logState, string(po.State),
			logAmount, int64(po.Amount), "reason", po.Reason)
	}
	if err != nil {
		b.log.Warn("payouts left in flight not resolved yet; tried again later", "payouts", left, logErr, err)
	}
	b.payoutsLeft.Store(left > 0 || err != nil)
	return left
}
