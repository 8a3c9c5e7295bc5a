package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3"
)

// Sample is what one sample saw: capvend's process at that moment, and
// the calls of the interval since the previous sample.
type Sample struct {
	At         time.Duration // since the load started
	RSS        int64         // bytes (VmRSS); -1 unknown
	Heap       int64         // go_memstats_heap_inuse_bytes: the Go heap's part of RSS; -1 unknown
	Goroutines int           // go_goroutines; -1 unknown
	FDs        int           // entries of /proc/PID/fd; -1 unknown
	OpenQuotes int           // capvend_open_quotes: calls quoted or awaiting payment; -1 unknown

	// The interval's calls, by kind: how many were served, their p50
	// and p99 latency, and how many failed.
	N        [nKinds]int
	P50, P99 [nKinds]time.Duration
	Errs     [nKinds]int

	DB, WAL int64 // the ledger's file and its WAL, bytes
	Used    int64 // the ledger's pages in use (page_count - freelist_count) x page_size; -1 unknown

	Calls  int64 // calls served since the start (free, paid, credit)
	Priced int64 // calls that write to the ledger since the start: paid, credit, top-ups, unpaid quotes
	Unpaid int64 // unpaid quotes asked since the start

	Events string // what happened during the interval (the relay's outage, the SIGHUP)
}

// sampler reads capvend's process, its /metrics and its ledger.
type sampler struct {
	pid        int
	metricsURL string
	ledger     string // the SQLite file
}

// sample fills s's process and ledger fields.
func (sp *sampler) sample(ctx context.Context, s *Sample) {
	s.RSS = rss(sp.pid)
	s.FDs = openFiles(sp.pid)
	m := sp.metrics(ctx, "go_goroutines", "capvend_open_quotes", "go_memstats_heap_inuse_bytes")
	s.Goroutines, s.OpenQuotes, s.Heap = int(m["go_goroutines"]), int(m["capvend_open_quotes"]), int64(m["go_memstats_heap_inuse_bytes"])
	s.DB, s.WAL = fileSize(sp.ledger), fileSize(sp.ledger+"-wal")
	s.Used = ledgerUsed(ctx, sp.ledger)
}

// metrics returns the values of the named gauges on /metrics, -1 for
// those it could not read.
func (sp *sampler) metrics(ctx context.Context, names ...string) map[string]float64 {
	out := make(map[string]float64, len(names))
	for _, n := range names {
		out[n] = -1
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, sp.metricsURL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if _, want := out[name]; !ok || !want {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// rss is VmRSS of pid in bytes, -1 if unknown.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return -1
}

// openFiles counts pid's open file descriptors, -1 if unknown.
func openFiles(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// ledgerUsed is the bytes of the ledger's pages in use, read through a
// read-only connection (it sees the WAL), -1 if unknown.
func ledgerUsed(ctx context.Context, path string) int64 {
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		return -1
	}
	defer db.Close()
	var pages, free, size int64
	for _, q := range []struct {
		pragma string
		v      *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := db.QueryRowContext(ctx, "PRAGMA "+q.pragma).Scan(q.v); err != nil {
			return -1
		}
	}
	return (pages - free) * size
}

// tableRows counts the rows of every table of the ledger (nil if it
// cannot be read): what grows, and by how much.
func tableRows(ctx context.Context, path string) map[string]int64 {
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		return nil
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
	if err != nil {
		return nil
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	rows.Close()
	out := map[string]int64{}
	for _, n := range names {
		var c int64
		if db.QueryRowContext(ctx, `SELECT count(*) FROM "`+n+`"`).Scan(&c) == nil {
			out[n] = c
		}
	}
	return out
}

// writeTable prints the samples as a Markdown table.
func writeTable(w io.Writer, ss []Sample) {
	fmt.Fprintln(w, "| t | RSS MiB | Go heap MiB | goroutines | fds | open quotes | free p50/p99 ms | paid p50/p99 ms | credit p50/p99 ms | calls (interval) | failed | unpaid quotes | ledger MiB (db + wal) | in use MiB | events |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	var prev Sample
	for i, s := range ss {
		lat := func(k kind) string {
			if s.N[k] == 0 {
				return "-"
			}
			return fmt.Sprintf("%s / %s", msec(s.P50[k]), msec(s.P99[k]))
		}
		calls, unpaid := s.Calls, s.Unpaid
		if i > 0 {
			calls, unpaid = s.Calls-prev.Calls, s.Unpaid-prev.Unpaid
		}
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %d | %d | %d | %s | %s | %s | %d | %d | %d | %.2f + %.2f | %.2f | %s |\n",
			clock(s.At), mib(s.RSS), mib(s.Heap), s.Goroutines, s.FDs, s.OpenQuotes, lat(kFree), lat(kPaid), lat(kCredit),
			calls, s.Errs[kFree]+s.Errs[kPaid]+s.Errs[kCredit], unpaid, mib(s.DB), mib(s.WAL), mib(s.Used), s.Events)
		prev = s
	}
}

// writeCSV writes the samples as CSV, one row each, cumulative counts.
func writeCSV(w io.Writer, ss []Sample) {
	fmt.Fprintln(w, "seconds,rss_bytes,heap_inuse_bytes,goroutines,fds,open_quotes,free_n,free_p50_ms,free_p99_ms,free_failed,paid_n,paid_p50_ms,paid_p99_ms,paid_failed,credit_n,credit_p50_ms,credit_p99_ms,credit_failed,db_bytes,wal_bytes,used_bytes,calls,priced,unpaid,events")
	for _, s := range ss {
		fmt.Fprintf(w, "%.0f,%d,%d,%d,%d,%d", s.At.Seconds(), s.RSS, s.Heap, s.Goroutines, s.FDs, s.OpenQuotes)
		for k := range nKinds {
			fmt.Fprintf(w, ",%d,%.1f,%.1f,%d", s.N[k], ms(s.P50[k]), ms(s.P99[k]), s.Errs[k])
		}
		fmt.Fprintf(w, ",%d,%d,%d,%d,%d,%d,%q\n", s.DB, s.WAL, s.Used, s.Calls, s.Priced, s.Unpaid, s.Events)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func msec(d time.Duration) string {
	if d < 10*time.Millisecond {
		return strconv.FormatFloat(ms(d), 'f', 1, 64)
	}
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// clock is d as m:ss.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

// goroutines fetches capvend's goroutine profile (admin.pprof), saves it
// at path and returns its largest groups, by where they are in capvend's
// code (the first frame of this module, else the first outside the
// runtime), the most numerous first.
func (sp *sampler) goroutines(ctx context.Context, path string) []string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	url := strings.TrimSuffix(sp.metricsURL, "/metrics") + "/debug/pprof/goroutine?debug=1"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || os.WriteFile(path, b, 0o644) != nil {
		return nil
	}
	return goroutineGroups(string(b), 8)
}

// goroutineGroups sums a debug=1 goroutine profile by where each group
// stands and returns the top n as "count place".
func goroutineGroups(profile string, n int) []string {
	by := map[string]int{}
	count, place := 0, ""
	flush := func() {
		if count > 0 {
			by[place] += count
		}
		count, place = 0, ""
	}
	for l := range strings.SplitSeq(profile, "\n") {
		if head, _, ok := strings.Cut(l, " @ "); ok {
			flush()
			count, _ = strconv.Atoi(head)
			continue
		}
		f := strings.Fields(strings.TrimPrefix(l, "#"))
		if !strings.HasPrefix(l, "#") || len(f) < 2 || count == 0 || strings.Contains(place, "capvend/capvend/") {
			continue
		}
		fn, _, _ := strings.Cut(f[1], "+0x")
		if strings.Contains(fn, "capvend/capvend/") ||
			place == "" && !strings.HasPrefix(fn, "runtime.") && !strings.HasPrefix(fn, "internal/") && !strings.HasPrefix(fn, "sync.") {
			place = fn
		}
	}
	flush()
	type group struct {
		place string
		n     int
	}
	var gs []group
	for p, c := range by {
		gs = append(gs, group{p, c})
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].n > gs[j].n || gs[i].n == gs[j].n && gs[i].place < gs[j].place })
	var out []string
	for _, g := range gs[:min(n, len(gs))] {
		out = append(out, fmt.Sprintf("%5d %s", g.n, strings.TrimPrefix(g.place, "github.com/capvend/capvend/")))
	}
	return out
}
