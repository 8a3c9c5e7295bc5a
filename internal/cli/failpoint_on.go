//go:build capvend_failpoints

package cli

import (
	"os"
	"syscall"
)

// failpoints returns the crash tests' hook, in builds with the
// capvend_failpoints tag only: with CAPVEND_FAILPOINT set to a step of a
// paid call (after_quote, after_invoice, after_settlement,
// during_execution, after_result; Cashu: after_swap, between a token's
// swap and its record, and after_mint, between minting a paid quote and
// its record), capvend kills itself with SIGKILL there, like a power cut.
func failpoints(getenv func(string) string) func(step string) {
	want := getenv("CAPVEND_FAILPOINT")
	if want == "" {
		return nil
	}
	return func(step string) {
		if step == want {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
}
