package testnet

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
)

// sleeper starts a process that lives until the test stops it.
func sleeper(t *testing.T) Proc {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		skip.Missing(t, "no sleep binary", "apt-get install coreutils")
	}
	p, err := spawn(sleep, []string{"3600"}, filepath.Join(t.TempDir(), "sleep.log"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.stop(time.Second) })
	return p
}

// TestLockSharedAfterRemoval: a process that waited for the lock while
// the keeper removed the directory locks the new lock file, not the
// removed one.
func TestLockSharedAfterRemoval(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "shared")
	unlock, err := lockShared(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	got := make(chan func(), 1)
	go func() {
		u, err := lockShared(ctx, dir, func() { close(waiting) })
		if err != nil {
			t.Error(err)
			u = func() {}
		}
		got <- u
	}()
	<-waiting
	if err := removeShared(dir); err != nil {
		t.Fatal(err)
	}
	unlock()
	u := <-got
	defer u()
	// The lock now held is the file in dir: nobody else can take it.
	f, err := os.OpenFile(filepath.Join(dir, sharedLock), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("the waiter holds no lock file in %s: %v", dir, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("the lock file in %s is not locked: %v", dir, err)
	}
}

// TestSweepShared: a shared directory nobody holds and whose keeper is
// gone (a killed run) has its stack stopped and is removed; one with a
// live keeper or holder is left alone.
func TestSweepShared(t *testing.T) {
	root := t.TempDir()
	dead := sleeper(t)
	if err := dead.stop(time.Second); err != nil {
		t.Fatal(err)
	}
	leftover := sleeper(t) // a process of the abandoned stack
	live := sleeper(t)
	for name, st := range map[string]sharedState{
		"abandoned": {Holders: []Proc{dead}, Runs: []Proc{dead}, Keeper: dead},
		"kept":      {Keeper: live},
		"held":      {Holders: []Proc{live}, Keeper: dead},
	} {
		dir := filepath.Join(root, name)
		unlock, err := lockShared(context.Background(), dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeShared(dir, st); err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	s := newStack(Info{Version: 1, Dir: filepath.Join(root, "abandoned", "stack"), Relay: ServiceInfo{Proc: leftover}}, nil)
	if err := os.MkdirAll(s.Info.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.writeInfo(); err != nil {
		t.Fatal(err)
	}

	sweepShared(context.Background(), root, filepath.Join(root, "mine"))
	if leftover.Alive() {
		t.Error("the abandoned stack's process still runs")
	}
	if _, err := os.Stat(filepath.Join(root, "abandoned")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the abandoned directory is still there: %v", err)
	}
	for _, name := range []string{"kept", "held"} {
		if _, err := os.Stat(filepath.Join(root, name, sharedFile)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestShared runs one shared stack through its life: two holders share
// it, a payment of one moves its Balance and not the other's, a stack
// whose keeper was killed is reused, and once the holders released it and
// their run ended the keeper stops it and removes its directory.
//
// Its first bring-up also meets a port clash: the vendor lnd's gRPC port is
// taken before Start hands it out; lnd fails to bind, and Start must start
// over on fresh ports instead of failing.
func TestShared(t *testing.T) {
	skip.Short(t, "starts a regtest stack")
	// Parallel with TestStack and TestStackPostgres, which start their
	// stacks with Start (or none) and never read currentRun, which only
	// Shared reads: no other test calls Shared.
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	exe, err := BuildCapvend(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	run := sleeper(t) // stands for the go command
	currentRun = func() (Proc, bool) { return run, true }
	defer func() { currentRun = goRun }()
	// A root of its own: Shared sweeps the shared directory's siblings.
	root, err := os.MkdirTemp("", "capvend-shared-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	dir := filepath.Join(root, "stack")

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var calls atomic.Int32
	clash := func(n int) ([]int, error) {
		ps, err := freePorts(n)
		if err == nil && calls.Add(1) == 1 {
			ps[2] = taken.Addr().(*net.TCPAddr).Port // vendor lnd --rpclisten
		}
		return ps, err
	}
	opts := SharedOptions{Dir: dir, Executable: exe, Progress: tlog{t}, reservePorts: clash}
	stopped := false
	defer func() {
		if !stopped {
			_ = Stop(context.Background(), filepath.Join(dir, "stack"), nil)
			if st, err := readShared(dir); err == nil {
				_ = st.Keeper.stop(time.Second)
			}
		}
	}()

	s1, release1, err := Shared(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Fatalf("ports reserved %d times, want 2 (one retry)", calls.Load())
	}
	if v, _ := s1.Node(Vendor); v.RPCHost == taken.Addr().String() {
		t.Fatal("vendor still on the taken port")
	}
	s2, release2, err := Shared(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Info.Btcd.PID != s1.Info.Btcd.PID {
		t.Fatalf("the second holder got another stack: btcd %d, want %d", s2.Info.Btcd.PID, s1.Info.Btcd.PID)
	}
	st, err := readShared(dir)
	if err != nil || len(st.Holders) != 2 || len(st.Runs) != 1 || !st.Keeper.Alive() {
		t.Fatalf("shared state %+v %v: want two holders, one run, a live keeper", st, err)
	}

	t.Run("Balance counts only its own payments", func(t *testing.T) {
		b1, err := s1.Balance(ctx, Customer)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := s2.Balance(ctx, Customer)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := s2.ChannelBalance(ctx, Customer)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := s1.Invoice(ctx, 21, "shared")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s1.Pay(ctx, inv.PaymentRequest); err != nil {
			t.Fatal(err)
		}
		refund, err := s1.InvoiceOn(ctx, Customer, 5, "refund")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s1.PayFrom(ctx, Vendor, refund.PaymentRequest); err != nil {
			t.Fatal(err)
		}
		// A payment lnd refuses before sending anything moves nothing.
		self, err := s1.InvoiceOn(ctx, Customer, 7, "to myself")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s1.Pay(ctx, self.PaymentRequest); err == nil {
			t.Fatal("lnd paid the customer's own invoice")
		}
		if a1, err := s1.Balance(ctx, Customer); err != nil || b1-a1 != 16_000 {
			t.Errorf("holder 1's Balance moved by %d msat (%v), want 16000 (21 sat paid, 5 refunded)", b1-a1, err)
		}
		if a2, err := s2.Balance(ctx, Customer); err != nil || a2 != b2 {
			t.Errorf("holder 2's Balance moved by %d msat (%v) for holder 1's payments", b2-a2, err)
		}
		// The channel balance follows once the refund's HTLC is
		// settled on the customer's side too.
		var a2 int64
		err = poll(ctx, 30*time.Second, 50*time.Millisecond, "the customer's channel balance to move by 16000 msat", func() (bool, error) {
			var err error
			a2, err = s2.ChannelBalance(ctx, Customer)
			return err == nil && c2-a2 == 16_000, err
		})
		if err != nil {
			t.Errorf("%v: moved by %d", err, c2-a2)
		}
	})

	// Releasing one holding keeps the other.
	if err := release2(); err != nil {
		t.Fatal(err)
	}
	if err := release2(); err != nil { // idempotent
		t.Fatal(err)
	}
	if st, err := readShared(dir); err != nil || len(st.Holders) != 1 {
		t.Fatalf("shared state %+v %v after one release: want one holder", st, err)
	}

	// A killed run: its keeper and its test binaries die with it, the
	// holders never release.
	if err := st.Keeper.stop(0); err != nil {
		t.Fatal(err)
	}
	dead := sleeper(t)
	if err := dead.stop(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := run.stop(time.Second); err != nil {
		t.Fatal(err)
	}
	st.Holders = []Proc{dead, dead}
	if err := writeShared(dir, st); err != nil {
		t.Fatal(err)
	}
	s1.Release()
	s2.Release()
	_ = release1
	run = sleeper(t) // the next run
	s3, release3, err := Shared(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if s3.Info.Btcd.PID != s1.Info.Btcd.PID {
		t.Fatalf("the healthy stack of a killed run was replaced: btcd %d, want %d", s3.Info.Btcd.PID, s1.Info.Btcd.PID)
	}
	st, err = readShared(dir)
	if err != nil || len(st.Holders) != 1 || len(st.Runs) != 1 || !sameProc(st.Runs[0], run) || !st.Keeper.Alive() {
		t.Fatalf("shared state %+v %v: want one holder (the dead ones pruned), the new run, a new keeper", st, err)
	}
	procs := s3.procs()

	// The last holder leaves, then the run ends: the keeper stops the
	// stack and removes dir.
	if err := release3(); err != nil {
		t.Fatal(err)
	}
	if err := run.stop(time.Second); err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, 2*time.Minute, 100*time.Millisecond, "the keeper to remove "+dir, func() (bool, error) {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped = true
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("%s (pid %d) outlived the shared stack", p.name, p.PID)
		}
	}
}

// TestKeepOnce: the keeper keeps the stack while a run goes on without
// holders, and stops it (removing the directory) once nothing is left.
func TestKeepOnce(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "shared")
	me := selfProc()
	run := sleeper(t)
	unlock, err := lockShared(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = writeShared(dir, sharedState{Runs: []Proc{run}, Keeper: me})
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if done, err := keepOnce(ctx, dir, me, nil); done || err != nil {
		t.Fatalf("keepOnce with a live run: done %v, %v", done, err)
	}
	if done, err := keepOnce(ctx, dir, Proc{PID: me.PID, StartTicks: me.StartTicks + 1}, nil); !done || err != nil {
		t.Fatalf("a replaced keeper: done %v, %v; want done", done, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("a replaced keeper removed %s: %v", dir, err)
	}
	if err := run.stop(time.Second); err != nil {
		t.Fatal(err)
	}
	if done, err := keepOnce(ctx, dir, me, nil); !done || err != nil {
		t.Fatalf("keepOnce once the run ended: done %v, %v", done, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is still there: %v", dir, err)
	}
}

// tlog turns progress lines into t.Log lines.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
