package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/syncbuf"
)

// serveOnLedger runs serve in-process on config path with lockWait, and
// returns its stop (which waits for it) and its exit code channel.
func serveOnLedger(t *testing.T, path string, lockWait time.Duration, stderr io.Writer) (stop func() int, done chan int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan int, 1)
	go func() {
		e := &env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: stderr, Getenv: func(string) string { return "" },
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), lockWait: lockWait}
		done <- execute(ctx, rootCommand(), e, []string{"serve", "--config", path})
	}()
	stop = func() int {
		cancel()
		select {
		case code := <-done:
			done <- code
			return code
		case <-time.After(60 * time.Second): // a deadlock guard
			t.Fatal("serve did not stop within 60 s")
			return -1
		}
	}
	t.Cleanup(func() { stop() })
	return stop, done
}

// sameLedgerConfig writes a second configuration beside path's: the same
// ledger (ledger.path is relative to the file), another HTTP port.
func sameLedgerConfig(t *testing.T, path, listen string) (string, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other := freeAddr(t)
	second := filepath.Join(filepath.Dir(path), "second.yaml")
	if err := os.WriteFile(second, []byte(strings.Replace(string(b), listen, other, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return second, other
}

func listening(addr string) bool {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// A second serve on a SQLite ledger a serve is using is refused, naming
// the serve that holds it: two would take each other's paid calls for
// orphans (canceling their hold invoices).
func TestOneServePerSQLiteLedger(t *testing.T) {
	path, listen := freeToolsConfig(t, "")
	serveInProcess(t, path, listen)
	second, listen2 := sameLedgerConfig(t, path, listen)
	stderr := &syncbuf.Buffer{}
	_, done := serveOnLedger(t, second, 500*time.Millisecond, stderr)
	deadline := time.Now().Add(60 * time.Second) // a deadlock guard
	for {
		select {
		case code := <-done:
			done <- code
			want := fmt.Sprintf("is in use by another capvend serve (pid %d): one serve per SQLite ledger", os.Getpid())
			if code == 0 || !strings.Contains(stderr.String(), want) {
				t.Fatalf("second serve exited %d:\n%s\nwant an error saying %q", code, stderr.String(), want)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if listening(listen2) {
			t.Fatalf("a second serve serves on the same SQLite ledger: %s", stderr.String())
		}
		if time.Now().After(deadline) {
			t.Fatal("the second serve neither served nor stopped")
		}
	}
}

// A restart waits for the serve before it to finish and stop, then
// serves.
func TestServeWaitsForTheServeBeforeIt(t *testing.T) {
	path, listen := freeToolsConfig(t, "")
	firstErr := &syncbuf.Buffer{}
	stopFirst, _ := serveOnLedger(t, path, 0, firstErr)
	deadline := time.Now().Add(60 * time.Second) // a deadlock guard
	for !listening(listen) {
		if time.Now().After(deadline) {
			t.Fatalf("the first serve did not listen: %s", firstErr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	second, listen2 := sameLedgerConfig(t, path, listen)
	stderr := &syncbuf.Buffer{}
	_, done := serveOnLedger(t, second, time.Minute, stderr)
	for !strings.Contains(stderr.String(), "waiting up to 1m0s for it to stop") {
		select {
		case code := <-done:
			t.Fatalf("the second serve exited %d before the first stopped: %s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second serve did not say it waits: %s", stderr.String())
		}
	}
	if listening(listen2) {
		t.Fatal("the second serve listens while the first holds the ledger")
	}
	if code := stopFirst(); code != 0 {
		t.Fatalf("the first serve exited %d: %s", code, firstErr.String())
	}
	for !listening(listen2) {
		select {
		case code := <-done:
			t.Fatalf("the second serve exited %d once the first stopped: %s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second serve did not serve once the first stopped: %s", stderr.String())
		}
	}
}
