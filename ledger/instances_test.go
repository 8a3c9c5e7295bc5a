package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// twoHandles opens two ledger handles on one new database (two instances
// sharing it), with clock (nil: the wall clock), closed when t ends.
func twoHandles(t *testing.T, clock func() time.Time) (a, b *ledger.Ledger) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "capvend.db")
	return openHandle(t, path, clock), openHandle(t, path, clock)
}

// openHandle opens a ledger handle on the database at path, with clock
// (nil: the wall clock), closed when t ends.
func openHandle(t *testing.T, path string, clock func() time.Time) *ledger.Ledger {
	t.Helper()
	l, err := ledger.OpenForTest(t, context.Background(), path, ledger.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// instancesClock is the clock the instances of a test share, which the
// test moves.
func instancesClock() *stepClock {
	return &stepClock{t: time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)}
}

// TestClaimRequestOnceAcrossHandles: two ledger handles on one database
// (two instances) race to claim the same request keys; each key is won by
// exactly one holder, a holder claiming its own key again still has it,
// the other never gets it while the holder lives; long after, the claims
// of a holder without a run lease (dead) are taken over, a live one's are
// not; pruning deletes the claims made before.
func TestClaimRequestOnceAcrossHandles(t *testing.T) {
	ctx := context.Background()
	clock := instancesClock()
	a, b := twoHandles(t, clock.Now)
	const keys = 20
	var won [keys]atomic.Int32
	var wg sync.WaitGroup
	for i := range keys {
		for j, l := range []*ledger.Ledger{a, b, a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				holder := fmt.Sprint("instance-", j%2)
				ok, err := l.ClaimRequest(ctx, fmt.Sprint("nostr:ev", i), holder)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					won[i].Add(1 << (4 * (j % 2)))
				}
			}()
		}
	}
	wg.Wait()
	for i := range keys {
		// Each holder claimed twice: the winner got true twice (its
		// own claim again), the other got false twice.
		if w := won[i].Load(); w != 2 && w != 2<<4 {
			t.Errorf("key %d: claims won %#x, want both by one holder", i, w)
		}
	}
	if _, err := a.ClaimRequest(ctx, "", "x"); err == nil {
		t.Error("an empty key was claimed")
	}
	// instance-0 holds a run lease (it lives); instance-1 died. Long
	// after, a request instance-0 claimed stays its; one of instance-1's
	// is taken over when sent again.
	if ok, err := a.TakeLease(ctx, "run:r0", "instance-0", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	clock.add(2 * ledger.DefaultClaimTakeover)
	for i := range keys {
		mine := won[i].Load() == 2<<4 // instance-1's
		if ok, err := a.ClaimRequest(ctx, fmt.Sprint("nostr:ev", i), "instance-2"); err != nil || ok != mine {
			t.Errorf("key %d, claimed by instance-%d, taken over: %v, %v", i, map[bool]int{true: 1, false: 0}[mine], ok, err)
		}
	}
	if n, err := b.PruneRequestClaims(ctx, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil || n != 0 {
		t.Errorf("prune before 2000: %d, %v", n, err)
	}
	if n, err := b.PruneRequestClaims(ctx, time.Now().Add(time.Hour*24*365*100)); err != nil || n != keys {
		t.Errorf("prune all: %d, %v; want %d", n, err, keys)
	}
	if ok, err := a.ClaimRequest(ctx, "nostr:ev0", "instance-9"); err != nil || !ok {
		t.Errorf("a pruned key claimed again: %v, %v", ok, err)
	}
	if ok, err := b.ClaimRequest(ctx, "nostr:ev0", "instance-0"); err != nil || ok {
		t.Errorf("a fresh claim of a dead-looking instance taken over: %v, %v", ok, err)
	}
}

// TestSettlementBookedOnceAcrossHandles: two ledger handles on one
// database (two capvend instances, each seeing LND's settlement stream or
// polling the same mint quote) race to book the same settlements and to
// start the same paid calls: each payment is booked once, each call runs
// once, the revenue is the sum of the prices and the ledger verifies.
func TestSettlementBookedOnceAcrossHandles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	a, b := openLedger(t, path), openHandle(t, path, nil)
	const n = 8
	var calls [n]vend.Call
	var pays [n]vend.Payment
	for i := range n {
		c, _, err := a.RecordCall(ctx, newCall(i))
		if err != nil {
			t.Fatal(err)
		}
		np := newPayment(i)
		if i%2 == 1 { // a Cashu mint quote, paid at the mint
			np.Backend, np.Kind, np.Ref, np.MintURL = vend.BackendCashu, vend.KindMintQuote, fmt.Sprint("quote-", i), "http://127.0.0.1:3338"
		}
		if pays[i], err = a.RecordPayment(ctx, c.ID, np); err != nil {
			t.Fatal(err)
		}
		calls[i] = c
	}
	race := func(what string, op func(l *ledger.Ledger, i int) error, lost error) {
		t.Helper()
		var won [n]atomic.Int32
		var wg sync.WaitGroup
		for i := range n {
			for _, l := range []*ledger.Ledger{a, b, a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					switch err := op(l, i); {
					case err == nil:
						won[i].Add(1)
					case !errors.Is(err, lost):
						t.Errorf("%s %d: %v", what, i, err)
					}
				}()
			}
		}
		wg.Wait()
		for i := range n {
			if w := won[i].Load(); w != 1 {
				t.Errorf("%s %d went through %d times, want once", what, i, w)
			}
		}
	}
	race("settlement", func(l *ledger.Ledger, i int) error {
		_, err := l.SettlePayment(ctx, vend.Settlement{Ref: pays[i].Ref, Amount: pays[i].Amount, AddIndex: uint64(i + 1), SettleIndex: uint64(i + 1)})
		return err
	}, vend.ErrAlreadySettled)
	race("execution", func(l *ledger.Ledger, i int) error {
		c, err := l.Call(ctx, calls[i].ID)
		if err != nil {
			return err
		}
		_, err = l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
		var te *vend.TransitionError
		if errors.As(err, &te) { // the winner moved the call to executing
			return vend.ErrAlreadyClaimed
		}
		return err
	}, vend.ErrAlreadyClaimed)
	for i := range n {
		if err := b.Deliver(ctx, calls[i].ID, vend.Result{Body: []byte(`{"content":[]}`)}); err != nil {
			t.Fatal(err)
		}
	}
	bal, err := a.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var revenue vend.Msat
	var booked int
	for _, tr := range bal.Tools {
		revenue += tr.Revenue
		booked += tr.Calls
	}
	if booked != n || revenue != n*newCall(0).Price {
		t.Errorf("booked %d payments, %d msat; want %d, %d", booked, revenue, n, n*newCall(0).Price)
	}
	mustVerify(t, b)
}

// TestLeaseTakenOverOnlyWhenExpired: two instances (ledger handles on one
// database, with clocks the test moves) compete for a lease: the first
// takes it, the second cannot while it runs and its holder renews it,
// takes it once it expired unrenewed, and at once after a release.
func TestLeaseTakenOverOnlyWhenExpired(t *testing.T) {
	ctx := context.Background()
	clock := instancesClock()
	a, b := twoHandles(t, clock.Now)
	const ttl = 30 * time.Second
	take := func(l *ledger.Ledger, holder string, want bool) {
		t.Helper()
		if got, err := l.TakeLease(ctx, "work", holder, ttl); err != nil || got != want {
			t.Fatalf("%s takes the lease: %v, %v; want %v", holder, got, err, want)
		}
	}
	holder := func(want string) {
		t.Helper()
		if got, err := b.LeaseHolder(ctx, "work"); err != nil || got != want {
			t.Fatalf("holder %q, %v; want %q", got, err, want)
		}
	}
	holder("")
	take(a, "A", true)
	take(b, "B", false)
	holder("A")
	for range 5 { // A renews every 10 s: B never gets it
		clock.add(10 * time.Second)
		take(a, "A", true)
		take(b, "B", false)
	}
	clock.add(ttl) // A died: its lease ran out
	holder("")
	take(b, "B", true)
	take(a, "A", false)
	holder("B")
	if err := a.ReleaseLease(ctx, "work", "A"); err != nil { // not A's: left alone
		t.Fatal(err)
	}
	holder("B")
	if err := b.ReleaseLease(ctx, "work", "B"); err != nil {
		t.Fatal(err)
	}
	holder("")
	take(a, "A", true)
}

// TestCountCallAcrossHandles: two ledger handles on one database count a
// client's calls against one limit: of concurrent calls in one minute,
// exactly the limit are counted; the next minute starts again, and the
// counts of minutes before the last are deleted.
func TestCountCallAcrossHandles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	a, b := openLedger(t, path), openHandle(t, path, nil)
	minute := time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)
	var counted atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := a
			if i%2 == 1 {
				l = b
			}
			ok, err := l.CountCall(ctx, "client-1", minute.Add(time.Duration(i)*time.Second), 5)
			if err != nil {
				t.Error(err)
			}
			if ok {
				counted.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := counted.Load(); n != 5 {
		t.Fatalf("%d calls counted, want the limit, 5", n)
	}
	if ok, err := a.CountCall(ctx, "client-2", minute, 5); err != nil || !ok {
		t.Fatalf("another client: %v %v", ok, err)
	}
	if ok, err := b.CountCall(ctx, "client-1", minute.Add(time.Minute), 5); err != nil || !ok {
		t.Fatalf("the next minute: %v %v", ok, err)
	}
	if ok, err := b.CountCall(ctx, "client-1", minute.Add(3*time.Minute), 5); err != nil || !ok {
		t.Fatalf("three minutes on: %v %v", ok, err)
	}
	var rows int
	if err := b.QueryRowForTest(ctx, fmt.Sprint("SELECT count(*) FROM rate_counts WHERE minute < ", minute.Add(2*time.Minute).UnixMilli()), &rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d counts of old minutes kept", rows)
	}
}

// TestRegisterPricesRefusesDifferentPrices: an instance whose price book
// hash differs from a live instance's (registered within the lease time,
// or holding a run lease) is refused and not recorded; dead instances do
// not count; a forced registration (a reload) is recorded and reported.
func TestRegisterPricesRefusesDifferentPrices(t *testing.T) {
	ctx := context.Background()
	clock := instancesClock()
	a, b := twoHandles(t, clock.Now)
	h1, h2 := hash("prices 1"), hash("prices 2")
	const fresh = 30 * time.Second
	register := func(l *ledger.Ledger, instance, h string, force, refused bool) {
		t.Helper()
		err := l.RegisterPrices(ctx, instance, h, fresh, force)
		if got := errors.Is(err, ledger.ErrPricesDiffer); got != refused || (err != nil && !got) {
			t.Fatalf("%s registers: %v, want refused %v", instance, err, refused)
		}
	}
	register(a, "A", h1, false, false)
	register(b, "B", h2, false, true) // A just started with other prices
	register(b, "B", h1, false, false)
	clock.add(time.Minute) // A and B died without a lease
	register(b, "C", h2, false, false)
	clock.add(time.Minute)
	if ok, err := a.TakeLease(ctx, "run:a1", "A", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	register(a, "A", h1, false, false) // C is dead
	clock.add(time.Minute)
	register(b, "D", h2, false, true) // A lives: it holds its run's lease
	register(b, "D", h2, true, true)  // a reload: recorded, and reported
	register(b, "E", h1, false, true) // D is fresh, with h2
}

// TestLeaseHoldersLiveByPrefix: LeaseHolders lists, sorted, the holders
// of the running leases whose name starts with the prefix (literally: no
// pattern), and drops a lease once it expired or was released.
func TestLeaseHoldersLiveByPrefix(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	l, err := ledger.OpenForTest(t, ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	take := func(name, holder string, ttl time.Duration) {
		t.Helper()
		if ok, err := l.TakeLease(ctx, name, holder, ttl); err != nil || !ok {
			t.Fatalf("take %s: %v, %v", name, ok, err)
		}
	}
	want := func(prefix string, holders ...string) {
		t.Helper()
		got, err := l.LeaseHolders(ctx, prefix)
		if err != nil || !slices.Equal(got, holders) {
			t.Fatalf("holders of %q: %q, %v; want %q", prefix, got, err, holders)
		}
	}
	take("nostr:k1:b", "b", time.Minute)
	take("nostr:k1:a", "a", 10*time.Second)
	take("nostr:k2:c", "c", time.Minute)
	take("nostr:k1_x", "x", time.Minute) // _ is no pattern
	take("work", "a", time.Minute)
	want("nostr:k1:", "a", "b")
	want("nostr:k2:", "c")
	want("nostr:k3:")
	advance(11 * time.Second) // a's lease ran out
	want("nostr:k1:", "b")
	if err := l.ReleaseLease(ctx, "nostr:k1:b", "b"); err != nil {
		t.Fatal(err)
	}
	want("nostr:k1:")
}

// TestOpenUnpaidAcrossHandles: the open unpaid payment requests recorded
// through one handle are counted through another, per limit key and in
// all; a settled, canceled or expired one, and a call recorded without a
// key (one instance), do not count for a key.
func TestOpenUnpaidAcrossHandles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	a, b := openLedger(t, path), openHandle(t, path, nil)
	now := time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)
	unpaid := func(l *ledger.Ledger, i int, key string, expires time.Time) vend.Payment {
		t.Helper()
		nc := newCall(i)
		nc.LimitKey = key
		c, _, err := l.RecordCall(ctx, nc)
		if err != nil {
			t.Fatal(err)
		}
		np := newPayment(i)
		np.ExpiresAt = expires
		p, err := l.RecordPayment(ctx, c.ID, np)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	later := now.Add(time.Hour)
	unpaid(a, 1, "ip:192.0.2.1", later)
	unpaid(a, 2, "ip:192.0.2.1", later)
	settled := unpaid(a, 3, "ip:192.0.2.1", later)
	if _, err := a.SettlePayment(ctx, vend.Settlement{Ref: settled.Ref, Amount: settled.Amount}); err != nil {
		t.Fatal(err)
	}
	unpaid(a, 4, "ip:192.0.2.1", now.Add(-time.Second)) // expired, not yet reported
	unpaid(a, 5, "npub-other", later)
	unpaid(a, 6, "", later)
	canceled := newCall(7)
	canceled.LimitKey = "ip:192.0.2.1"
	c, _, err := a.RecordCall(ctx, canceled)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CancelQuote(ctx, c.ID, "test"); err != nil {
		t.Fatal(err)
	}
	ofKey, total, err := b.OpenUnpaid(ctx, "ip:192.0.2.1", now)
	if err != nil {
		t.Fatal(err)
	}
	if ofKey != 2 || total != 4 {
		t.Fatalf("open unpaid: %d of the key, %d in all; want 2 and 4", ofKey, total)
	}
	if _, _, err := b.OpenUnpaid(ctx, "", now); err == nil {
		t.Fatal("an empty key counted")
	}
}

// TestSharedSessions: a session recorded through one handle is live
// through another until it expires; a later expiry extends it, an earlier
// one does not; an ended or never recorded session is not live; expired
// sessions are deleted by a later PutSession.
func TestSharedSessions(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	a, b := openLedger(t, path), openHandle(t, path, nil)
	now := time.Date(2029, 1, 1, 12, 0, 0, 0, time.UTC)
	one, two := hash("session-1"), hash("session-2")
	if err := a.PutSession(ctx, one, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	live := func(h string, at time.Time) bool {
		t.Helper()
		ok, err := b.SessionLive(ctx, h, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !live(one, now) || live(one, now.Add(time.Minute)) || live(two, now) {
		t.Fatal("live: recorded, expired, never recorded")
	}
	if err := b.PutSession(ctx, one, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := a.PutSession(ctx, one, now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !live(one, now.Add(30*time.Minute)) {
		t.Fatal("an earlier expiry shortened the session")
	}
	if err := a.EndSession(ctx, one); err != nil {
		t.Fatal(err)
	}
	if live(one, now) {
		t.Fatal("an ended session is live")
	}
	if err := a.PutSession(ctx, "short", now); err == nil {
		t.Fatal("a bad hash recorded")
	}
	// The ledger's clock is in 2026: a session that expired then is
	// deleted by a handle's first PutSession (then at most once a minute).
	if err := a.PutSession(ctx, two, time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if err := openHandle(t, path, nil).PutSession(ctx, one, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRowForTest(ctx, "SELECT count(*) FROM mcp_sessions", &n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d sessions kept, want 1 (the expired one deleted)", n)
	}
}

// TestClaimTakeoverOption: with Options.ClaimTakeover, a dead holder's
// claim stands exactly that long (not DefaultClaimTakeover): refused just
// before, taken over at it; a live holder's is never taken over.
func TestClaimTakeoverOption(t *testing.T) {
	ctx := context.Background()
	clock := instancesClock()
	const takeover = 5 * time.Second
	path := filepath.Join(t.TempDir(), "capvend.db")
	l, err := ledger.OpenForTest(t, ctx, path, ledger.Options{Now: clock.Now, ClaimTakeover: takeover})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if ok, err := l.TakeLease(ctx, "run:live", "live", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	for _, holder := range []string{"dead", "live"} {
		if ok, err := l.ClaimRequest(ctx, "nostr:"+holder, holder); err != nil || !ok {
			t.Fatal(holder, ok, err)
		}
	}
	clock.add(takeover - time.Millisecond)
	if ok, err := l.ClaimRequest(ctx, "nostr:dead", "other"); err != nil || ok {
		t.Errorf("a dead holder's claim taken over before ClaimTakeover: %v, %v", ok, err)
	}
	clock.add(time.Millisecond)
	if ok, err := l.ClaimRequest(ctx, "nostr:dead", "other"); err != nil || !ok {
		t.Errorf("a dead holder's claim not taken over at ClaimTakeover: %v, %v", ok, err)
	}
	clock.add(ledger.DefaultClaimTakeover)
	if ok, err := l.ClaimRequest(ctx, "nostr:live", "other"); err != nil || ok {
		t.Errorf("a live holder's claim taken over: %v, %v", ok, err)
	}
}
