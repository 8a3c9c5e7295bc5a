// Package teststack gives a package's tests the regtest stack that every
// test binary of one `go test` run shares (testnet.Shared): the first test
// that needs it attaches, starting the stack if no other test binary has;
// the package's TestMain gives it back. With CAPVEND_TEST_STACK=DIR the
// tests use the stack running in DIR instead.
//
//	func TestMain(m *testing.M) {
//		os.Exit(teststack.Run(m))
//	}
//
//	func TestSomething(t *testing.T) {
//		s := teststack.Need(t)
//		...
//	}
//
// The stack is shared, concurrently, with other packages' tests: a test
// must not stop or restart its nodes, must measure what it paid with
// Stack.Balance (not ChannelBalance), and must not count what it did not
// create (invoices, events on the relay, the mint's keysets). A test that
// needs a stack of its own calls testnet.Start.
package teststack

import (
	"context"
	"flag"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
)

var (
	mu      sync.Mutex
	started bool
	done    = make(chan struct{}) // closed once attached (or failed)
	stack   *testnet.Stack
	release func() error
	err     error
)

// begin starts attaching, once, in the background.
func begin() {
	mu.Lock()
	defer mu.Unlock()
	if started {
		return
	}
	started = true
	go func() {
		defer close(done)
		stack, release, err = testnet.Shared(context.Background(), testnet.SharedOptions{Progress: os.Stderr})
	}()
}

// Prepare starts attaching to the shared stack in the background, so that
// a package's own slow setup (building binaries) overlaps the stack's
// bring-up; Need then waits for it. It does nothing in -short mode.
func Prepare() {
	if !testing.Short() {
		begin()
	}
}

// Need returns the shared stack, attaching to it (or starting it) on first
// use; in -short mode it skips t. Bring-up progress goes to stderr. A
// failure to start fails t, and every later caller.
func Need(t testing.TB) *testnet.Stack {
	t.Helper()
	skip.Short(t, "needs the regtest stack")
	begin()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	return stack
}

// Parallel sets -test.parallel to n unless the command line gave it or
// GOMAXPROCS (its default) is already as high: for a package whose
// parallel tests mostly wait on the stack (payments, expiries, polling),
// more than the cores at once. Call it from TestMain before Run; it
// parses the flags.
func Parallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// Run runs m's tests, reports the stack's dead processes if a test
// failed, gives the stack back if Need attached to it, prints the
// package's skips (skip.Report) and returns the exit code for os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		reportDead()
	}
	Release()
	skip.Report()
	return code
}

// reportDead prints, for a package whose tests failed, the shared stack's
// processes that died, with the end of their logs: a test failing with
// "connection refused" is explained there, and the logs are gone with the
// stack once the run ends.
func reportDead() {
	if attached() && stack != nil {
		os.Stderr.WriteString(stack.DeadReport(4000))
	}
}

// Release gives the stack back, if Need or Prepare attached to it (waiting
// for an attachment under way); the last test binary of the run to do so
// (or to exit) has it stopped. Safe to call more than once.
func Release() {
	if attached() && release != nil {
		if err := release(); err != nil {
			os.Stderr.WriteString("teststack: " + err.Error() + "\n")
		}
	}
}

// attached reports whether Need or Prepare began attaching, after
// waiting for that attachment to end (stack, release and err are then
// set).
func attached() bool {
	mu.Lock()
	s := started
	mu.Unlock()
	if s {
		<-done
	}
	return s
}
