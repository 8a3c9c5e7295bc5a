package testnet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capvend/capvend/internal/procstat"
)

// Proc records one process of the stack: enough to find it again from
// testnet.json and to stop exactly that process, never a recycled pid.
type Proc struct {
	// PID is the process id; the process leads its own process group.
	PID int `json:"pid"`
	// StartTicks is the process start time in clock ticks since boot
	// (field 22 of /proc/PID/stat). A pid whose start time differs is a
	// different process and is never signalled.
	StartTicks uint64 `json:"start_ticks"`
	// Log is the file receiving the process's stdout and stderr.
	Log string `json:"log"`
	// Cmd is the command line, for humans.
	Cmd []string `json:"cmd"`
}

// spawn starts bin with args in its own process group (so a Ctrl-C sent to
// the caller's terminal group does not reach it), stdin from /dev/null,
// stdout and stderr appended to logPath. If tied, the kernel sends the
// process SIGTERM when the caller dies (a crashed test binary must not
// leak a stack); otherwise it outlives the caller. It does not wait for
// the process; the caller owns stopping it.
func spawn(bin string, args []string, logPath string, tied bool) (Proc, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return Proc{}, err
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Proc{}, fmt.Errorf("open log: %w", err)
	}
	defer lf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if tied {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := Proc{PID: cmd.Process.Pid, Log: logPath, Cmd: append([]string{bin}, args...)}
	p.StartTicks, _ = startTicks(p.PID)
	// We reap with wait4 in alive(); release the os.Process so nothing
	// else waits on it.
	_ = cmd.Process.Release()
	return p, nil
}

// startTicks reads the start time of pid from /proc (field 22 of its
// stat).
func startTicks(pid int) (uint64, error) {
	f := procstat.Fields(pid)
	if len(f) < 22 {
		return 0, errors.New("no stat")
	}
	return strconv.ParseUint(f[21], 10, 64)
}

// procState returns the one-letter state of pid from /proc ("" if gone).
func procState(pid int) string {
	if f := procstat.Fields(pid); len(f) > 2 {
		return f[2]
	}
	return ""
}

// Alive reports whether the recorded process is still running. A zombie
// counts as gone (it is reaped here when it is our child), and so does a
// pid now used by another process (different start time).
func (p Proc) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	var ws syscall.WaitStatus
	if wpid, err := syscall.Wait4(p.PID, &ws, syscall.WNOHANG, nil); err == nil && wpid == p.PID {
		return false // it was our child and has exited; now reaped
	}
	switch procState(p.PID) {
	case "", "Z", "X":
		return false
	}
	if p.StartTicks != 0 {
		if st, err := startTicks(p.PID); err != nil || st != p.StartTicks {
			return false
		}
	}
	return true
}

// stop sends SIGTERM to the process group of p, waits up to grace for the
// process to exit, then SIGKILLs the group and waits again. It returns nil
// once the process is gone (or was already gone), and an error naming the
// pid if it survived SIGKILL.
func (p Proc) stop(grace time.Duration) error {
	if !p.Alive() {
		return nil
	}
	_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	if p.waitGone(grace) {
		return nil
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
	if p.waitGone(10 * time.Second) {
		return nil
	}
	return fmt.Errorf("pid %d did not exit after SIGKILL", p.PID)
}

func (p Proc) waitGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !p.Alive() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rssKB returns the resident set size of the process in KiB, or 0.
func (p Proc) rssKB() int64 {
	if !p.Alive() {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// poll calls f every interval until it returns true or a non-nil error, the
// context ends, or timeout passes. what names the awaited condition in the
// timeout error; last carries f's most recent transient complaint.
func poll(parent context.Context, timeout, interval time.Duration, what string, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if perr := parent.Err(); perr != nil {
				return fmt.Errorf("interrupted while waiting for %s: %w", what, perr)
			}
			return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, ctx.Err())
		case <-t.C:
		}
	}
}
