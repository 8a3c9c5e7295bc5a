package main

import (
	"os"
	"os/exec"
	"testing"
)

// allParents finds a child's parent, and the machine's ticks are read.
func TestParentsAndMachineTicks(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if ppid := allParents()[cmd.Process.Pid]; ppid != os.Getpid() {
		t.Fatalf("parent %d, want %d", ppid, os.Getpid())
	}
	if busy, idle := machineTicks(); busy <= 0 || idle <= 0 {
		t.Fatalf("machine ticks busy %d idle %d", busy, idle)
	}
}
