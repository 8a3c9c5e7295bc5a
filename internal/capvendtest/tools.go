package capvendtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/capvend/capvend/internal/freeport"
)

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// ExampleTools builds cmd/example-tools once per test binary and returns
// its path. Cleanup removes it.
func ExampleTools(t testing.TB) string {
	t.Helper()
	toolsOnce.Do(func() {
		if toolsDir, toolsErr = os.MkdirTemp("", "capvend-example-tools-"); toolsErr != nil {
			return
		}
		bin := filepath.Join(toolsDir, "example-tools")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/capvend/capvend/cmd/example-tools").CombinedOutput(); err != nil {
			toolsErr = fmt.Errorf("build example-tools: %v\n%s", err, out)
		}
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	return filepath.Join(toolsDir, "example-tools")
}

// Cleanup removes what this package built for the test binary (call it
// from TestMain once the tests ran).
func Cleanup() {
	if toolsDir != "" {
		os.RemoveAll(toolsDir)
	}
}

// FreeAddr is a free 127.0.0.1:port for a server the test starts, below
// the range outgoing connections take their ports from (internal/freeport).
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
