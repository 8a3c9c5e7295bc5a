package ctxvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
)

// Publishing: never silent. Each relay's answer to each event (OK, a
// refusal with its reason, no OK in time, a connection that failed) is
// counted per relay and reason class (PublishStats) and a refusal is
// logged with the relay's own words; an event no relay took is tried
// again, on every relay, with backoff, while a refusal may pass (a
// timeout, a lost connection, rate-limited, mute, error), within
// PublishTimeout; an event larger than a relay's advertised limit is not
// sent to it (the relay would close the connection, and go-nostr would
// report the lost OK as a success).

// Reason classes of a relay's failure to take an event: the NIP-01
// machine-readable prefixes of its OK false, and ours.
const (
	ReasonBlocked      = "blocked"
	ReasonInvalid      = "invalid"
	ReasonPoW          = "pow"
	ReasonRateLimited  = "rate-limited"
	ReasonRestricted   = "restricted"
	ReasonAuthRequired = "auth-required"
	ReasonMute         = "mute" // no one listens for the (ephemeral) event there
	ReasonError        = "error"
	ReasonTimeout      = "timeout"    // no OK within PublishTimeout
	ReasonConnection   = "connection" // not connected, or the connection closed before the OK
	ReasonTooLarge     = "too-large"  // over the relay's advertised limit: not sent
	ReasonOther        = "other"
)

// reasonClasses are the classes, for metrics.
var reasonClasses = []string{ReasonBlocked, ReasonInvalid, ReasonPoW, ReasonRateLimited, ReasonRestricted, ReasonAuthRequired,
	ReasonMute, ReasonError, ReasonTimeout, ReasonConnection, ReasonTooLarge, ReasonOther}

// transient says whether a failure of class may pass if the event is
// sent again.
func transient(class string) bool {
	switch class {
	case ReasonBlocked, ReasonInvalid, ReasonPoW, ReasonRestricted, ReasonAuthRequired, ReasonTooLarge:
		return false
	}
	return true
}

// RelayFailure is one relay's failure to take an event.
type RelayFailure struct {
	URL    string
	Class  string // one of the Reason constants
	Reason string // as the relay said it (or what happened)
}

// PublishError is an event no relay took: each relay's failure.
type PublishError struct {
	Failures []RelayFailure
}

func (e *PublishError) Error() string {
	parts := make([]string, 0, len(e.Failures))
	for _, f := range e.Failures {
		parts = append(parts, f.URL+": "+f.Reason)
	}
	if len(parts) == 0 {
		return "no relay to publish to"
	}
	return "no relay took the event: " + strings.Join(parts, "; ")
}

// transient says whether sending the event again may help: some relay's
// failure may pass.
func (e *PublishError) transient() bool {
	return slices.ContainsFunc(e.Failures, func(f RelayFailure) bool { return transient(f.Class) })
}

// tooLarge says whether every relay refused the event for its size.
func (e *PublishError) tooLarge() bool {
	return len(e.Failures) > 0 && !slices.ContainsFunc(e.Failures, func(f RelayFailure) bool { return f.Class != ReasonTooLarge })
}

// classify reads go-nostr's publication error of one relay.
func classify(url string, err error) *RelayFailure {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if reason, ok := strings.CutPrefix(msg, "msg: "); ok {
		prefix, _, _ := strings.Cut(reason, ":")
		switch prefix {
		case "duplicate":
			return nil // the relay has it
		case ReasonBlocked, ReasonInvalid, ReasonPoW, ReasonRateLimited, ReasonRestricted, ReasonAuthRequired, ReasonMute, ReasonError:
			return &RelayFailure{URL: url, Class: prefix, Reason: reason}
		}
		return &RelayFailure{URL: url, Class: ReasonOther, Reason: reason}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || strings.Contains(msg, "waiting for an OK") {
		return &RelayFailure{URL: url, Class: ReasonTimeout, Reason: "no OK in time"}
	}
	return &RelayFailure{URL: url, Class: ReasonConnection, Reason: msg}
}

// errConnectionLost: go-nostr's Publish returns nil when the connection
// closes before the relay's OK (a relay closes it on a message over its
// limit): an OK not seen is not an OK.
var errConnectionLost = errors.New("the connection closed before the relay's OK")

// publishPool publishes ev to every relay (but those whose advertised
// limit it exceeds) and returns nil on the first relay's OK (the others
// still get it, in the background, within PublishTimeout), or a
// *PublishError with each relay's failure. Frames of a transfer (a
// relayChain in ctx) reach each relay in order.
func (s *Server) publishPool(ctx context.Context, pool *nostr.SimplePool, ev nostr.Event) error {
	urls := s.relayURLs()
	size := s.eventSize(&ev, urls)
	// Until the first OK the caller's ctx bounds the publication; after
	// it only the timeout does: callers cancel their ctx once we return.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PublishTimeout)
	stop := context.AfterFunc(ctx, cancel)
	chain, _ := ctx.Value(chainKey{}).(*relayChain)
	results := make(chan relayOutcome, len(urls))
	for _, url := range urls {
		if lim, ok := s.info.advertised(url); ok && !lim.Fits(size) {
			results <- relayOutcome{url, &RelayFailure{URL: url, Class: ReasonTooLarge,
				Reason: fmt.Sprintf("an event of %d bytes is over its max_message_length %d (max_content_length %d): not sent", size.Message, lim.Message, lim.Content)}}
			continue
		}
		prev, mine := chain.next(url)
		to := func() {
			defer close(mine)
			select {
			case <-prev:
			case <-pctx.Done():
				results <- relayOutcome{url, &RelayFailure{URL: url, Class: ReasonTimeout, Reason: "no OK in time (an earlier frame was still on its way)"}}
				return
			}
			relay, err := pool.EnsureRelay(url)
			if err == nil {
				err = relay.Publish(pctx, ev)
				if err == nil && !relay.IsConnected() {
					err = errConnectionLost
				}
			}
			fail := classify(url, err)
			if fail != nil && fail.Class == ReasonConnection && size.Message > oversized.DefaultThreshold {
				// Relays close the connection on a message over their
				// limit, advertised or not: taken as that, and the relay
				// gets no events over DefaultThreshold for a while.
				s.info.learn(url, oversized.DefaultThreshold)
				fail = &RelayFailure{URL: url, Class: ReasonTooLarge, Reason: fmt.Sprintf(
					"it closed the connection on an event of %d bytes, taken as over a limit it does not advertise (%s)", size.Message, fail.Reason)}
			}
			results <- relayOutcome{url, fail}
		}
		if len(urls) == 1 {
			to() // the caller waits for it anyway
		} else {
			go to()
		}
	}
	var fails []RelayFailure
	for i := range urls {
		r := <-results
		s.pubs.note(s.log, r, ev.Kind)
		if r.fail == nil {
			// The caller goes on; the other relays still get the event
			// (a relay still connecting too), within the timeout.
			stop()
			left := len(urls) - i - 1
			go func() {
				defer cancel()
				for range left {
					s.pubs.note(s.log, <-results, ev.Kind)
				}
			}()
			return nil
		}
		fails = append(fails, *r.fail)
	}
	stop()
	cancel()
	return &PublishError{Failures: fails}
}

// eventSize is ev's size as published to urls. It encodes ev only when
// a bound (the envelope and names, and every character of the content
// and tags escaped to six) might be over a limit that matters: a relay's
// advertised one, or DefaultThreshold (a connection lost on an event
// larger than that is taken for a limit; see publishPool). Encoding
// every answer twice (here and by go-nostr's Publish) was 2 % of
// capvend's CPU per free call.
func (s *Server) eventSize(ev *nostr.Event, urls []string) oversized.Size {
	bound := 512 + 6*len(ev.Content) // the envelope, id, pubkey, sig, kind, created_at, names
	for _, t := range ev.Tags {
		bound += 3
		for _, v := range t {
			bound += 3 + 6*len(v)
		}
	}
	size := oversized.Size{Message: bound, Content: len(ev.Content)}
	fits := bound <= oversized.DefaultThreshold
	for _, url := range urls {
		if lim, ok := s.info.advertised(url); ok && !lim.Fits(size) {
			fits = false
		}
	}
	if !fits {
		env, _ := nostr.EventEnvelope{Event: *ev}.MarshalJSON()
		size.Message = len(env)
	}
	return size
}

// relayURLs are the configured relays, each once.
func (s *Server) relayURLs() []string {
	out := make([]string, 0, len(s.cfg.Relays))
	for _, u := range s.cfg.Relays {
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// relayOutcome is one relay's answer to one event (fail nil: it took it).
type relayOutcome struct {
	url  string
	fail *RelayFailure
}

// publishBackoff is the wait before the second attempt of an event no
// relay took; it doubles after each.
const publishBackoff = 250 * time.Millisecond

// publishRetry publishes ev and, while no relay took it and a failure
// may pass, publishes it again after a backoff, until PublishTimeout
// from now. It returns the last attempt's error.
func (s *Server) publishRetry(ctx context.Context, ev nostr.Event) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	wait := publishBackoff
	for {
		err := s.publish(ctx, ev)
		var pe *PublishError
		if err == nil || !errors.As(err, &pe) || !pe.transient() {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return err
		}
		s.sleep(ctx, wait)
		if ctx.Err() != nil {
			return err
		}
		wait *= 2
	}
}

// relayChain orders the publications of one transfer's frames on each
// relay: a frame goes to a relay once the previous one got its answer
// there (the stock receiver drops a chunk that comes before its start).
// The nil chain orders nothing.
type relayChain struct {
	mu   sync.Mutex
	last map[string]chan struct{}
}

type chainKey struct{}

// closedChan is a channel that is closed.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// next returns what a publication to url waits for (the previous one's
// end) and the channel it closes at its own end.
func (c *relayChain) next(url string) (prev <-chan struct{}, mine chan struct{}) {
	mine = make(chan struct{})
	if c == nil {
		return closedChan, mine
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]chan struct{}{}
	}
	prev = c.last[url]
	if prev == nil {
		prev = closedChan
	}
	c.last[url] = mine
	return prev, mine
}

// RelayPublishStatus is how one relay takes the server's events (see
// PublishStats).
type RelayPublishStatus struct {
	URL      string
	Accepted uint64            // events it took
	Failed   map[string]uint64 // events it did not take, by reason class
	// LastRefusal is its last refusal (an OK false), in its words, and
	// when.
	LastRefusal   string
	LastRefusalAt time.Time
	// Refusing: its last answer to one of our events was a refusal (an
	// OK false but mute, which says only that no one listened there;
	// not a timeout, a lost connection or an event over its limit).
	Refusing bool
	// MaxMessage and MaxContent are its advertised limits (NIP-11), 0
	// when it advertises none or was not asked yet.
	MaxMessage, MaxContent int
}

// PublishStats are the counts of the server's publications: per relay,
// and of the answers and transfers.
type PublishStats struct {
	Relays []RelayPublishStatus
	// Undelivered counts answers no relay took (each then replaced by a
	// small error answer, when one could go).
	Undelivered uint64
	// TransfersOut and TransfersOutFailed count CEP-22 transfers of
	// answers (and notifications) sent, and given up; TransfersIn and
	// TransfersInFailed those of requests received, and failed.
	TransfersOut, TransfersOutFailed, TransfersIn, TransfersInFailed uint64
}

// publishStats is the state behind PublishStats.
type publishStats struct {
	mu     sync.Mutex
	relays map[string]*relayPub
	PublishStats
}

type relayPub struct {
	RelayPublishStatus
	logged map[string]time.Time // class: when its last refusal was logged at Warn
}

// logEvery is how often a relay's refusals of one class are logged at
// Warn (others at Debug; every one is counted).
const logEvery = 10 * time.Second

// note counts one relay's outcome for an event of kind, and logs a
// refusal.
func (p *publishStats) note(log *slog.Logger, r relayOutcome, kind int) {
	p.mu.Lock()
	st := p.relay(r.url)
	now := time.Now()
	warn := false
	if r.fail == nil {
		st.Accepted++
		st.Refusing = false
	} else {
		st.Failed[r.fail.Class]++
		switch r.fail.Class {
		case ReasonMute:
		case ReasonTimeout, ReasonConnection, ReasonTooLarge:
			warn = now.Sub(st.logged[r.fail.Class]) >= logEvery
		default:
			st.LastRefusal, st.LastRefusalAt = r.fail.Reason, now
			st.Refusing = true
			warn = now.Sub(st.logged[r.fail.Class]) >= logEvery
		}
		if warn {
			st.logged[r.fail.Class] = now
		}
	}
	p.mu.Unlock()
	if r.fail == nil {
		return
	}
	lvl := slog.LevelDebug
	if warn {
		lvl = slog.LevelWarn
	}
	log.Log(context.Background(), lvl, "nostr relay did not take our event", logKeyRelay, r.url, logKeyReason, r.fail.Reason,
		"class", r.fail.Class, "kind", kind)
}

// relay is url's state, made on first use (under p.mu).
func (p *publishStats) relay(url string) *relayPub {
	if p.relays == nil {
		p.relays = map[string]*relayPub{}
	}
	st := p.relays[url]
	if st == nil {
		st = &relayPub{RelayPublishStatus: RelayPublishStatus{URL: url, Failed: map[string]uint64{}}, logged: map[string]time.Time{}}
		p.relays[url] = st
	}
	return st
}

// count adds 1 to one of the totals.
func (p *publishStats) count(field *uint64) {
	p.mu.Lock()
	*field++
	p.mu.Unlock()
}

// PublishStats returns the counts of the server's publications since it
// was made, each configured relay in Config.Relays' order. A copy.
func (s *Server) PublishStats() PublishStats {
	s.pubs.mu.Lock()
	defer s.pubs.mu.Unlock()
	out := s.pubs.PublishStats
	out.Relays = nil
	for _, u := range s.relayURLs() {
		st := s.pubs.relay(u).RelayPublishStatus
		st.Failed = make(map[string]uint64, len(st.Failed))
		for k, v := range s.pubs.relays[u].Failed {
			st.Failed[k] = v
		}
		if lim, ok := s.info.advertised(u); ok {
			st.MaxMessage, st.MaxContent = lim.Message, lim.Content
		}
		out.Relays = append(out.Relays, st)
	}
	return out
}

// ReasonClasses are the reason classes of RelayPublishStatus.Failed, for
// metrics (a fixed set).
func ReasonClasses() []string { return slices.Clone(reasonClasses) }

// Relay information (NIP-11): each relay's advertised limits, fetched
// when first needed and kept.
const (
	// relayInfoFor is how long a relay's fetched limits are kept;
	// relayInfoRetry how long a failed fetch is (the default limits
	// apply meanwhile).
	relayInfoFor   = time.Hour
	relayInfoRetry = time.Minute
	// relayInfoTimeout bounds one fetch.
	relayInfoTimeout = 3 * time.Second
)

// relayInfo caches relays' NIP-11 limits.
type relayInfo struct {
	mu sync.Mutex
	m  map[string]*relayLimits
	// fetch reads a relay's limits (tests replace it); nil: NIP-11 over
	// HTTP.
	fetch func(ctx context.Context, url string) (oversized.Limits, error)
}

type relayLimits struct {
	mu     sync.Mutex // one fetch at a time
	limits oversized.Limits
	at     time.Time
	failed bool
	// learned is a message limit learned from a connection the relay
	// closed on a larger event (0: none), since learnedAt.
	learned   int
	learnedAt time.Time
}

// entry is url's entry, made on first use.
func (ri *relayInfo) entry(url string) *relayLimits {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if ri.m == nil {
		ri.m = map[string]*relayLimits{}
	}
	e := ri.m[url]
	if e == nil {
		e = &relayLimits{}
		ri.m[url] = e
	}
	return e
}

// learn notes that url takes no message over n bytes (for relayInfoFor).
func (ri *relayInfo) learn(url string, n int) {
	e := ri.entry(url)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.learned, e.learnedAt = n, time.Now()
}

// effective is e's limits with what was learned (under e.mu).
func (e *relayLimits) effective() oversized.Limits {
	lim := e.limits
	if e.learned > 0 && time.Since(e.learnedAt) < relayInfoFor && (lim.Message <= 0 || e.learned < lim.Message) {
		lim.Message = e.learned
	}
	return lim
}

// get returns url's advertised limits (zero fields: none advertised), or
// a smaller message limit learned lately, fetching them when not known
// or stale; a fetch that fails leaves none.
func (ri *relayInfo) get(ctx context.Context, url string) oversized.Limits {
	e := ri.entry(url)
	ri.mu.Lock()
	fetch := ri.fetch
	ri.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	keep := relayInfoFor
	if e.failed {
		keep = relayInfoRetry
	}
	if !e.at.IsZero() && time.Since(e.at) < keep {
		return e.effective()
	}
	if fetch == nil {
		fetch = fetchLimits
	}
	fctx, cancel := context.WithTimeout(ctx, relayInfoTimeout)
	lim, err := fetch(fctx, url)
	cancel()
	e.limits, e.at, e.failed = lim, time.Now(), err != nil
	return e.effective()
}

// advertised returns url's limits if it advertised any, or closed a
// connection on a large event lately (without fetching).
func (ri *relayInfo) advertised(url string) (oversized.Limits, bool) {
	ri.mu.Lock()
	e := ri.m[url]
	ri.mu.Unlock()
	if e == nil || !e.mu.TryLock() {
		return oversized.Limits{}, false // unknown, or being fetched
	}
	defer e.mu.Unlock()
	lim := e.effective()
	return lim, lim.Message > 0 || lim.Content > 0
}

// fetchLimits reads a relay's NIP-11 limitation.
func fetchLimits(ctx context.Context, url string) (oversized.Limits, error) {
	info, err := nip11.Fetch(ctx, url)
	if err != nil {
		return oversized.Limits{}, err
	}
	if info.Limitation == nil {
		return oversized.Limits{}, nil
	}
	return oversized.Limits{Message: max(info.Limitation.MaxMessageLength, 0), Content: max(info.Limitation.MaxContentLength, 0)}, nil
}

// sendLimits are the limits every event sent whole must fit to go
// through every relay without being split: each relay's advertised
// limits, or DefaultThreshold for one that advertises none; the
// smallest of each.
func (s *Server) sendLimits(ctx context.Context) oversized.Limits {
	var out oversized.Limits
	for _, u := range s.relayURLs() {
		lim := s.info.get(ctx, u)
		if lim.Message <= 0 {
			lim.Message = oversized.DefaultThreshold
		}
		if out.Message == 0 || lim.Message < out.Message {
			out.Message = lim.Message
		}
		if lim.Content > 0 && (out.Content == 0 || lim.Content < out.Content) {
			out.Content = lim.Content
		}
	}
	return out
}

// fetchRelayInfo reads every relay's limits (Run calls it at start, so
// that the first answers do not wait for them).
func (s *Server) fetchRelayInfo(ctx context.Context) {
	var wg sync.WaitGroup
	for _, u := range s.relayURLs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.info.get(ctx, u)
		}()
	}
	wg.Wait()
}
