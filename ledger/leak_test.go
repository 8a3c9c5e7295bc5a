package ledger_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
)

// TestMain fails the package's tests if any goroutine is still running
// when they end: every goroutine ledger starts must stop with its context or
// Close. It starts the PostgreSQL server when the tests run on PostgreSQL
// (see ledger.TestEngineEnv) and stops it before that check, then reports
// the tests skipped for a missing tool.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path) // never returns
	}
	stop, err := ledger.StartTestEngine()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger tests: PostgreSQL:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(runThenStop{m, stop}, goleak.Cleanup(func(code int) {
		skip.Report()
		os.Exit(code)
	}))
}

// runThenStop runs the tests, then stops the test engine's server (its
// connections' goroutines end before goleak looks).
type runThenStop struct {
	m    *testing.M
	stop func()
}

func (r runThenStop) Run() int {
	defer r.stop()
	return r.m.Run()
}
