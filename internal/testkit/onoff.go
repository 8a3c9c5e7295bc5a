package testkit

import (
	"slices"
	"syscall"
	"testing"
	"time"
)

// OnOff collects the rounds of a benchmark comparing a feature off and
// on side by side, on a machine shared with other work: pairs of rounds
// run back to back (the caller alternates which side goes first), each
// pair giving the feature's cost in throughput and in the process's CPU
// time per call, and the median pair's is reported. Within a pair the
// load of the rest of the machine changes less than across the run.
type OnOff struct {
	// CPU, if set, is the CPU time side on used so far (e.g. its own
	// server process's); nil: this process's (CPUTime).
	CPU func(on bool) time.Duration

	rate, cpu [2][]float64 // by side (0 off, 1 on): each round's calls/s, CPU µs per call
}

// Round runs one round of calls calls on side on: run makes them and
// returns how long they took (what it times is the caller's choice), and
// the CPU time (see CPU) is taken around all of run.
func (o *OnOff) Round(on bool, calls int, run func() time.Duration) {
	i := 0
	if on {
		i = 1
	}
	cpu := o.CPU
	if cpu == nil {
		cpu = func(bool) time.Duration { return CPUTime() }
	}
	start := cpu(on)
	d := run()
	o.cpu[i] = append(o.cpu[i], float64((cpu(on)-start).Microseconds())/float64(calls))
	o.rate[i] = append(o.rate[i], float64(calls)/d.Seconds())
}

// Report reports each side's median calls/s ("off-calls/s", "on-calls/s")
// and CPU per call ("off-cpu-us/call", "on-cpu-us/call"), and the median
// pair's cost of "on" in % of "off": "cost-%" of throughput, "cpu-cost-%"
// of CPU per call.
func (o *OnOff) Report(b *testing.B) {
	n := min(len(o.rate[0]), len(o.rate[1]))
	var rateCost, cpuCost []float64
	for r := range n {
		rateCost = append(rateCost, 100*(o.rate[0][r]-o.rate[1][r])/o.rate[0][r])
		cpuCost = append(cpuCost, 100*(o.cpu[1][r]-o.cpu[0][r])/o.cpu[0][r])
	}
	slices.Sort(rateCost)
	slices.Sort(cpuCost)
	b.Logf("%d pairs; cost in %% of off, sorted: throughput %.1f; CPU per call %.1f", n, rateCost, cpuCost)
	b.ReportMetric(Median(o.rate[0]), "off-calls/s")
	b.ReportMetric(Median(o.rate[1]), "on-calls/s")
	b.ReportMetric(Median(rateCost), "cost-%")
	b.ReportMetric(Median(o.cpu[0]), "off-cpu-us/call")
	b.ReportMetric(Median(o.cpu[1]), "on-cpu-us/call")
	b.ReportMetric(Median(cpuCost), "cpu-cost-%")
}

// Median is v's median (the upper one of an even count); 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// CPUTime is the CPU time (user and system) the process used so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
