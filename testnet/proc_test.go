package testnet

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
)

func TestRequireLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:3338", true},
		{"[::1]:3338", true},
		{"0.0.0.0:3338", false},
		{":3338", false},
		{"localhost:3338", false}, // names may resolve anywhere
		{"192.168.1.2:80", false},
		{"127.0.0.1", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			if err := requireLoopback(tc.addr); (err == nil) != tc.ok {
				t.Fatalf("requireLoopback(%q) = %v, want ok=%v", tc.addr, err, tc.ok)
			}
		})
	}
}

func TestProcLifecycle(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		skip.Missing(t, "no sleep binary", "apt-get install coreutils")
	}
	p, err := spawn(sleep, []string{"60"}, filepath.Join(t.TempDir(), "sleep.log"), true)
	if err != nil {
		t.Fatal(err)
	}
	if p.StartTicks == 0 || !p.Alive() {
		t.Fatalf("spawned process not alive: %+v", p)
	}
	// A recycled pid (different start time) is never ours.
	other := p
	other.StartTicks++
	if other.Alive() {
		t.Fatal("a pid with another start time counts as alive")
	}
	if err := other.stop(time.Second); err != nil || !p.Alive() {
		t.Fatalf("stop of a mismatched record signalled the process (err %v)", err)
	}
	if err := p.stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Alive() {
		t.Fatal("process alive after stop")
	}
	if err := p.stop(time.Second); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

func TestLoadWithoutStack(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, nil); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Load(empty) = %v, want ErrNotRunning", err)
	}
	// A stale file whose processes are gone.
	stale := `{"version":1,"ready":true,"btcd":{"pid":2147483646,"start_ticks":1}}`
	if err := os.WriteFile(filepath.Join(dir, InfoFile), []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, nil); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Load(stale) = %v, want ErrNotRunning", err)
	}
	if err := Stop(context.Background(), dir, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, InfoFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Stop left the stale %s (%v)", InfoFile, err)
	}
}

func TestFreePorts(t *testing.T) {
	ps, err := freePorts(13)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: bad or repeated %d", ps, p)
		}
		seen[p] = true
	}
}

// TestDeadReport: a failed test run is told which of the stack's
// processes died, with the end of its log, and nothing of those running.
func TestDeadReport(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		skip.Missing(t, "no sh", "apt-get install dash")
	}
	dir := t.TempDir()
	dead, err := spawn(sh, []string{"-c", "echo starting; echo 'panic: the mint fell over'; exit 2"}, filepath.Join(dir, "mint.log"), true)
	if err != nil {
		t.Fatal(err)
	}
	alive, err := spawn(sh, []string{"-c", "echo relay up; exec sleep 60"}, filepath.Join(dir, "relay.log"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer alive.stop(5 * time.Second)
	for deadline := time.Now().Add(10 * time.Second); dead.Alive(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("sh -c exit 2 still running")
		}
	}
	s := &Stack{}
	s.Info.Mint.Proc, s.Info.Relay.Proc = dead, alive
	got := s.DeadReport(20)
	if !strings.Contains(got, "cashu mint (pid ") || !strings.Contains(got, "mint.log") ||
		!strings.Contains(got, "... the mint fell over\n") || strings.Contains(got, "panic") || strings.Contains(got, "relay") {
		t.Fatalf("report:\n%s", got)
	}
	s.Info.Mint.Proc = alive
	if got := s.DeadReport(20); got != "" {
		t.Fatalf("every process runs, report:\n%s", got)
	}
}
