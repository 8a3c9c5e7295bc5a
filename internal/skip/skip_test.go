package skip

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// fakeTB records how a test ended; Skip and Fatalf end its goroutine as
// the real ones do.
type fakeTB struct {
	testing.TB
	name, skipped, failed string
}

func (f *fakeTB) Helper()       {}
func (f *fakeTB) Name() string  { return f.name }
func (f *fakeTB) Skip(a ...any) { f.skipped = fmt.Sprint(a...); runtime.Goexit() }
func (f *fakeTB) Fatalf(format string, a ...any) {
	f.failed = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

func run(f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
}

func TestMissing(t *testing.T) {
	mu.Lock()
	saved := skipped
	skipped = map[string][]string{}
	mu.Unlock()
	defer func() { mu.Lock(); skipped = saved; mu.Unlock() }()

	t.Setenv("CI", "")
	a := &fakeTB{name: "TestA"}
	run(func() { Missing(a, "node is not installed", "apt-get install nodejs npm") })
	if a.skipped != "node is not installed (install: apt-get install nodejs npm)" || a.failed != "" {
		t.Fatalf("without CI: skipped %q, failed %q", a.skipped, a.failed)
	}
	t.Setenv("CI", "true")
	b := &fakeTB{name: "TestB"}
	run(func() { Missing(b, "node is not installed", "apt-get install nodejs npm") })
	if b.skipped != "" || !strings.Contains(b.failed, "node is not installed") || !strings.Contains(b.failed, "CI is set") {
		t.Fatalf("under CI: skipped %q, failed %q", b.skipped, b.failed)
	}

	var out strings.Builder
	mu.Lock()
	writeReport(&out, "cmd/capvend", skipped)
	mu.Unlock()
	want := "skipped in cmd/capvend: 1 test(s)\n  1 × node is not installed (install: apt-get install nodejs npm): TestA\n"
	if out.String() != want {
		t.Fatalf("report:\n%s\nwant:\n%s", out.String(), want)
	}
}
