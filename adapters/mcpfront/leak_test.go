package mcpfront

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine is still running
// when they end: every goroutine the front (or mcp-go under it) starts
// for a request, a stream or an elicitation must stop with it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
