package ledger_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// The workload of BenchmarkLedgerGrowth, with realistic sizes: a paid
// call (MCP over HTTP, a plain LND invoice) records its quote with the
// client's arguments (256 bytes of JSON), an invoice (a 360-character
// bolt11), its settlement and journal entry, its execution and an 8 KiB
// result (a page of text: a search result, a file excerpt); a free call
// of a tool with a daily quota records one free use (a free tool without
// a quota writes nothing). The stream is 1,000 calls a day, half free and
// half paid, for 100 days: 100,000 calls.
const (
	growthResultBytes = 8 << 10
	growthArgsBytes   = 256
	growthBolt11Chars = 360
	growthCallsPerDay = 1_000
	growthDays        = 100
	growthRetention   = 30 * 24 * time.Hour
)

// BenchmarkLedgerGrowth prints what the ledger stores per free and per
// paid call (and per paid call once its result is pruned), and how much
// 100,000 calls grow it without result retention and with the default
// 30-day retention (serve's pruning run once per simulated day). Sizes
// are the SQLite file's pages in use (page_count - freelist_count, after
// a checkpoint) and the file's size. It runs once per b.N; run it with
//
//	go test -run '^$' -bench BenchmarkLedgerGrowth -benchtime 1x ./ledger/
//
// The ledger lives in /dev/shm when there is one (the bytes do not depend
// on the disk; the run is faster).
func BenchmarkLedgerGrowth(b *testing.B) {
	ledger.SkipOnPostgres(b, "it measures the SQLite file")
	for range b.N {
		dir := benchDir(b, "tmpfs")
		free, paid, pruned := perCallBytes(b, filepath.Join(dir, "per-call.db"))
		never := growth(b, filepath.Join(dir, "keep.db"), 0)
		kept := growth(b, filepath.Join(dir, "retention.db"), growthRetention)
		b.ReportMetric(free, "B/free-call")
		b.ReportMetric(paid, "B/paid-call")
		b.ReportMetric(pruned, "B/paid-call-pruned")
		b.ReportMetric(float64(never.used)/1e6, "MB-100k-calls-kept")
		b.ReportMetric(float64(kept.used)/1e6, "MB-100k-calls-30d")
		fmt.Fprintf(os.Stdout, `ledger bytes per call (result %d B, arguments %d B, bolt11 %d chars):
  free call (daily quota)       %8.0f B
  paid call                     %8.0f B
  paid call, result pruned      %8.0f B
growth over %d calls (%d a day for %d days, half paid):
  retention   in use       file        results whole  pruned
  forever     %8.1f MB  %8.1f MB  %8d  %8d
  30 days     %8.1f MB  %8.1f MB  %8d  %8d
`, growthResultBytes, growthArgsBytes, growthBolt11Chars, free, paid, pruned,
			growthCallsPerDay*growthDays, growthCallsPerDay, growthDays,
			float64(never.used)/1e6, float64(never.file)/1e6, never.whole, never.pruned,
			float64(kept.used)/1e6, float64(kept.file)/1e6, kept.whole, kept.pruned)
	}
}

// growthLedger opens a new ledger at path on a clock the run moves.
func growthLedger(b *testing.B, path string) (*ledger.Ledger, *atomic.Int64) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	l, err := ledger.Open(context.Background(), path, ledger.Options{Now: func() time.Time { return time.UnixMilli(now.Load()) }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l, &now
}

// sizes is a ledger file's size: its pages in use, the file, and its
// stored results whole and pruned.
type sizes struct {
	used, file    int64
	whole, pruned int64
}

// measure checkpoints the ledger and reads its sizes.
func measure(b *testing.B, l *ledger.Ledger) sizes {
	var s sizes
	var pages, free, size int64
	if err := l.ExecForTest(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		b.Fatal(err)
	}
	for q, v := range map[string]*int64{"PRAGMA page_count": &pages, "PRAGMA freelist_count": &free, "PRAGMA page_size": &size,
		"SELECT count(*) FROM results WHERE pruned_at IS NULL": &s.whole, "SELECT count(*) FROM results WHERE pruned_at IS NOT NULL": &s.pruned} {
		if err := l.QueryRowForTest(context.Background(), q, v); err != nil {
			b.Fatal(err)
		}
	}
	s.used = (pages - free) * size
	st, err := os.Stat(l.Path())
	if err != nil {
		b.Fatal(err)
	}
	s.file = st.Size()
	return s
}

// growthCalls makes calls first..first+n-1 (even: free, odd: paid) with
// 16 callers at once.
func growthCalls(b *testing.B, l *ledger.Ledger, first, n int, kinds string) {
	ctx := context.Background()
	args := []byte(`{"query":"` + strings.Repeat("q", growthArgsBytes-12) + `"}`)
	result := []byte(`{"content":[{"type":"text","text":"` + strings.Repeat("r", growthResultBytes-40) + `"}]}`)
	bolt11 := "lnbc210n1p" + strings.Repeat("x", growthBolt11Chars-10)
	call := func(i int) error {
		paid := kinds == "paid" || kinds == "mixed" && i%2 == 1
		client := fmt.Sprint("client-", i%100)
		if !paid {
			ok, err := l.ClaimFreeUse(ctx, vend.FreeUse{Transport: "mcp-http", Client: client, RequestID: fmt.Sprint("f", i),
				Server: "demo", Tool: "search", ArgsHash: hash(fmt.Sprint("free", i)), PerDay: 1_000_000})
			if err == nil && !ok {
				err = fmt.Errorf("free use %d refused", i)
			}
			return err
		}
		c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: client, RequestID: fmt.Sprint("p", i),
			Server: "demo", Name: "search", ArgsHash: hash(fmt.Sprint("paid", i)), Price: 21_000, Idempotent: true,
			ExposedName: "demo_search", Arguments: args})
		if err != nil {
			return err
		}
		p, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
			Ref: hash(fmt.Sprint("preimage", i)), Bolt11: bolt11, Amount: 21_000, ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			return err
		}
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			return err
		}
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			return err
		}
		return l.Deliver(ctx, c.ID, vend.Result{Body: result})
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := call(first + i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// perCallBytes measures the bytes in use per free call, per paid call,
// and per paid call once its result is pruned, over 5,000 of each.
func perCallBytes(b *testing.B, path string) (free, paid, pruned float64) {
	const n = 5_000
	l, now := growthLedger(b, path)
	s0 := measure(b, l)
	growthCalls(b, l, 0, n, "free")
	s1 := measure(b, l)
	growthCalls(b, l, n, n, "paid")
	s2 := measure(b, l)
	now.Add(growthRetention.Milliseconds() * 2)
	if _, err := l.Prune(context.Background(), time.UnixMilli(now.Load()), time.Millisecond); err != nil {
		b.Fatal(err)
	}
	s3 := measure(b, l)
	return float64(s1.used-s0.used) / n, float64(s2.used-s1.used) / n, float64(s3.used-s1.used) / n
}

// growth runs the 100-day stream on a new ledger at path, pruning once a
// simulated day with retention (0: never), and returns its sizes.
func growth(b *testing.B, path string, retention time.Duration) sizes {
	l, now := growthLedger(b, path)
	for day := range growthDays {
		growthCalls(b, l, day*growthCallsPerDay, growthCallsPerDay, "mixed")
		now.Add((24 * time.Hour).Milliseconds())
		if retention > 0 {
			if _, err := l.Prune(context.Background(), time.UnixMilli(now.Load()).Add(-retention), time.Millisecond); err != nil {
				b.Fatal(err)
			}
		}
	}
	mustVerifyB(b, l)
	return measure(b, l)
}

func mustVerifyB(b *testing.B, l *ledger.Ledger) {
	r, err := l.Verify(context.Background())
	if err != nil || !r.OK() {
		var s strings.Builder
		if r != nil {
			r.WriteTo(&s)
		}
		b.Fatalf("verify: %v\n%s", err, s.String())
	}
}
