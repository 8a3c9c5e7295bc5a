package ctxvm

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
)

// Members keeps the live set of the servers sharing a secret key (and a
// ledger): each holds a lease named MemberLease(pubkey, instance) while it
// runs. The ledger implements it.
type Members interface {
	// TakeLease takes or renews holder's lease name for ttl.
	TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// ReleaseLease ends holder's lease name now.
	ReleaseLease(ctx context.Context, name, holder string) error
	// LeaseHolders returns the holders of the running leases whose name
	// starts with prefix, sorted.
	LeaseHolders(ctx context.Context, prefix string) ([]string, error)
}

// memberPrefix is the name prefix of the member leases of the servers of
// pubkey: only servers with the same key share its requests.
func memberPrefix(pubkey string) string { return "nostr:" + pubkey + ":" }

// MemberLease is the name of instance's member lease among the servers
// of pubkey.
func MemberLease(pubkey, instance string) string { return memberPrefix(pubkey) + instance }

// Shard defaults (see Config.ShardSample and Config.MemberTTL).
const (
	DefaultShardSample = time.Second
	DefaultMemberTTL   = 30 * time.Second
)

// verdict is how a server treats one request under the shard.
type verdict int

const (
	skip       verdict = iota // another server's: dropped, nothing written
	serveFree                 // ours, steady state: served without a claim
	serveClaim                // ours during a membership change: claimed first
)

// shard is this server's view of the live servers sharing its key: the
// sorted member set read from the ledger every sample, and since when it
// is unchanged. See docs/CONTEXTVM.md, "Several servers, one key", for
// why the decisions in decide answer each request once.
type shard struct {
	m      Members
	me     string
	name   string        // this server's member lease
	prefix string        // of the member leases of the servers sharing the key
	sample time.Duration // between reads of the member set
	ttl    time.Duration // of this server's member lease
	now    func() time.Time
	log    *slog.Logger

	mu        sync.Mutex
	view      []string  // the live members, sorted; nil before the first read
	prev      []string  // the view before view (nil: none known, as a joiner)
	since     time.Time // when view was first read (the read's end)
	lastStart time.Time // when the last read that succeeded started
	lastEnd   time.Time // and ended
	renewed   time.Time // when the last renewal of the member lease that held started
	leaving   bool      // the lease released: see leave
	dropping  bool      // requests are dropped as the view is stale (logged once)
}

// fresh is how old the last read of the member set may be (its start)
// for this server to decide; every live server reads at least this often.
func (sh *shard) fresh() time.Duration { return 3 * sh.sample }

// stable is how long a view must be unchanged before its requests are
// served without a claim.
func (sh *shard) stable() time.Duration { return 3 * sh.fresh() }

// owner is the member that serves id under view: rendezvous hashing
// (the member with the highest hash of member and id), so that a member
// joining or leaving moves only the requests it gains or had.
func owner(view []string, id string) string {
	var best string
	var top uint64
	for _, m := range view {
		h := sha256.Sum256([]byte(m + "\x00" + id))
		if v := binary.BigEndian.Uint64(h[:8]); best == "" || v > top {
			best, top = m, v
		}
	}
	return best
}

// read reads the member set once and updates the view; a read that fails
// leaves the view as it was, and it grows stale (see decide).
func (sh *shard) read(ctx context.Context) error {
	start := sh.now()
	view, err := sh.m.LeaseHolders(ctx, sh.prefix)
	if err != nil {
		return err
	}
	end := sh.now()
	sh.mu.Lock()
	gap := end.Sub(sh.lastStart)
	late := !sh.lastEnd.IsZero() && gap > sh.fresh()
	if sh.lastEnd.IsZero() || late || !slices.Equal(view, sh.view) {
		// A changed view, or a gap in the reads (the member set may have
		// changed and changed back unseen): its age starts now. At the
		// first read the view before is unknown (a joiner); after a gap it
		// is taken as the view read now: this server stayed a member (its
		// lease held, see renew), so what it owns now it owned before the
		// last change, or its owner left (see docs/CONTEXTVM.md).
		switch {
		case sh.lastEnd.IsZero():
			sh.prev = nil
		case late:
			sh.prev = view
		default:
			sh.prev = sh.view
		}
		sh.view, sh.since = view, end
	}
	sh.lastStart, sh.lastEnd = start, end
	sh.mu.Unlock()
	if late {
		// The machine or the ledger stalled: requests arriving in the
		// gap were dropped (see decide), and the ones of the next T are
		// claimed, a write each.
		sh.log.Warn("nostr member set read late: requests are claimed until the view is stable again",
			"since_last_read", gap.Round(time.Millisecond), "fresh", sh.fresh())
	}
	return nil
}

// join takes this server's member lease and reads the member set (Run
// calls it before subscribing).
func (sh *shard) join(ctx context.Context) error {
	if err := sh.renew(ctx); err != nil {
		return err
	}
	return sh.read(ctx)
}

// renew takes or renews the member lease. If it had run out (the renewal
// is late: this server stalled, or the ledger was unreachable), the
// others may have counted this server out and back in unseen: its view
// starts again, as a joiner's.
func (sh *shard) renew(ctx context.Context) error {
	start := sh.now()
	held, err := sh.m.TakeLease(ctx, sh.name, sh.me, sh.ttl)
	if err == nil && !held {
		err = errors.New("another instance holds this instance's member lease")
	}
	if err != nil {
		return err
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.renewed.IsZero() && start.Sub(sh.renewed) >= sh.ttl-sh.fresh() {
		sh.prev, sh.since = nil, sh.now()
	}
	sh.renewed = start
	return nil
}

// prevFor is how long a server serves the requests it owned under its
// view before the change (by claim): F, until the new owners serve them;
// a server leaving, one sample more, as the others may have seen its
// leaving up to a sample after it.
func (sh *shard) prevFor() time.Duration {
	if sh.leaving {
		return sh.fresh() + sh.sample
	}
	return sh.fresh()
}

// leave releases the member lease and reads the member set, and returns
// how long this server should go on reading requests: it serves its own
// (by claim) until the others serve them (see prevFor).
func (sh *shard) leave(ctx context.Context) time.Duration {
	sh.mu.Lock()
	sh.leaving = true
	sh.mu.Unlock()
	if err := sh.m.ReleaseLease(ctx, sh.name, sh.me); err != nil {
		return 0 // the others count this one out when the lease runs out
	}
	if err := sh.read(ctx); err != nil {
		return 0
	}
	return sh.fresh() + sh.sample
}

// decide says how this server treats the request with event id id now.
// The first request it drops for a stale view is logged.
func (sh *shard) decide(id string) verdict {
	now := sh.now()
	sh.mu.Lock()
	v, stale := sh.decideLocked(id, now)
	first := stale && !sh.dropping && !sh.lastEnd.IsZero()
	sh.dropping = stale
	lastStart, renewed := sh.lastStart, sh.renewed
	sh.mu.Unlock()
	if first {
		sh.log.Warn("nostr requests dropped: this instance's view of the members is stale; the clients ask again",
			"since_last_read", now.Sub(lastStart).Round(time.Millisecond), "since_renewal", now.Sub(renewed).Round(time.Millisecond),
			"fresh", sh.fresh())
	}
	return v
}

// decideLocked is decide under sh.mu; stale says the view is too old to
// decide on.
func (sh *shard) decideLocked(id string, now time.Time) (v verdict, stale bool) {
	if sh.lastEnd.IsZero() || now.Sub(sh.lastStart) > sh.fresh() || now.Sub(sh.renewed) >= sh.ttl-sh.fresh() {
		// A stale view (another server may own it by now), or this
		// server's lease is running out: the others may count it out.
		return skip, true
	}
	age := now.Sub(sh.since)
	switch {
	case owner(sh.view, id) == sh.me && age >= sh.stable():
		return serveFree, false
	case owner(sh.view, id) == sh.me && age >= sh.fresh():
		return serveClaim, false // every live server has read this view by now
	case age < sh.prevFor() && owner(sh.prev, id) == sh.me:
		return serveClaim, false // ours before the change: others may not know it yet
	case age < sh.fresh() && sh.prev == nil && len(sh.view) == 1 && sh.view[0] == sh.me:
		// Alone (a first instance starting): nobody else serves; one
		// joining now waits F, and this one sees it join within F.
		return serveClaim, false
	}
	return skip, false
}

// run renews the member lease every ttl/3 (until leave) and reads the
// member set every sample until ctx ends, then releases the lease.
func (sh *shard) run(ctx context.Context, s *Server) {
	name := sh.name
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := sh.m.ReleaseLease(rctx, name, sh.me); err != nil {
			s.log.Warn("releasing the nostr member lease", logKeyErr, err)
		}
	}()
	read := time.NewTicker(sh.sample)
	defer read.Stop()
	renew := time.NewTicker(sh.ttl / 3)
	defer renew.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			sh.mu.Lock()
			leaving := sh.leaving
			sh.mu.Unlock()
			if leaving {
				continue
			}
			if err := sh.renew(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("renewing the nostr member lease", logKeyErr, err)
			}
		case <-read.C:
			if err := sh.read(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("reading the nostr members", logKeyErr, err)
			}
		}
	}
}

// preShard decides a plaintext request before its signature is checked:
// its event id is its request key. It returns false when the event is
// another server's (dropped), and the verdict to keep otherwise;
// responses (to our elicitations), gift wraps and anything unreadable are
// left to the full checks (verdict -1: decide after parsing).
func (s *Server) preShard(ev *nostr.Event) (verdict, bool) {
	if s.shard == nil || ev == nil {
		return -1, true
	}
	switch ev.Kind {
	case KindJobRequest:
	case KindMessage:
		var m struct {
			Method string `json:"method"`
		}
		if json.Unmarshal([]byte(ev.Content), &m) != nil || m.Method == "" {
			return -1, true
		}
		if m.Method == oversized.Method {
			// Maybe a CEP-22 frame: every server reassembles the
			// request, which is decided by its own id (the end frame's).
			return -1, true
		}
	default:
		return -1, true
	}
	v := s.shard.decide(ev.ID)
	return v, v != skip
}

// startShard joins the servers sharing the key and keeps the member set
// read; without Members it does nothing. It returns the context to read
// requests in: with a shard it ends after the leave (see shard.leave)
// that follows ctx's end, so that this server's requests are served
// until the others serve them. stop ends it all.
func (s *Server) startShard(ctx context.Context) (read context.Context, stop func(), err error) {
	if s.shard == nil {
		return ctx, func() {}, nil
	}
	// Joined before subscribing: the others count this server in before
	// it reads any request.
	if err := s.shard.join(ctx); err != nil {
		return nil, nil, fmt.Errorf("ctxvm: joining the servers sharing the key: %w", err)
	}
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	read, stopRead := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.shard.run(runCtx, s) }()
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
		case <-read.Done():
			return
		}
		t := time.NewTimer(s.shard.leave(read))
		defer t.Stop()
		select {
		case <-t.C:
		case <-read.Done():
		}
		stopRead()
	}()
	return read, func() { stopRead(); stopRun(); wg.Wait() }, nil
}
