package main

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSlopeAndMedian(t *testing.T) {
	for _, tc := range []struct {
		name   string
		xs, ys []float64
		slope  float64
	}{
		{"flat", []float64{0, 1, 2, 3}, []float64{5, 5, 5, 5}, 0},
		{"line", []float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}, 2},
		{"noisy down", []float64{0, 1, 2, 3}, []float64{4, 3.5, 2.5, 2}, -0.7},
		{"one point", []float64{1}, []float64{9}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := slope(tc.xs, tc.ys); math.Abs(got-tc.slope) > 1e-9 {
				t.Fatalf("slope = %v, want %v", got, tc.slope)
			}
		})
	}
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatalf("median of 3 = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatalf("median of 4 = %v", m)
	}
	if p := pct([]time.Duration{5, 1, 4, 2, 3}, 50); p != 3 {
		t.Fatalf("p50 = %v", p)
	}
	if p := pct([]time.Duration{5, 1, 4, 2, 3}, 99); p != 5 {
		t.Fatalf("p99 = %v", p)
	}
}

// run makes n+1 samples a minute apart; f shapes sample i.
func samples(n int, f func(i int, s *Sample)) []Sample {
	ss := make([]Sample, n+1)
	for i := range ss {
		s := &ss[i]
		s.At = time.Duration(i) * time.Minute
		s.RSS, s.Heap, s.Goroutines, s.FDs, s.OpenQuotes = 100<<20, 40<<20, 60, 30, 150
		s.Used = int64(i) * 100 * 3000
		s.Priced = int64(i) * 100
		s.Calls = int64(i) * 1000
		if i > 0 {
			for k := range nKinds {
				s.N[k], s.P50[k], s.P99[k] = 100, 10*time.Millisecond, 40*time.Millisecond
			}
		}
		f(i, s)
	}
	return ss
}

func failed(vs []Verdict) []string {
	var out []string
	for _, v := range vs {
		if !v.OK {
			out = append(out, v.Series)
		}
	}
	return out
}

// TestVerdicts: flat series pass; a leak of each kind fails its own
// verdict and no other.
func TestVerdicts(t *testing.T) {
	b := defaultOptions().bounds
	for _, tc := range []struct {
		name string
		f    func(i int, s *Sample)
		want string // the one verdict that fails; "" none
	}{
		{"flat", func(int, *Sample) {}, ""},
		{"flat with a noisy first half", func(i int, s *Sample) {
			if i < 15 {
				s.RSS += int64(i) << 20
				s.Goroutines += 100
			}
		}, ""},
		{"rss leak", func(i int, s *Sample) { s.RSS += int64(i) << 20 }, "RSS"},
		{"goroutine leak", func(i int, s *Sample) { s.Goroutines += 3 * i }, "goroutines"},
		{"fd leak", func(i int, s *Sample) { s.FDs += 2 * i }, "open files"},
		{"quotes pile up", func(i int, s *Sample) { s.OpenQuotes += 10 * i }, "open quotes"},
		{"one slow interval at the end", func(i int, s *Sample) {
			if i == 30 {
				s.P99[kPaid] = time.Second
			}
		}, ""},
		{"slow at the end", func(i int, s *Sample) {
			if i >= 28 {
				s.P99[kPaid] = time.Second
			}
		}, "paid p99"},
		{"failures", func(i int, s *Sample) { s.Errs[kFree] = 10 }, "failed calls"},
		{"fat ledger rows", func(i int, s *Sample) { s.Used = int64(i) * 100 * 20_000 }, "ledger (grows)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := verdicts(samples(30, tc.f), b)
			got := strings.Join(failed(vs), ",")
			if got != tc.want {
				t.Fatalf("failed verdicts %q, want %q:\n%s", got, tc.want, verdictText(vs))
			}
			if allOK(vs) != (tc.want == "") {
				t.Fatalf("allOK = %v", allOK(vs))
			}
		})
	}
}

func verdictText(vs []Verdict) string {
	var b bytes.Buffer
	writeVerdicts(&b, vs)
	return b.String()
}

// TestReport: the table has a row per sample, the CSV a line per sample,
// and the plot is a PNG.
func TestReport(t *testing.T) {
	ss := samples(4, func(i int, s *Sample) {
		if i == 2 {
			s.Events = "relay down"
			s.N[kCredit] = 0
		}
	})
	var tb, csv bytes.Buffer
	writeTable(&tb, ss)
	if lines := strings.Count(tb.String(), "\n"); lines != 2+len(ss) {
		t.Fatalf("table of %d lines:\n%s", lines, tb.String())
	}
	if !strings.Contains(tb.String(), "| 2:00 | 100.0 | 40.0 | 60 | 30 | 150 | 10 / 40 | 10 / 40 | - |") || !strings.Contains(tb.String(), "relay down") {
		t.Fatalf("table:\n%s", tb.String())
	}
	writeCSV(&csv, ss)
	if lines := strings.Count(csv.String(), "\n"); lines != 1+len(ss) {
		t.Fatalf("CSV of %d lines:\n%s", lines, csv.String())
	}
	path := filepath.Join(t.TempDir(), "soak.png")
	if err := writePlot(path, "test", ss, []mark{{90 * time.Second, "relay down"}}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("soak.png: %v", err)
	}
}

func TestWriteGrowth(t *testing.T) {
	var b bytes.Buffer
	writeGrowth(&b, map[string]int64{"calls": 10, "payments": 5, "leases": 1}, map[string]int64{"calls": 110, "payments": 55, "leases": 1})
	out := b.String()
	if !strings.Contains(out, "calls") || !strings.Contains(out, "+100") || strings.Contains(out, "leases") ||
		strings.Index(out, "calls") > strings.Index(out, "payments") {
		t.Fatalf("growth:\n%s", out)
	}
}

func TestGoroutineGroups(t *testing.T) {
	profile := `goroutine profile: total 7
4 @ 0x1 0x2
#	0x1	runtime.gopark+0x1	/go/runtime/proc.go:1
#	0x2	github.com/capvend/capvend/vend.(*Vendor).wait+0x2	/w/vend/vend.go:1
#	0x3	net/http.(*conn).serve+0x3	/go/net/http/server.go:1

2 @ 0x1 0x4
#	0x1	runtime.gopark+0x1	/go/runtime/proc.go:1
#	0x4	net/http.(*persistConn).readLoop+0x4	/go/net/http/transport.go:1

1 @ 0x5
#	0x5	github.com/capvend/capvend/vend.(*Vendor).wait+0x9	/w/vend/vend.go:2
`
	got := goroutineGroups(profile, 8)
	want := []string{"    5 vend.(*Vendor).wait", "    2 net/http.(*persistConn).readLoop"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("groups %q, want %q", got, want)
	}
}
