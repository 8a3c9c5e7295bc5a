package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// fixedClock is a test clock set by the test.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fixedClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func openAt(t *testing.T, path string, c *fixedClock) *ledger.Ledger {
	t.Helper()
	l, err := ledger.OpenForTest(t, context.Background(), path, ledger.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func use(client, req string) vend.FreeUse {
	return vend.FreeUse{Transport: "mcp-http", Client: client, RequestID: req, Server: "demo", Tool: "echo", ArgsHash: hash(req), PerDay: 3}
}

func claim(t *testing.T, l *ledger.Ledger, u vend.FreeUse) bool {
	t.Helper()
	free, err := l.ClaimFreeUse(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	return free
}

func TestFreeUseConcurrentClaims(t *testing.T) {
	l := openLedger(t, "")
	var wg sync.WaitGroup
	var free atomic.Int32
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := l.ClaimFreeUse(context.Background(), use("client-1", fmt.Sprint("req-", i)))
			if err != nil {
				t.Error(err)
			}
			if ok {
				free.Add(1)
			}
		}()
	}
	wg.Wait()
	if free.Load() != 3 {
		t.Fatalf("%d of 10 concurrent calls were free, want 3", free.Load())
	}
	// Quotas are per client and per tool.
	if !claim(t, l, use("client-2", "req-0")) {
		t.Error("another client's quota was used up")
	}
	other := use("client-1", "req-other-tool")
	other.Tool = "reverse"
	if !claim(t, l, other) {
		t.Error("another tool's quota was used up")
	}
	mustVerify(t, l)
}

func TestFreeUseReplay(t *testing.T) {
	l := openLedger(t, "")
	if !claim(t, l, use("c", "a")) {
		t.Fatal("first call not free")
	}
	for i := 0; i < 5; i++ {
		if !claim(t, l, use("c", "a")) {
			t.Fatal("a replay of a free call is not free")
		}
	}
	// The replays counted nothing: two more requests are free.
	if !claim(t, l, use("c", "b")) || !claim(t, l, use("c", "c")) {
		t.Fatal("replays consumed quota")
	}
	if claim(t, l, use("c", "d")) {
		t.Fatal("a fourth request was free")
	}
	// A request id reused for another tool is not a replay (see
	// TestFreeUseIsBoundToItsArguments).
	u := use("c", "a")
	u.Tool = "reverse"
	if free, err := l.ClaimFreeUse(context.Background(), u); !errors.Is(err, vend.ErrRequestReused) || free {
		t.Errorf("a request id's free use was reused for another tool: free=%v err=%v", free, err)
	}
}

func TestFreeUseNotForPricedRequest(t *testing.T) {
	l := openLedger(t, "")
	nc := newCall(1) // mcp-http, client-1, req-1
	if _, _, err := l.RecordCall(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if claim(t, l, use("client-1", "req-1")) {
		t.Error("a replay of a priced call was made free")
	}
	if !claim(t, l, use("client-1", "req-2")) {
		t.Error("a new request was not free")
	}
}

func TestFreeUseDayBoundaryAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capvend.db")
	c := &fixedClock{t: time.Date(2026, 11, 20, 23, 59, 58, 0, time.UTC)}
	l := openAt(t, path, c)
	for i := 0; i < 3; i++ {
		if !claim(t, l, use("c", fmt.Sprint("d1-", i))) {
			t.Fatalf("call %d not free", i)
		}
	}
	if claim(t, l, use("c", "d1-3")) {
		t.Fatal("quota exceeded")
	}
	// Restart within the same day: the count survives.
	l.Close()
	l = openAt(t, path, c)
	if claim(t, l, use("c", "d1-4")) {
		t.Fatal("quota reset by a restart")
	}
	// The UTC day ends: a new quota.
	c.Set(time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC))
	for i := 0; i < 3; i++ {
		if !claim(t, l, use("c", fmt.Sprint("d2-", i))) {
			t.Fatalf("new day: call %d not free", i)
		}
	}
	if claim(t, l, use("c", "d2-3")) {
		t.Fatal("new day: quota exceeded")
	}
	// A local-time offset does not matter: the day is UTC.
	c.Set(time.Date(2026, 11, 21, 23, 30, 0, 0, time.FixedZone("UTC-5", -5*3600))) // 04:30 UTC on the 22nd
	if !claim(t, l, use("c", "d3-0")) {
		t.Fatal("the day is not UTC")
	}
	// A replay of yesterday's free request is still free and counts nothing.
	if !claim(t, l, use("c", "d1-0")) {
		t.Fatal("replay across days")
	}
	b, err := l.Balance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Free) != 1 || b.Free[0] != (ledger.FreeUses{Server: "demo", Tool: "echo", Uses: 7, Today: 1}) {
		t.Errorf("balance free uses %+v", b.Free)
	}
	var sb strings.Builder
	b.WriteTo(&sb)
	if !strings.Contains(sb.String(), "Free calls (daily quotas):") || !strings.Contains(sb.String(), "demo/echo") {
		t.Errorf("balance output:\n%s", sb.String())
	}
	l.Close()
	db, err := ledger.OpenRawForTest(t, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	db.QueryRow("SELECT count(*) FROM free_uses").Scan(&n)
	if n != 7 {
		t.Errorf("%d free uses stored, want 7", n)
	}
	// The schema keeps them: no edits, no deletes.
	for _, q := range []string{"UPDATE free_uses SET day = '2000-01-01'", "DELETE FROM free_uses"} {
		if _, err := db.Exec(q); err == nil {
			t.Errorf("%s was allowed", q)
		}
	}
}

func TestFreeUseRefusesBadInput(t *testing.T) {
	l := openLedger(t, "")
	for _, u := range []vend.FreeUse{
		{Transport: "t", Client: "c", RequestID: "r", Server: "s", Tool: "x", PerDay: 0},
		{Transport: "t", Client: "", RequestID: "r", Server: "s", Tool: "x", PerDay: 1},
	} {
		if _, err := l.ClaimFreeUse(context.Background(), u); err == nil {
			t.Errorf("%+v accepted", u)
		}
	}
}

// TestFreeUseTotalCapAcrossClients: fresh identities cost nothing, so a
// tool's free calls of a day are also bounded across all clients, counted
// in the same transaction as the client's own quota.
func TestFreeUseTotalCapAcrossClients(t *testing.T) {
	// At noon: newClock starts a minute before midnight and ticks a
	// second per transaction (the migrations' too), so that the claims
	// here could straddle two days, each with its own cap.
	c := newClock()
	c.t = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	l, err := ledger.OpenForTest(t, context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var wg sync.WaitGroup
	var free atomic.Int32
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := use(fmt.Sprint("fresh-key-", i), "req-1")
			u.Transport = []string{"nostr-ctxvm", "mcp-http"}[i%2] // every transport counts
			u.PerDayTotal = 7
			ok, err := l.ClaimFreeUse(context.Background(), u)
			if err != nil {
				t.Error(err)
			}
			if ok {
				free.Add(1)
			}
		}()
	}
	wg.Wait()
	if free.Load() != 7 {
		t.Fatalf("%d of 40 fresh clients got a free call, want the total cap of 7", free.Load())
	}
	// A replay of a request that holds a use is still free.
	u := use("fresh-key-0", "req-1")
	u.Transport, u.PerDayTotal = "nostr-ctxvm", 7
	first, _ := l.ClaimFreeUse(context.Background(), u)
	if again := claim(t, l, u); again != first {
		t.Fatalf("replay: %v, first %v", again, first)
	}
	// Another tool has its own total.
	o := use("fresh-key-1", "req-2")
	o.Tool, o.PerDayTotal = "other", 7
	if !claim(t, l, o) {
		t.Fatal("another tool's total was used up too")
	}
}
