package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// Bounds are what "flat" means, over the second half of the run (the
// first half has the warm-up, the relay's outage and the reload).
type Bounds struct {
	RSSMiB     float64 // RSS grows at most this much (fitted slope x the half's length)
	Goroutines float64 // goroutines stay within this of their median
	FDs        float64 // open files stay within this of their median
	P99Factor  float64 // the last three intervals' p99 (their median) is at most this times the median interval's
}

// The bounds that have no flag.
const (
	// maxFailedShare: failed calls in the second half, of all calls then.
	maxFailedShare = 0.01
	// maxBytesPerPriced: ledger bytes per call that writes to it (paid,
	// credit, top-up, unpaid quote). BenchmarkLedgerGrowth: about 10 KB
	// for a paid call with an 8 KiB result, 2 KB once it is pruned; the
	// soak's results are 64 hex digits.
	maxBytesPerPriced = 10_000
)

// Verdict is one line of the end: a series (or a check) and whether it
// held its bound.
type Verdict struct {
	Series string
	Text   string // the slope and what was measured against the bound
	OK     bool
}

func (v Verdict) String() string {
	s := "ok"
	if !v.OK {
		s = "FAILED"
	}
	return fmt.Sprintf("verdict %-22s %s: %s", v.Series+":", v.Text, s)
}

// secondHalf is the samples from the middle of the run on.
func secondHalf(ss []Sample) []Sample {
	if len(ss) == 0 {
		return nil
	}
	mid := ss[len(ss)-1].At / 2
	i := slices.IndexFunc(ss, func(s Sample) bool { return s.At >= mid })
	return ss[i:]
}

// slope fits y = a + b*x by least squares and returns b; 0 with fewer
// than two distinct xs.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

func median(ys []float64) float64 {
	if len(ys) == 0 {
		return 0
	}
	s := slices.Clone(ys)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// series is f of each sample, with the sample's time in minutes; samples
// where f is negative (unknown) are left out.
func series(ss []Sample, f func(Sample) float64) (xs, ys []float64) {
	for _, s := range ss {
		if y := f(s); y >= 0 {
			xs, ys = append(xs, s.At.Minutes()), append(ys, y)
		}
	}
	return xs, ys
}

// verdicts judges the samples against b.
func verdicts(ss []Sample, b Bounds) []Verdict {
	half := secondHalf(ss)
	if len(half) < 2 {
		return []Verdict{{Series: "samples", Text: fmt.Sprintf("%d in the second half, too few to judge", len(half))}}
	}
	span := (half[len(half)-1].At - half[0].At).Minutes()
	var out []Verdict

	xs, ys := series(half, func(s Sample) float64 {
		if s.RSS < 0 {
			return -1
		}
		return mib(s.RSS)
	})
	k := slope(xs, ys)
	hx, hy := series(half, func(s Sample) float64 { return nonneg(s.Heap, mib(s.Heap)) })
	out = append(out, Verdict{"RSS", fmt.Sprintf("slope %+.3f MiB/min over the second half, fitted growth %+.1f MiB in %.0f min (%.1f .. %.1f MiB; the Go heap's slope %+.3f MiB/min; bound < %g MiB)",
		k, k*span, span, slices.Min(ys), slices.Max(ys), slope(hx, hy), b.RSSMiB), k*span < b.RSSMiB})

	within := func(name string, f func(Sample) float64, bound float64) {
		xs, ys := series(half, f)
		if len(ys) == 0 {
			out = append(out, Verdict{name, "never read", false})
			return
		}
		m := median(ys)
		dev := 0.0
		for _, y := range ys {
			dev = max(dev, math.Abs(y-m))
		}
		out = append(out, Verdict{name, fmt.Sprintf("slope %+.2f/min, median %.0f, %.0f .. %.0f (bound: within ±%g of the median)",
			slope(xs, ys), m, slices.Min(ys), slices.Max(ys), bound), dev <= bound})
	}
	within("goroutines", func(s Sample) float64 { return float64(s.Goroutines) }, b.Goroutines)
	within("open files", func(s Sample) float64 { return float64(s.FDs) }, b.FDs)

	xs, ys = series(half, func(s Sample) float64 { return float64(s.OpenQuotes) })
	if len(ys) > 0 {
		k, m := slope(xs, ys), median(ys)
		lim := max(10, m/4)
		out = append(out, Verdict{"open quotes", fmt.Sprintf("slope %+.2f/min, fitted growth %+.0f, median %.0f (bound: growth ≤ %.0f, a quarter of the median, at least 10)",
			k, k*span, m, lim), k*span <= lim})
	}

	for k := range nKinds {
		var p99s []float64
		for _, s := range ss[1:] {
			if s.N[k] > 0 {
				p99s = append(p99s, ms(s.P99[k]))
			}
		}
		name := kindNames[k] + " p99"
		if len(p99s) < 3 || ss[len(ss)-1].N[k] == 0 {
			out = append(out, Verdict{name, "no calls in the last interval, or too few intervals", false})
			continue
		}
		xs, ys := series(half, func(s Sample) float64 {
			if s.N[k] == 0 {
				return -1
			}
			return ms(s.P99[k])
		})
		m, end := median(p99s), median(p99s[len(p99s)-3:])
		out = append(out, Verdict{name, fmt.Sprintf("slope %+.1f ms/min, last three intervals %.0f ms (median), all intervals %.0f ms (median; bound ≤ %g×)",
			slope(xs, ys), end, m, b.P99Factor), end <= b.P99Factor*m})
	}

	var calls, failed int64
	for _, s := range half[1:] {
		for k := range nKinds {
			calls += int64(s.N[k])
			failed += int64(s.Errs[k])
		}
	}
	share := float64(failed) / float64(max(calls+failed, 1))
	out = append(out, Verdict{"failed calls", fmt.Sprintf("%d of %d in the second half (%.2f%%; bound ≤ %g%%)", failed, calls+failed, 100*share, 100*maxFailedShare),
		share <= maxFailedShare})

	first, last := half[0], half[len(half)-1]
	if first.Used >= 0 && last.Used >= 0 && last.Priced > first.Priced {
		per := float64(last.Used-first.Used) / float64(last.Priced-first.Priced)
		xs, ys := series(half, func(s Sample) float64 {
			if s.Used < 0 {
				return -1
			}
			return mib(s.Used)
		})
		out = append(out, Verdict{"ledger (grows)", fmt.Sprintf("slope %+.3f MiB/min in use; %.0f B per call that writes to it (%d paid, credit, top-ups and unpaid quotes; bound ≤ %d B)",
			slope(xs, ys), per, last.Priced-first.Priced, maxBytesPerPriced), per <= maxBytesPerPriced})
	} else {
		out = append(out, Verdict{"ledger (grows)", "no ledger-writing calls measured in the second half", false})
	}
	return out
}

// allOK reports whether every verdict held.
func allOK(vs []Verdict) bool {
	for _, v := range vs {
		if !v.OK {
			return false
		}
	}
	return true
}

func writeVerdicts(w io.Writer, vs []Verdict) {
	for _, v := range vs {
		fmt.Fprintln(w, v)
	}
}

// minutes is d in minutes, for the plot's x axis.
func minutes(d time.Duration) float64 { return d.Minutes() }
