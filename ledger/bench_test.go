package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/pgserver"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// BenchmarkPaidCall measures the ledger side of one paid call as production
// runs it: quote, payment request (awaiting), settlement with its journal
// entry (paid), execution claim (executing), result (delivered): five
// transactions, each durable (synchronous=FULL) before its caller goes on.
// Target: >= 2,000 calls/s with 16 callers at once, on disk.
//
// Each sub-benchmark runs b.N calls, by 1 or by 16 concurrent callers,
// with group commit ("batched", what Open gives) or with one commit per
// transaction ("unbatched", the ledger before group commit), so one run
// compares both. A commit waits for one fsync of the WAL, so the disk
// bounds the unbatched rate: the "disk" runs report the disk's own fsync
// rate from the same run (unbatched fsync-ceiling = fsyncs/s / 5 commits).
// The "tmpfs" runs (/dev/shm, where fsync is free) show what the code
// costs without the disk.
func BenchmarkPaidCall(b *testing.B) {
	for _, where := range []string{"disk", "tmpfs"} {
		b.Run(where, func(b *testing.B) {
			for _, batched := range []bool{false, true} {
				mode := map[bool]string{false: "unbatched", true: "batched"}[batched]
				for _, callers := range []int{1, 16} {
					b.Run(fmt.Sprintf("%s/callers=%d", mode, callers), func(b *testing.B) {
						dir := benchDir(b, where)
						benchPaidCalls(b, dir, batched, callers)
						if where == "disk" {
							rate := fsyncRate(b, dir)
							b.ReportMetric(rate, "fsyncs/s")
							if !batched {
								b.ReportMetric(rate/5, "fsync-ceiling-calls/s")
							}
						}
					})
				}
			}
		})
	}
}

// benchDir is a new directory on the disk of the test's temporary
// directories, or in /dev/shm for "tmpfs".
func benchDir(b *testing.B, where string) string {
	if where == "disk" {
		return b.TempDir()
	}
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		b.Skip("no /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "capvend-bench")
	if err != nil {
		b.Skip(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// benchPaidCalls runs b.N paid calls through a new ledger in dir, by
// callers goroutines at once, and reports calls/s.
func benchPaidCalls(b *testing.B, dir string, batched bool, callers int) {
	l, err := ledger.OpenForTest(b, context.Background(), filepath.Join(dir, "capvend.db"), ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	if err := l.SetBatchingForTest(batched); err != nil {
		b.Fatal(err)
	}
	runPaidCalls(b, l, callers)
}

// runPaidCalls runs b.N paid calls through l, by callers goroutines at
// once, and reports calls/s.
func runPaidCalls(b *testing.B, l *ledger.Ledger, callers int) {
	ctx := context.Background()
	body := []byte(`{"content":[{"type":"text","text":"ok"}]}`)
	paidCall := func(i int) error {
		c, _, err := l.RecordCall(ctx, newCall(i))
		if err != nil {
			return err
		}
		p, err := l.RecordPayment(ctx, c.ID, newPayment(i))
		if err != nil {
			return err
		}
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			return err
		}
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			return err
		}
		return l.Deliver(ctx, c.ID, vend.Result{Body: body})
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < b.N; i = int(next.Add(1) - 1) {
				if err := paidCall(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/call")
	if commits, writes := l.BatchStatsForTest(); commits > 0 {
		b.ReportMetric(float64(writes)/float64(commits), "writes/commit")
	}
	b.StopTimer()
}

// BenchmarkPaidCallEngines compares, in one run, the ledger side of a
// paid call (BenchmarkPaidCall's five transactions, group-committed) on
// SQLite (a file in the test's temporary directory) and on PostgreSQL (a
// private server, durable: fsync on, its data in os.TempDir), by 1 and by
// 16 concurrent callers. cpu-µs/call counts capvend's process only (the
// PostgreSQL server's CPU is its own).
func BenchmarkPaidCallEngines(b *testing.B) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "capvend-bench-pg-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := pgserver.Start(ctx, dir, pgserver.Options{})
	if errors.Is(err, pgserver.ErrMissing) {
		skip.Missing(b, err.Error(), "apt-get install postgresql")
	}
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Destroy()
	dbs := 0
	for _, engine := range []string{"sqlite", "postgres"} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", engine, callers), func(b *testing.B) {
				var l *ledger.Ledger
				var err error
				if engine == "sqlite" {
					l, err = ledger.Open(ctx, filepath.Join(b.TempDir(), "capvend.db"), ledger.Options{})
				} else {
					dbs++
					var dsn string
					if dsn, err = srv.CreateDatabase(ctx, fmt.Sprintf("bench%d", dbs)); err == nil {
						l, err = ledger.OpenPostgres(ctx, dsn, ledger.Options{})
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				runPaidCalls(b, l, callers)
			})
		}
	}
}

// cpuTime is the CPU time (user and system) the process used so far: on a
// machine shared with other work, CPU per call varies less than calls/s.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fsyncRate measures how many small append+fdatasync rounds the disk under
// dir does per second: the ceiling for durable commits.
func fsyncRate(b *testing.B, dir string) float64 {
	f, err := os.Create(filepath.Join(dir, "fsync.probe"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	const n = 500
	start := time.Now()
	for i := 0; i < n; i++ {
		f.Write(page)
		f.Sync()
	}
	return n / time.Since(start).Seconds()
}

// BenchmarkExportMillionPostings exports 1,000,000 postings as CSV and, in
// the same run, dumps the same table with `sqlite3 -csv`; both write to
// /dev/null. Target: export within 2x of sqlite3 (the x_sqlite3 metric).
func BenchmarkExportMillionPostings(b *testing.B) {
	const entries = 500_000 // two postings each
	path := filepath.Join(b.TempDir(), "big.db")
	l, err := ledger.Open(context.Background(), path, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	fillJournal(b, l, entries)
	sqlite3, haveSQLite := exec.LookPath("sqlite3")
	devnull, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer devnull.Close()

	for _, format := range ledger.Formats {
		b.Run(format, func(b *testing.B) {
			var ours, theirs time.Duration
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if err := l.Export(context.Background(), devnull, ledger.ExportOptions{Format: format}); err != nil {
					b.Fatal(err)
				}
				ours += time.Since(start)
				if haveSQLite == nil {
					b.StopTimer()
					cmd := exec.Command(sqlite3, "-csv", path, "SELECT * FROM postings")
					cmd.Stdout = devnull
					var stderr strings.Builder
					cmd.Stderr = &stderr
					start := time.Now()
					if err := cmd.Run(); err != nil {
						b.Fatalf("sqlite3: %v %s", err, stderr.String())
					}
					theirs += time.Since(start)
					b.StartTimer()
				}
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(2*entries*b.N)/ours.Seconds(), "postings/s")
			b.ReportMetric(float64(after.HeapInuse)/(1<<20), "heap-MiB")
			if haveSQLite == nil {
				b.ReportMetric(ours.Seconds()/float64(b.N), "ours-s")
				b.ReportMetric(theirs.Seconds()/float64(b.N), "sqlite3-s")
				b.ReportMetric(ours.Seconds()/theirs.Seconds(), "x_sqlite3")
			}
		})
	}
}

// fillJournal books n balanced two-posting entries through the schema (the
// triggers run), in batches, far faster than n paid calls would.
func fillJournal(b *testing.B, l *ledger.Ledger, n int) {
	b.Helper()
	if err := l.Post(context.Background(), ledger.Entry{Kind: "adjustment", Description: "opening", Postings: []ledger.Posting{
		{Account: ledger.AccountLND, Amount: 1}, {Account: ledger.IncomeAccount("demo", "echo"), Amount: -1},
	}}); err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("sqlite3", l.Path()+"?_journal_mode=WAL&_synchronous=OFF")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	tx, _ := db.Begin()
	entry, _ := tx.Prepare("INSERT INTO entries (ts, kind, description, call_id, payment_id) VALUES (?, 'settlement', ?, NULL, NULL)")
	posting, _ := tx.Prepare("INSERT INTO postings (entry_id, account_id, amount_msat) VALUES (?, ?, ?)")
	seal, _ := tx.Prepare("UPDATE entries SET sealed = 1 WHERE id = ?")
	ts := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for i := 1; i < n; i++ {
		res, err := entry.Exec(ts+int64(i)*1000, "demo/echo call paid by lnd invoice")
		if err != nil {
			b.Fatal(err)
		}
		id, _ := res.LastInsertId()
		amt := int64(1000 + i%100000)
		posting.Exec(id, 1, amt)
		posting.Exec(id, 2, -amt)
		if _, err := seal.Exec(id); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReplayStore measures what a Nostr front asks of the ledger for
// each request that runs something (free calls included): a lookup of its
// stored reply (a miss) and, once answered, RememberReply, by 8 requests
// at once (BenchmarkNostrFreeCallCPU's load), on disk. cpu-µs/request is
// the process's CPU (user and system).
func BenchmarkReplayStore(b *testing.B) {
	ctx := context.Background()
	l, err := ledger.OpenForTest(b, ctx, filepath.Join(b.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	reply := []byte(`{"content":[{"type":"text","text":"4 words, 1 lines, 19 characters"}]}`)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := cpuTime()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < b.N; i = int(next.Add(1) - 1) {
				key := fmt.Sprintf("nostr:%064x", i)
				if _, ok, err := l.Reply(ctx, key); err != nil || ok {
					b.Error(ok, err)
					return
				}
				if _, err := l.RememberReply(ctx, key, reply); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/request")
}
