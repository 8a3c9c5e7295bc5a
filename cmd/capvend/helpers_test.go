package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/syncbuf"
)

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// exampleTools builds cmd/example-tools once per test binary and returns
// its path.
func exampleTools(t testing.TB) string {
	t.Helper()
	toolsOnce.Do(func() {
		if toolsDir, toolsErr = os.MkdirTemp("", "capvend-example-tools-"); toolsErr != nil {
			return
		}
		bin := filepath.Join(toolsDir, "example-tools")
		if out, err := exec.Command("go", "build", "-o", bin, "../example-tools").CombinedOutput(); err != nil {
			toolsErr = fmt.Errorf("build example-tools: %v\n%s", err, out)
		}
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	return filepath.Join(toolsDir, "example-tools")
}

// freeToolsConfig writes a configuration selling example-tools (as a stdio
// child with prefix) with no payment backend: free tools only.
func freeToolsConfig(t testing.TB, prefix string) (path, listen string) {
	t.Helper()
	dir := t.TempDir()
	listen = freeAddr(t)
	path = filepath.Join(dir, "capvend.yaml")
	yaml := fmt.Sprintf("ledger:\n  path: capvend.db\nhttp:\n  listen: %s\nupstreams:\n  - name: tools\n    prefix: %q\n    command: %s\n",
		listen, prefix, exampleTools(t))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, listen
}

// serveInProcess runs `capvend serve --config path` in this process until
// the test ends or stop (then it must exit 0) and returns once it listens.
func serveInProcess(t testing.TB, path, listen string) (stop func()) {
	t.Helper()
	// serve's log, shown when the test fails: the only way to see why an
	// upstream or a payment misbehaved in a run that cannot be repeated.
	var logs io.Writer = &syncbuf.Buffer{}
	if _, bench := t.(*testing.B); bench {
		logs = io.Discard // a benchmark's calls would fill it
	}
	t.Cleanup(func() {
		if sb, ok := logs.(fmt.Stringer); ok && t.Failed() {
			t.Logf("serve's log:\n%s", sb)
		}
	})
	// serve's goroutines (and those they start) carry the label
	// capvend=serve in CPU profiles (go tool pprof -tagfocus).
	sv := runServe(t, path, "serve", slog.New(slog.NewTextHandler(logs, nil)))
	sv.await(t, "listen", func() bool {
		c, err := net.Dial("tcp", listen)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return sv.stop
}

// inProcessServe is a `capvend serve` running in this test binary.
type inProcessServe struct {
	stop   func() // cancels it and waits until it exits (it must exit 0)
	done   chan int
	stderr *lockedWriter
}

// runServe runs `capvend serve --config path` in this process, logging
// to log, its goroutines labelled capvend=label in CPU profiles, until the
// test ends or stop.
func runServe(t testing.TB, path, label string, log *slog.Logger) *inProcessServe {
	ctx, cancel := context.WithCancel(context.Background())
	sv := &inProcessServe{done: make(chan int, 1), stderr: &lockedWriter{w: &strings.Builder{}}}
	go func() {
		e := &env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: sv.stderr,
			Getenv: func(string) string { return "" }, Log: log}
		pprof.Do(ctx, pprof.Labels("capvend", label), func(ctx context.Context) {
			sv.done <- execute(ctx, rootCommand(), e, []string{"serve", "--config", path})
		})
	}()
	var once sync.Once
	sv.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case code := <-sv.done:
				if code != 0 {
					t.Errorf("serve exited %d: %s", code, sv.stderr)
				}
			case <-time.After(60 * time.Second):
				t.Error("serve did not stop within 60 s")
			}
		})
	}
	t.Cleanup(sv.stop)
	return sv
}

// await waits until ready says so, failing the test if serve exits
// first or 60 s pass (a deadlock guard, not a speed check).
func (sv *inProcessServe) await(t testing.TB, what string, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		select {
		case code := <-sv.done:
			sv.done <- code
			t.Fatalf("serve exited %d: %s", code, sv.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not %s: %s", what, sv.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
