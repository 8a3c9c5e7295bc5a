// Package procstat reads a Linux process's /proc/PID/stat: its fields
// (the command name, between parentheses, may hold spaces and
// parentheses) and its CPU time.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go supports (the kernel's ABI fixes it, whatever its
// HZ).
const ClockTicks = 100

// Fields returns the fields of /proc/PID/stat, the command name (without
// its parentheses) as one: Fields(pid)[n-1] is field n of proc(5) (pid 1,
// comm 2, state 3, ppid 4, utime 14, stime 15, starttime 22). nil if the
// process is gone or the file cannot be read.
func Fields(pid int) []string {
	if pid <= 0 {
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	head, _, found := strings.Cut(s[:max(i, 0)], " (")
	if i < 0 || !found {
		return nil
	}
	return append([]string{head, s[len(head)+2 : i]}, strings.Fields(s[i+1:])...)
}

// CPUTicks is the CPU time (user and system: fields 14 and 15) process
// pid used so far, in ClockTicks; false if it cannot be read.
func CPUTicks(pid int) (int64, bool) {
	f := Fields(pid)
	if len(f) < 15 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[13], 10, 64)
	s, err2 := strconv.ParseInt(f[14], 10, 64)
	return u + s, err1 == nil && err2 == nil
}

// CPU is CPUTicks as a duration.
func CPU(pid int) (time.Duration, bool) {
	t, ok := CPUTicks(pid)
	return time.Duration(t) * time.Second / ClockTicks, ok
}
