package ledger_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/capvend/capvend/internal/skip"
)

// TestMain fails the package's tests if any goroutine is still running
// when they end: every goroutine ledger starts must stop with its context or
// Close. It then reports the tests skipped for a missing tool.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path) // never returns
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		skip.Report()
		os.Exit(code)
	}))
}
