package procstat

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// A process whose name has spaces and a parenthesis still parses: the
// name is one field, and the CPU times are where /proc documents them.
func TestFieldsOfAnOddlyNamedProcess(t *testing.T) {
	cmd := oddProcess(t)
	pid := cmd.Process.Pid
	deadline := time.Now().Add(20 * time.Second)
	for {
		if ticks, ok := CPUTicks(pid); ok && ticks > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no CPU time read for a busy process")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f := Fields(pid)
	if f[0] != strconv.Itoa(pid) || f[1] != "a b) c" || f[3] != strconv.Itoa(os.Getpid()) {
		t.Fatalf("pid %q, name %q, parent %q; want %d, %q, %d", f[0], f[1], f[3], pid, "a b) c", os.Getpid())
	}
	if d, ok := CPU(pid); !ok || d <= 0 {
		t.Fatalf("CPU %v %v", d, ok)
	}
	if _, ok := CPUTicks(1 << 30); ok {
		t.Fatal("a missing process has CPU time")
	}
}

// oddProcess starts a shell named "a b) c" that runs a busy loop, then
// sleeps; it is killed when the test ends.
func oddProcess(t *testing.T) *exec.Cmd {
	dir := t.TempDir()
	odd := dir + "/a b) c"
	if err := os.Symlink("/bin/sh", odd); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}
