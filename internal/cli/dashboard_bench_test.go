package cli

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/capvend/capvend/adapters/admin"
	"github.com/capvend/capvend/ledger"
)

// bigBooks fills the ledger at path (made by ledger.Open, closed) with
// calls delivered over the last year, each paid by a settled invoice
// booked by a two-posting entry: calls*2 postings, in one transaction
// through the schema (its triggers run, account_days included), far
// faster than paid calls would. Some calls await payment, and
// reconciliation ran often.
func bigBooks(b *testing.B, path string, calls int) {
	b.Helper()
	db, err := sql.Open("sqlite3", path+"?_journal_mode=WAL&_synchronous=OFF&_foreign_keys=on")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	const tools = 20
	now := time.Now().UnixMilli()
	step := int64(365*24*time.Hour/time.Millisecond) / int64(calls)
	must := func(_ sql.Result, err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(tx.Exec("INSERT INTO accounts (id, name, type, created_at) VALUES (1, 'assets:lightning:lnd', 'assets', 0)"))
	for t := 0; t < tools; t++ {
		must(tx.Exec("INSERT INTO accounts (id, name, type, created_at) VALUES (?, ?, 'income', 0)", 2+t, ledger.IncomeAccount("tools", fmt.Sprint("tool", t))))
	}
	call, _ := tx.Prepare(`INSERT INTO calls (id, transport, client, request_id, server, tool, args_hash, price_msat, state, created_at, updated_at)
		VALUES (?, 'mcp-http', 'client', ?, 'tools', ?, ?, 21000, ?, ?, ?)`)
	pay, _ := tx.Prepare(`INSERT INTO payments (id, backend, kind, ref, call_id, amount_msat, state, expires_at, created_at, updated_at, settled_at, settled_msat)
		VALUES (?, 'lnd', 'invoice', ?, ?, 21000, ?, ?, ?, ?, ?, ?)`)
	entry, _ := tx.Prepare("INSERT INTO entries (id, ts, kind, description, call_id, payment_id) VALUES (?, ?, 'settlement', 'paid by lnd invoice', ?, ?)")
	posting, _ := tx.Prepare("INSERT INTO postings (entry_id, account_id, amount_msat) VALUES (?, ?, ?)")
	seal, _ := tx.Prepare("UPDATE entries SET sealed = 1 WHERE id = ?")
	for i := 1; i <= calls; i++ {
		ts := now - int64(calls-i)*step
		h := sha256.Sum256([]byte(strconv.Itoa(i)))
		ref := hex.EncodeToString(h[:])
		tool := i % tools
		state, payState := "delivered", "settled"
		open := i > calls-500 // the newest calls await payment
		if open {
			state, payState = "awaiting_payment", "open"
		}
		must(call.Exec(i, strconv.Itoa(i), fmt.Sprint("tool", tool), ref, state, ts, ts+1500))
		if open {
			must(pay.Exec(i, ref, i, payState, now+3_600_000, ts, ts, nil, nil))
			continue
		}
		must(pay.Exec(i, ref, i, payState, ts+600_000, ts, ts+1000, ts+1000, 21000))
		must(entry.Exec(i, ts+1000, i, i))
		must(posting.Exec(i, 1, 21000))
		must(posting.Exec(i, 2+tool, -21000))
		must(seal.Exec(i))
	}
	for r := 1; r <= 1000; r++ {
		must(tx.Exec("INSERT INTO reconcile_runs (id, started_at, finished_at, differences) VALUES (?, ?, ?, ?)", r, now-int64(1000-r)*60_000, now-int64(1000-r)*60_000+500, r%2))
		if r%2 == 1 {
			must(tx.Exec("INSERT INTO reconcile_differences (run_id, kind, backend, ref, ledger, remote, found_at) VALUES (?, 'booked_unsettled', 'lnd', 'x', 'settled', 'canceled', ?)", r, now))
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDashboard serves the dashboard (the full handler: the ledger's
// reads, the health checks, the rendering) from a ledger of 1,000,000
// postings (500,000 paid calls over a year). Target: a page in under
// 200 ms (the ms/op metric).
func BenchmarkDashboard(b *testing.B) {
	const calls = 500_500 // 500,000 paid (2 postings each), 500 awaiting payment
	path := filepath.Join(b.TempDir(), "big.db")
	l, err := ledger.Open(context.Background(), path, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	l.Close()
	bigBooks(b, path, calls)
	if l, err = ledger.Open(context.Background(), path, ledger.Options{MustExist: true}); err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var postings int
	db, err := sql.Open("sqlite3", path+"?mode=ro")
	if err != nil {
		b.Fatal(err)
	}
	err = db.QueryRow("SELECT count(*) FROM postings").Scan(&postings)
	db.Close()
	if err != nil || postings < 1_000_000 {
		b.Fatalf("%d postings (%v), want at least 1,000,000", postings, err)
	}
	srv, err := admin.NewServer("127.0.0.1:0", nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv.AddCheck(admin.Check{Name: "ledger", Check: func(ctx context.Context) error { _, err := l.OpenCounts(ctx); return err }})
	m := admin.NewMetrics(nil, nil, admin.Sources{Upstreams: func() int { return 1 }}, nil)
	if _, err := admin.NewDashboard(srv, m, ledgerDashboard{l}); err != nil {
		b.Fatal(err)
	}
	for _, p := range []struct{ name, path string }{{"page", "/"}, {"json", "/dashboard.json"}, {"call", "/calls/250000"}} {
		b.Run(p.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", p.path, nil)
			var bytes int
			for i := 0; i < b.N; i++ {
				w := httptest.NewRecorder()
				srv.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", p.path, w.Code, w.Body.String())
				}
				bytes = w.Body.Len()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
			b.ReportMetric(float64(bytes), "bytes")
			b.ReportMetric(float64(postings), "postings")
		})
	}
}
