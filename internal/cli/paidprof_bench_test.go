package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/capvend/capvend/internal/capvendtest"
)

// BenchmarkPaidCallProfile accounts where a paid call's CPU goes in
// capvend: one `capvend serve` (admin listener with admin.pprof, default
// reconciliation) is first left idle for paidProfIdle, then called by
// paidMonClients paying MCP clients (as BenchmarkPaidCallMonitoring's) for
// paidProfLoad while Go's CPU profile of it is taken over
// /debug/pprof/profile. It reports the serve process's CPU per second
// idle (background tickers: not the calls'), and per call under load
// (from /proc/PID/stat), and the ledger commits per call (its /metrics).
// With PAIDPROF_DIR set, the profiles are written
// there (invoice.pprof, hold.pprof) for `go tool pprof`. b.N is ignored:
// run it with -benchtime 1x.
func BenchmarkPaidCallProfile(b *testing.B) {
	s := needStack(b)
	eachInvoiceKind(b, func(b *testing.B, hold bool) {
		path, _ := writeServeConfig(b, s, serveOpts{hold: hold})
		admin := capvendtest.AdminConfig(b, path, "  pprof: true\n")
		side := payingSide(b, s, startCapvend(b, path, capvendtest.Options{Process: true}), admin)
		side.calls(b, 2*paidMonClients) // warm-up
		pid := side.proc.Pid()
		b.Logf("load average before: %s", capvendtest.LoadAvg())
		c0 := capvendtest.ProcCPU(b, pid)
		time.Sleep(paidProfIdle)
		idle := capvendtest.ProcCPU(b, pid) - c0
		b.ResetTimer()
		commits0 := ledgerCommits(b, side)
		prof := make(chan []byte, 1)
		go func() { prof <- fetchProfile(b, admin, paidProfLoad) }()
		c0 = capvendtest.ProcCPU(b, pid)
		var n atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), paidProfLoad)
		defer cancel()
		var g errgroup.Group
		for _, pc := range side.clients {
			g.Go(func() error {
				for ctx.Err() == nil {
					if err := paidMonCall(pc); err != nil {
						return err
					}
					n.Add(1)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		busy := capvendtest.ProcCPU(b, pid) - c0
		commits := ledgerCommits(b, side) - commits0
		b.StopTimer()
		p := <-prof
		b.Logf("load average after: %s", capvendtest.LoadAvg())
		if dir := os.Getenv("PAIDPROF_DIR"); dir != "" && p != nil {
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(b.Name())+".pprof"), p, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(idle.Microseconds())/1000/paidProfIdle.Seconds(), "idle-cpu-ms/s")
		b.ReportMetric(float64(n.Load()), "calls")
		b.ReportMetric(float64(busy.Microseconds())/1000/float64(max(n.Load(), 1)), "cpu-ms/call")
		b.ReportMetric(commits/float64(max(n.Load(), 1)), "commits/call")
	})
}

const (
	// paidProfIdle is how long BenchmarkPaidCallProfile measures an idle
	// serve's CPU.
	paidProfIdle = 10 * time.Second
	// paidProfLoad is how long it calls (and profiles) the serve.
	paidProfLoad = 30 * time.Second
)

var commitCount = regexp.MustCompile(`(?m)^capvend_ledger_commit_seconds_count ([0-9.e+]+)`)

// ledgerCommits is how many ledger commits (group commits count once)
// side's /metrics counted so far.
func ledgerCommits(b *testing.B, side *paidMonSide) float64 {
	body, err := side.scrape(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	m := commitCount.FindStringSubmatch(body)
	if m == nil {
		b.Fatalf("no capvend_ledger_commit_seconds_count in /metrics:\n%s", capvendtest.GrepLines(body, "capvend_ledger"))
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// fetchProfile takes a CPU profile of the serve whose admin listener is
// admin over d; nil (logged) if it failed.
func fetchProfile(b *testing.B, admin string, d time.Duration) []byte {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, int(d.Seconds())))
	if err != nil {
		b.Log(err)
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Logf("profile: %s %v: %s", resp.Status, err, body)
		return nil
	}
	return body
}
