package main

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// A process whose name has spaces and a parenthesis still parses: the
// name is one field, and the CPU times are where /proc documents them.
func TestStatFieldsOfAnOddlyNamedProcess(t *testing.T) {
	dir := t.TempDir()
	odd := dir + "/a b) c"
	if err := os.Symlink("/bin/sh", odd); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	deadline := time.Now().Add(20 * time.Second)
	for procTicks(pid) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no CPU time read for a busy process")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f := statFields(pid)
	if f[0] != strconv.Itoa(pid) || f[1] != "a b) c" {
		t.Fatalf("pid %q, name %q; want %d, %q", f[0], f[1], pid, "a b) c")
	}
	if ppid := allParents()[pid]; ppid != os.Getpid() {
		t.Fatalf("parent %d, want %d", ppid, os.Getpid())
	}
	if busy, idle := machineTicks(); busy <= 0 || idle <= 0 {
		t.Fatalf("machine ticks busy %d idle %d", busy, idle)
	}
	if procTicks(1<<30) != 0 {
		t.Fatal("a missing process has CPU time")
	}
}
