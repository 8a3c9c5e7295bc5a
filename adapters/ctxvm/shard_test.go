package ctxvm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/syncbuf"
)

// memMembers is an in-memory Members on a test clock (the ledger's is
// tested in ledger, and across instances in internal/cli).
type memMembers struct {
	mu       sync.Mutex
	now      func() time.Time
	leases   map[string]memLease
	fail     bool // reads fail
	failTake bool // lease takes fail
}

type memLease struct {
	holder  string
	expires time.Time
}

func (m *memMembers) TakeLease(_ context.Context, name, holder string, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failTake {
		return false, fmt.Errorf("ledger unwritable")
	}
	if l, ok := m.leases[name]; ok && l.holder != holder && l.expires.After(m.now()) {
		return false, nil
	}
	m.leases[name] = memLease{holder, m.now().Add(ttl)}
	return true, nil
}

func (m *memMembers) ReleaseLease(_ context.Context, name, holder string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leases[name].holder == holder {
		delete(m.leases, name)
	}
	return nil
}

func (m *memMembers) LeaseHolders(_ context.Context, prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil, fmt.Errorf("ledger unreachable")
	}
	var out []string
	for name, l := range m.leases {
		if strings.HasPrefix(name, prefix) && l.expires.After(m.now()) {
			out = append(out, l.holder)
		}
	}
	slices.Sort(out)
	return out, nil
}

// countingClaims is a memClaims that counts the claims written.
type countingClaims struct {
	memClaims
	n map[string]int // claims written per key
}

func (c *countingClaims) ClaimRequest(ctx context.Context, key, holder string) (bool, error) {
	c.mu.Lock()
	c.n[key]++
	c.mu.Unlock()
	return c.memClaims.ClaimRequest(ctx, key, holder)
}

// shardCluster is several servers with one key, one claim store and one
// member store on one test clock, driven step by step.
type shardCluster struct {
	t       *testing.T
	mu      sync.Mutex
	now     time.Time
	members *memMembers
	claims  *countingClaims
	servers map[string]*Server
	outs    map[string]*[]nostr.Event
	client  string // the client's secret key
	sk      string // the servers' secret key
}

const testSample = time.Second

func newShardCluster(t *testing.T) *shardCluster {
	c := &shardCluster{t: t, now: time.Now(), servers: map[string]*Server{}, outs: map[string]*[]nostr.Event{},
		client: nostr.GeneratePrivateKey(), sk: nostr.GeneratePrivateKey()}
	c.members = &memMembers{now: c.clock, leases: map[string]memLease{}}
	c.claims = &countingClaims{memClaims: memClaims{m: map[string]string{}}, n: map[string]int{}}
	return c
}

func (c *shardCluster) clock() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *shardCluster) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// join starts server name: it takes its member lease and reads the set.
func (c *shardCluster) join(name string) *Server {
	s, out := recorder(c.t, func(cfg *Config) {
		cfg.SecretKey, cfg.Claims, cfg.Members, cfg.Instance, cfg.Now = c.sk, c.claims, c.members, name, c.clock
		cfg.ShardSample, cfg.MemberTTL = testSample, 10*time.Second
	})
	if err := s.shard.join(context.Background()); err != nil {
		c.t.Fatal(err)
	}
	c.servers[name], c.outs[name] = s, out
	return s
}

// live renews name's member lease and reads the member set (one sample).
func (c *shardCluster) live(name string) {
	s := c.servers[name]
	if s.shard.leaving {
		// no renewal
	} else if err := s.shard.renew(context.Background()); err != nil {
		c.t.Fatal(err)
	}
	if err := s.shard.read(context.Background()); err != nil {
		c.t.Fatal(err)
	}
}

// request signs a new ping now.
func (c *shardCluster) request(i int) *nostr.Event {
	s := c.servers[slices.Sorted(mapKeys(c.servers))[0]]
	ev := &nostr.Event{Kind: KindMessage, CreatedAt: nostr.Timestamp(c.clock().Unix()),
		Content: fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, i), Tags: nostr.Tags{{"p", s.PublicKey()}}}
	ev.Sign(c.client)
	return ev
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// answers returns, per server, how many answers to ev it published.
func (c *shardCluster) answers(ev *nostr.Event) map[string]int {
	n := map[string]int{}
	for name, out := range c.outs {
		for _, a := range *out {
			if a.Tags.FindWithValue("e", ev.ID) != nil {
				n[name]++
			}
		}
	}
	return n
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestShardServesEachRequestOnceWithoutClaims: two servers sharing a key
// whose member views are stable both receive every request; each request
// is answered once, each server answers a share, and no claim is written.
// A server whose member set cannot be read any more stops answering once
// its view is stale (another may own its requests by now).
func TestShardServesEachRequestOnceWithoutClaims(t *testing.T) {
	c := newShardCluster(t)
	c.join("a")
	c.join("b")
	for range 10 { // 10 samples: both views stable
		c.advance(testSample)
		c.live("a")
		c.live("b")
	}
	ctx := context.Background()
	share := map[string]int{}
	for i := range 60 {
		ev := c.request(i)
		c.servers["a"].handle(ctx, ev)
		c.servers["b"].handle(ctx, ev)
		got := c.answers(ev)
		if total(got) != 1 {
			t.Fatalf("request %d answered %v, want once", i, got)
		}
		for k, v := range got {
			share[k] += v
		}
	}
	if share["a"] == 0 || share["b"] == 0 {
		t.Errorf("shares %v: each server should answer some", share)
	}
	// Gift wraps are decided on their rumor's id, once unwrapped.
	published := func() int { return len(*c.outs["a"]) + len(*c.outs["b"]) }
	for i := range 20 {
		before := published()
		w := wrapFor(t, *c.request(200 + i), c.servers["a"].PublicKey())
		c.servers["a"].handle(ctx, w)
		c.servers["b"].handle(ctx, w)
		if n := published() - before; n != 1 {
			t.Fatalf("gift-wrapped request %d answered %d times, want once", i, n)
		}
	}
	if n := len(c.claims.n); n != 0 {
		t.Errorf("%d claims written in steady state, want none", n)
	}
	var logs syncbuf.Buffer // a's warnings: the operator learns of the drops, once
	c.servers["a"].shard.log = slog.New(slog.NewTextHandler(&logs, nil))
	c.members.fail = true
	c.advance(3*testSample + time.Millisecond)
	for i := range 20 {
		ev := c.request(100 + i)
		c.servers["a"].handle(ctx, ev)
		if n := total(c.answers(ev)); n != 0 {
			t.Fatalf("a stale view answered request %d", i)
		}
	}
	if n := strings.Count(logs.String(), "view of the members is stale"); n != 1 {
		t.Errorf("20 requests dropped for a stale view logged %d times, want once:\n%s", n, logs.String())
	}
	// Read again after the gap: a serves its own at once, by claim.
	c.members.fail = false
	c.live("a")
	c.live("b")
	if n := strings.Count(logs.String(), "member set read late"); n != 1 {
		t.Errorf("the late read logged %d times, want once:\n%s", n, logs.String())
	}
	share = map[string]int{}
	for i := range 40 {
		ev := c.request(300 + i)
		c.servers["a"].handle(ctx, ev)
		c.servers["b"].handle(ctx, ev)
		got := c.answers(ev)
		if total(got) != 1 {
			t.Fatalf("request %d after a's gap answered %v, want once", i, got)
		}
		if got["a"] == 1 && c.claims.n["nostr:"+ev.ID] == 0 {
			t.Fatalf("request %d answered by a without a claim right after its gap", i)
		}
		share["a"] += got["a"]
	}
	if share["a"] == 0 {
		t.Error("a answered nothing after its gap")
	}
}

// TestShardMembershipChanges: servers a and b serve; c joins; later a
// dies (its member lease runs out unrenewed); later c stops (it leaves:
// releases its lease and reads requests for a while more). Every server
// reads the member set once a sample, each at its own phase, and every
// request of each 100 ms is handed to every live server. No request is
// answered twice; none is left unanswered but those a dead server owned
// until the others count it out; claims are written only during the
// changes; and once a is out, b and c serve everything.
func TestShardMembershipChanges(t *testing.T) {
	// Parallel: a fake clock and a cluster of its own; it computes while
	// TestRelayRestart and TestRequestDuringRelayOutage wait.
	t.Parallel()
	c := newShardCluster(t)
	c.join("a")
	c.join("b")
	phase := map[string]int{"a": 3, "b": 7, "c": 5} // tenths of a sample
	live := []string{"a", "b"}
	ctx := context.Background()
	const tick = testSample / 10
	joinAt, dieAt, leaveAt := 150, 450, 750 // ticks
	var died, leaveEnd time.Time
	for i := 0; i < 1000; i++ {
		c.advance(tick)
		switch {
		case i == joinAt:
			c.join("c")
			live = append(live, "c")
		case i == dieAt:
			live, died = slices.DeleteFunc(live, func(s string) bool { return s == "a" }), c.clock()
		case i == leaveAt:
			leaveEnd = c.clock().Add(c.servers["c"].shard.leave(ctx))
		case i > leaveAt && !c.clock().Before(leaveEnd) && slices.Contains(live, "c"):
			live = slices.DeleteFunc(live, func(s string) bool { return s == "c" })
		}
		for _, name := range live {
			if i%10 == phase[name] {
				c.live(name)
			}
		}
		ev := c.request(i)
		for k := range live { // each tick in another order
			c.servers[live[(k+i)%len(live)]].handle(ctx, ev)
		}
		got := c.answers(ev)
		claimed := c.claims.n["nostr:"+ev.ID] > 0
		aOut := died.Add(10*time.Second + testSample + 3*testSample) // a's lease ran out, the others read it
		switch n := total(got); {
		case n > 1:
			t.Fatalf("tick %d: request answered %v times", i, got)
		case n == 0 && i > dieAt && c.clock().After(aOut):
			t.Fatalf("tick %d: request unanswered (a counted out %v before)", i, c.clock().Sub(aOut))
		case n == 0 && i >= 100 && i < dieAt:
			t.Fatalf("tick %d: request unanswered during c's joining", i)
		case n == 0: // a's, before the others count it out
		case claimed && (i >= 100 && i < joinAt || i >= joinAt+110 && i < dieAt || i >= 700 && i < leaveAt || i >= leaveAt+110):
			t.Errorf("tick %d: a claim written in steady state", i)
		}
	}
}

// TestShardLapsingLeaseStopsServing: a server whose member lease is not
// renewed (its ledger writes fail, its reads work) stops answering before
// the lease runs out and the others may count it out; renewed late
// (between two of its reads, which never saw it out), it starts again as
// a joiner would: answering nothing unclaimed.
func TestShardLapsingLeaseStopsServing(t *testing.T) {
	c := newShardCluster(t)
	c.join("a")
	c.join("b")
	for range 10 {
		c.advance(testSample)
		c.live("a")
		c.live("b")
	}
	ctx := context.Background()
	a := c.servers["a"]
	served := func(from int) (answered, unclaimed int) {
		for i := range 40 {
			ev := c.request(from + i)
			a.handle(ctx, ev)
			if c.answers(ev)["a"] > 0 {
				answered++
				if c.claims.n["nostr:"+ev.ID] == 0 {
					unclaimed++
				}
			}
		}
		return answered, unclaimed
	}
	if n, _ := served(0); n == 0 {
		t.Fatal("a answers nothing before the test")
	}
	c.members.failTake = true
	for range 8 { // the lease (10 s) runs out in 2 s
		c.advance(testSample)
		_ = a.shard.renew(ctx)
		if err := a.shard.read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := served(1000); n != 0 {
		t.Fatalf("a answered %d requests with its lease about to run out", n)
	}
	c.members.failTake = false
	c.advance(testSample + testSample/2)
	c.live("a") // ran out half a sample ago; renewed, and read before the
	// others' next reads
	if _, n := served(2000); n != 0 {
		t.Fatalf("a answered %d requests unclaimed right after its lease lapsed", n)
	}
}
