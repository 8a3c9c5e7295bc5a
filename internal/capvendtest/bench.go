package capvendtest

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/procstat"
)

func P50(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ProcCPU is the CPU time (user and system) process pid used so far.
func ProcCPU(b testing.TB, pid int) time.Duration {
	d, ok := procstat.CPU(pid)
	if !ok {
		b.Fatalf("no CPU time of process %d", pid)
	}
	return d
}

// LoadAvg is the machine's load average (/proc/loadavg's first three).
func LoadAvg() string {
	l, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(l))
	return strings.Join(f[:min(3, len(f))], " ")
}

// GrepLines returns the lines of s that start with prefix.
func GrepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// ChildOf returns the pid of the one child of process pid (serve's stdio
// upstream), waiting for it a while.
func ChildOf(tb testing.TB, pid int) int {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second) // a hang guard
	for {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			child, err := strconv.Atoi(filepath.Base(d))
			if err != nil {
				continue
			}
			if f := procstat.Fields(child); len(f) > 3 && f[3] == strconv.Itoa(pid) {
				return child
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("process %d has no child", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
