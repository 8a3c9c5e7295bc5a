package cli

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/internal/testkit"
)

// shardRun is a load of tools/list requests from one client over the
// relay to the capvend instances sharing one key and one PostgreSQL
// ledger. Each instance sells its example tools with its own prefix, so
// a tools/list answer names the instance that answered it.
type shardRun struct {
	t          *testing.T
	relay, sk  string // the relay's URL, the instances' shared key
	server     string // its public key
	db         *sql.DB
	c          *loadClient
	answers    *answerCounter
	unanswered atomic.Int64

	mu      sync.Mutex
	started []*capvendtest.Capvend // every instance, in order
}

// newShardRun starts a relay for instances sharding on the PostgreSQL
// ledger of dsn (see start), opened for the test's own queries.
func newShardRun(t *testing.T, dsn string) *shardRun {
	sk := nostr.GeneratePrivateKey()
	server, _ := nostr.GetPublicKey(sk)
	return &shardRun{t: t, relay: testkit.Relay(t), sk: sk, server: server, db: capvendtest.OpenPG(t, dsn)}
}

// start runs an instance selling its example tools with prefix, on the
// ledger of dsn, sampling the member set every 500 ms: F is 1.5 s, and
// changes settle in 4.5 s (T), not 9 s.
func (r *shardRun) start(prefix, dsn string) (stop func()) {
	path, _ := capvendtest.NostrToolsConfig(r.t, r.relay, r.sk, prefix)
	capvendtest.OnPostgres(r.t, path, dsn)
	capvendtest.EditConfig(r.t, path, "\nnostr:\n", "\nnostr:\n  shard: true\n  shard_sample: 500ms\n")
	sv := startCapvend(r.t, path)
	r.mu.Lock()
	r.started = append(r.started, sv)
	r.mu.Unlock()
	return sv.Stop
}

// connect starts the client and the answer counter, and returns once a
// tools/list was answered.
func (r *shardRun) connect() {
	r.t.Helper()
	r.c = newLoadClient(r.t, r.relay, r.server)
	r.answers = countAnswers(r.t, r.relay, r.server, r.c.SecretKey)
	for deadline := time.Now().Add(time.Minute); ; { // a hang guard
		// Each instance says "serving ContextVM" once subscribed (see
		// TestServingLineMeansSubscribed); a sharding instance may still
		// drop a request while its first view of the members is young:
		// the client asks again.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.c.call(ctx, "tools/list", `{}`)
		dropped := ctx.Err() != nil
		cancel()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "no one was listening") && !dropped || time.Now().After(deadline) {
			r.t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// claims counts the request claims written.
func (r *shardRun) claims() int {
	var n int
	if err := r.db.QueryRow("SELECT count(*) FROM request_claims").Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// answeredOnce fails the test if a request was answered more than once.
func (r *shardRun) answeredOnce() map[string]int {
	r.t.Helper()
	counts := r.answers.settle(r.t, &cvmClient{t: r.t, c: r.c.Client}, r.c.PublicKey)
	for id, n := range counts {
		if n != 1 {
			r.t.Errorf("request %s answered %d times", id, n)
		}
	}
	return counts
}

// list makes one tools/list and returns the prefix of the instance that
// answered, or "" when it was left unanswered (dropped by every
// instance; see dropsExplained).
func (r *shardRun) list(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second) // far longer than any answer takes: a drop guard
	defer cancel()
	out, err := r.c.call(ctx, "tools/list", `{}`)
	if err != nil {
		r.unanswered.Add(1)
		r.t.Logf("tools/list unanswered: %v", err)
		return ""
	}
	for _, p := range []string{"a_", "b_", "c_"} {
		if strings.Contains(out, `"name":"`+p) {
			return p
		}
	}
	r.t.Errorf("tools/list answered %s", out)
	return ""
}

// stalls counts the instances' warnings that their view of the members
// went stale or was read late: the machine (or PostgreSQL) stalled an
// instance for longer than F. Then, by design (docs/CONTEXTVM.md,
// "Several servers, one key"), the requests it owned in the gap are
// dropped and those of the next T claimed. Nothing else drops one.
func (r *shardRun) stalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, sv := range r.started {
		text := sv.Logs()
		n += strings.Count(text, logLate) + strings.Count(text, logStale)
	}
	return n
}

// shardMark is where a phase of the test began.
type shardMark struct {
	stalls, claims int
	unanswered     int64
}

func (r *shardRun) mark() shardMark {
	return shardMark{stalls: r.stalls(), claims: r.claims(), unanswered: r.unanswered.Load()}
}

// dropsExplained fails the test if requests went unanswered since m
// while no instance stalled.
func (r *shardRun) dropsExplained(what string, m shardMark) {
	r.t.Helper()
	n := r.unanswered.Load() - m.unanswered
	switch {
	case n == 0:
	case r.stalls() > m.stalls:
		r.t.Logf("%s: %d requests unanswered while an instance stalled (its log says so); the clients ask again", what, n)
	default:
		r.t.Errorf("%s: %d requests unanswered, and no instance stalled", what, n)
	}
}

// batch makes n lists, 8 at a time, and returns who answered how many.
func (r *shardRun) batch(n int) map[string]int {
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				p := r.list(context.Background())
				mu.Lock()
				got[p]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return got
}

// steady makes batches until one writes no claim, leaves nothing
// unanswered (the instances' views of each other are stable) and every
// one of want answered in it.
func (r *shardRun) steady(want ...string) {
	r.t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a hang guard
	for {
		m := r.mark()
		got := r.batch(40)
		ok := r.claims() == m.claims && r.unanswered.Load() == m.unanswered
		for _, p := range want {
			ok = ok && got[p] > 0
		}
		if ok || r.t.Failed() {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no steady state: a batch answered %v and wrote %d claims", got, r.claims()-m.claims)
		}
		// The views settle in T (4.5 s): a pause, not a batch after
		// batch, until then (each request costs every instance).
		time.Sleep(time.Second)
	}
}

// steadyBatch checks the steady state of a and b: 200 requests, each
// answered, a share by each, and no claim written. A batch that
// overlapped a stall (see stalls) is made again once the views are
// stable again, up to 5 times.
func (r *shardRun) steadyBatch() {
	r.t.Helper()
	for attempt := 1; ; attempt++ {
		m := r.mark()
		got := r.batch(200)
		claims, dropped := r.claims()-m.claims, r.unanswered.Load()-m.unanswered
		if claims == 0 && dropped == 0 && got["a_"] > 0 && got["b_"] > 0 {
			return
		}
		if r.stalls() == m.stalls || attempt == 5 {
			r.t.Errorf("steady state: %d claims written and %d requests unanswered of 200 (answers by instance %v; %d stall warnings), want none, and a share each",
				claims, dropped, got, r.stalls()-m.stalls)
			return
		}
		r.t.Logf("steady state: batch %d overlapped a stall (%d claims, %d unanswered, answers %v): again", attempt, claims, dropped, got)
		r.steady("a_", "b_")
	}
}

// keepListing makes tools/list requests from 4 goroutines, each waiting
// up to wait for its answer, until the returned stop is called.
func (r *shardRun) keepListing(wait time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				r.list(ctx)
				cancel()
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

// logged counts text in the log of the i-th instance started.
func (r *shardRun) logged(i int, text string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Count(r.started[i].Logs(), text)
}

// waitLogged waits until the i-th instance's log holds text more than n
// times, at most 30 s.
func (r *shardRun) waitLogged(i int, text string, n int) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a hang guard
	for r.logged(i, text) <= n {
		if time.Now().After(deadline) {
			r.t.Fatalf("instance %d never logged %q", i, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ghostGone says whether the ghost's member lease ran out.
func (r *shardRun) ghostGone() bool {
	var n int
	err := r.db.QueryRow("SELECT count(*) FROM leases WHERE name = $1 AND expires_at > $2",
		ctxvm.MemberLease(r.server, "ghost"), time.Now().UnixMilli()).Scan(&n)
	if err != nil {
		r.t.Fatal(err)
	}
	return n == 0
}

// TestNostrInstancesShareRequests runs capvend serve instances on one
// PostgreSQL and one relay with the same Nostr key: in steady state each
// request is answered once, each instance answers a share, and no claim
// is written; while a third instance joins, and then stops, under load no
// request is answered twice or left unanswered; and the requests of an
// instance that died (a member lease nobody renews) are served once its
// lease ran out. An instance stalled by the machine for longer than F
// drops requests by design, and says so in its log: the test then makes
// a steady-state batch again, and lets a drop pass (see stalls).
func TestNostrInstancesShareRequests(t *testing.T) {
	skip.Short(t, "starts PostgreSQL and three capvend instances")
	t.Parallel()
	dsn := capvendtest.Postgres(t)
	r := newShardRun(t, dsn)
	r.start("a_", dsn)
	r.start("b_", dsn)
	r.connect()
	ctx := context.Background()
	m := r.mark()
	r.steady("a_", "b_")
	r.dropsExplained("a and b starting", m)
	t.Log("a and b steady")
	r.steadyBatch()

	// c joins while requests keep coming.
	m = r.mark()
	stopLoad := r.keepListing(20 * time.Second)
	stopC := r.start("c_", dsn)
	r.steady("a_", "b_", "c_")
	t.Log("c joined; a, b and c steady")
	stopC() // c leaves, while requests keep coming
	r.steady("a_", "b_")
	stopLoad()
	r.dropsExplained("c joining and leaving", m)
	t.Log("c left; a and b steady")

	// An instance that died: its member lease runs on for 8 s, unrenewed.
	if _, err := r.db.ExecContext(ctx, "INSERT INTO leases (name, holder, expires_at) VALUES ($1, 'ghost', $2)",
		ctxvm.MemberLease(r.server, "ghost"), time.Now().Add(8*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	lost := 0
	deadline := time.Now().Add(2 * time.Minute) // a hang guard
	for ok := 0; ok < 40; {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := r.c.call(lctx, "tools/list", `{}`)
		cancel()
		switch {
		case err != nil:
			lost, ok = lost+1, 0 // the ghost's: the client asks again
		case r.ghostGone():
			ok++
		default:
			time.Sleep(50 * time.Millisecond) // its lease runs for 8 s: a request now and then
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead instance's requests were never taken over (%d unanswered)", lost)
		}
	}
	if lost == 0 {
		t.Error("no request went to the dead instance: was it counted in?")
	}
	counts := r.answeredOnce()
	t.Logf("%d requests answered, %d claims written (membership changes only), %d went to the dead instance", len(counts), r.claims(), lost)
}

// The shard's warnings (ctxvm): an instance whose view of the members is
// stale drops requests; one that reads them again after a gap claims.
const (
	logStale = "view of the members is stale"
	logLate  = "member set read late"
)

// TestNostrShardRidesOutALedgerOutage cuts one of two sharding instances
// off PostgreSQL while requests keep coming, until it says its view of
// the members is stale (F after its last read), then lets it reach the
// ledger again. By design it drops the requests it owns meanwhile, and
// the client asks again; back, it says it read the members late, claims
// until its view is stable, and then the two serve their shares
// unclaimed as before. It keeps running through the outage, and no
// request is answered twice.
func TestNostrShardRidesOutALedgerOutage(t *testing.T) {
	skip.Short(t, "starts PostgreSQL and two capvend instances")
	t.Parallel()
	dsn := capvendtest.Postgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := billingtest.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	r := newShardRun(t, dsn)
	r.start("a_", dsn)
	r.start("b_", u.String()) // b reaches the ledger through the proxy
	r.connect()
	r.steady("a_", "b_")
	t.Log("a and b steady")

	m := r.mark()
	stale, late := r.logged(1, logStale), r.logged(1, logLate)
	stopLoad := r.keepListing(3 * time.Second)
	proxy.Cut()
	r.waitLogged(1, logStale, stale)
	proxy.Restore()
	r.waitLogged(1, logLate, late)
	stopLoad()
	dropped := r.unanswered.Load() - m.unanswered
	if dropped == 0 {
		t.Error("no request went unanswered while b was cut off from the ledger: did it serve on a stale view?")
	}
	t.Logf("b cut off and back: %d requests unanswered meanwhile, %d claims written", dropped, r.claims()-m.claims)

	r.steady("a_", "b_")
	counts := r.answeredOnce()
	t.Logf("%d requests answered, each once", len(counts))
}
