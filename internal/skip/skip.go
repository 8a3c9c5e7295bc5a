// Package skip is how a test says that it did not run. A test that needs a
// real part this machine lacks (a Debian or npm package, node, the regtest
// binaries) calls Missing: the test is skipped with the reason and the
// command that installs the part, or fails when the CI environment
// variable is set (.ci/run installs every part, so there a missing part is
// a broken CI, never a pass). A test that does not run in -short mode
// calls Short. Both are counted, and a package's TestMain reports them at
// the end:
//
//	func TestMain(m *testing.M) {
//		os.Exit(skip.Run(m))
//	}
//
// `go test ./...` shows nothing of a package that passed but its "ok"
// line, so Report writes to the terminal (/dev/tty) when there is one and
// the run is not verbose; otherwise to stdout, where -v and -json show it.
// Production code never imports this package.
package skip

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

var (
	mu      sync.Mutex
	skipped = map[string][]string{} // reason -> test names
)

// Missing skips t because part is not on this machine, naming the command
// that installs it (install may be empty when there is none to give); when
// CI is set it fails t instead. It does not return.
func Missing(t testing.TB, part, install string) {
	t.Helper()
	why := part
	if install != "" {
		why += " (install: " + install + ")"
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s; CI is set, and .ci/run should have provided it", why)
	}
	record(why, t.Name())
	t.Skip(why)
}

// Short skips t in -short mode, saying what it would have run; otherwise
// it returns.
func Short(t testing.TB, what string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	why := "-short mode: " + what
	record(why, t.Name())
	t.Skip(why)
}

func record(why, test string) {
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(skipped[why], test) {
		skipped[why] = append(skipped[why], test)
	}
}

// Run runs the tests, reports the skips and returns the exit code for
// os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	Report()
	return code
}

// Report prints how many tests were skipped through Missing or Short, and
// why, one line per reason; nothing when none was. See the package doc for
// where it goes.
func Report() {
	mu.Lock()
	defer mu.Unlock()
	if len(skipped) == 0 {
		return
	}
	w := io.Writer(os.Stdout)
	if !testing.Verbose() {
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			defer tty.Close()
			w = tty
		}
	}
	writeReport(w, packageName(), skipped)
}

func writeReport(w io.Writer, pkg string, skipped map[string][]string) {
	n := 0
	reasons := make([]string, 0, len(skipped))
	for why, tests := range skipped {
		n += len(tests)
		reasons = append(reasons, why)
	}
	sort.Strings(reasons)
	var b strings.Builder
	fmt.Fprintf(&b, "skipped in %s: %d test(s)\n", pkg, n)
	for _, why := range reasons {
		tests := skipped[why]
		sort.Strings(tests)
		fmt.Fprintf(&b, "  %d × %s: %s\n", len(tests), why, strings.Join(tests, ", "))
	}
	_, _ = io.WriteString(w, b.String())
}

// packageName is the test's package directory relative to its module
// (go test runs a test binary in its package's directory).
func packageName() string {
	wd, err := os.Getwd()
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if rel, err := filepath.Rel(dir, wd); err == nil {
				return filepath.ToSlash(rel)
			}
			return wd
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return wd
		}
		dir = parent
	}
}
