package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/capvend/capvend/internal/procstat"
	"github.com/capvend/capvend/testnet"
)

// Where the CPU goes during a phase.
//
// On one machine the flood, the stack (three LND nodes, btcd, the relay,
// the mint), capvend and the honest customers share the cores, so a slower
// customer under the flood can mean that capvend did more work for the
// flood, or only that the others took the CPU it needed. cpuMeter reads the
// CPU time of each process from /proc at the start and end of a phase and
// reports who used how much of the machine: the figures to read beside the
// latencies.

// proc is one measured process (and, for capvend, its children: the
// upstream servers it started).
type proc struct {
	name     string
	pid      int
	children bool
	// ended, if set, gives the process's CPU ticks once it has exited
	// and been waited for (its /proc entry is gone then).
	ended func() (int64, bool)
}

// cpuMeter names the processes of a run.
type cpuMeter struct {
	procs []proc
}

// newCPUMeter measures capvend (pid, with its children), this process (the
// honest customers), the stack's processes, and the flood child once added.
func newCPUMeter(st *testnet.Stack, pid int) *cpuMeter {
	m := &cpuMeter{}
	if pid > 0 {
		m.procs = append(m.procs, proc{name: "capvend", pid: pid, children: true})
	}
	m.procs = append(m.procs, proc{name: "customers (this process)", pid: os.Getpid()})
	for _, n := range st.Info.Nodes {
		m.procs = append(m.procs, proc{name: "lnd " + n.Name, pid: n.PID})
	}
	m.procs = append(m.procs, proc{name: "btcd", pid: st.Info.Btcd.PID}, proc{name: "relay", pid: st.Info.Relay.PID},
		proc{name: "mint", pid: st.Info.Mint.PID})
	return m
}

// add measures one more process, a child of this one: ended gives its CPU
// ticks once it has been waited for.
func (m *cpuMeter) add(name string, pid int, ended func() (int64, bool)) {
	m.procs = append(m.procs, proc{name: name, pid: pid, ended: ended})
}

// cpuSample is the CPU ticks used so far by each process, and by the
// whole machine (busy and idle), at one time.
type cpuSample struct {
	at         time.Time
	ticks      map[string]int64
	busy, idle int64
}

func (m *cpuMeter) sample() cpuSample {
	s := cpuSample{at: time.Now(), ticks: map[string]int64{}}
	var parents map[int]int // pid -> ppid, read once if needed
	for _, p := range m.procs {
		if p.ended != nil {
			if t, ok := p.ended(); ok {
				s.ticks[p.name] += t
				continue
			}
		}
		s.ticks[p.name] += procTicks(p.pid)
		if !p.children {
			continue
		}
		if parents == nil {
			parents = allParents()
		}
		for child, ppid := range parents {
			if ppid == p.pid {
				s.ticks[p.name] += procTicks(child)
			}
		}
	}
	s.busy, s.idle = machineTicks()
	return s
}

// report prints who used the CPU between a and b, in CPU seconds and as a
// share of the machine (all cores for the phase's wall time).
func (m *cpuMeter) report(a, b cpuSample) {
	wall := b.at.Sub(a.at).Seconds()
	capacity := wall * float64(runtime.NumCPU())
	var parts []string
	var named int64
	for _, p := range m.procs {
		before, ok := a.ticks[p.name]
		d := b.ticks[p.name] - before
		if !ok || d < 0 { // measured since, or ended, or another process now
			continue
		}
		named += d
		parts = append(parts, share(p.name, d, capacity))
	}
	if busy := b.busy - a.busy; busy > 0 {
		parts = append(parts, share("everything else", max(busy-named, 0), capacity),
			share("idle", b.idle-a.idle, capacity))
	}
	say("    CPU over %.0f s on %d cores: %s", wall, runtime.NumCPU(), strings.Join(parts, ", "))
}

func share(name string, ticks int64, capacity float64) string {
	sec := float64(ticks) / procstat.ClockTicks
	return fmt.Sprintf("%s %.1f s (%.0f%%)", name, sec, 100*sec/max(capacity, 1e-9))
}

// procTicks is pid's CPU time in ticks, 0 if it is gone.
func procTicks(pid int) int64 {
	t, _ := procstat.CPUTicks(pid)
	return t
}

// allParents maps each process id on the machine to its parent's.
func allParents() map[int]int {
	m := map[int]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if f := procstat.Fields(pid); len(f) > 3 {
			ppid, _ := strconv.Atoi(f[3])
			m[pid] = ppid
		}
	}
	return m
}

// machineTicks is the machine's busy and idle (with I/O wait) CPU ticks
// since boot, from /proc/stat's "cpu" line.
func machineTicks() (busy, idle int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest times are already in user and nice
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		} else {
			busy += n
		}
	}
	return busy, idle
}
