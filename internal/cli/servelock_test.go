package cli

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
)

// sameLedgerConfig writes a second configuration beside path's: the same
// ledger (ledger.path is relative to the file), another HTTP port.
func sameLedgerConfig(t *testing.T, path, listen string) (string, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other := capvendtest.FreeAddr(t)
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
	path, listen := capvendtest.FreeToolsConfig(t, "")
	startCapvend(t, path)
	second, listen2 := sameLedgerConfig(t, path, listen)
	sv := startCapvend(t, second, capvendtest.Options{LockWait: 500 * time.Millisecond, NoWait: true})
	deadline := time.Now().Add(60 * time.Second) // a deadlock guard
	for {
		if code, exited := sv.Exited(); exited {
			want := fmt.Sprintf("is in use by another capvend serve (pid %d): one serve per SQLite ledger", os.Getpid())
			if code == 0 || !strings.Contains(sv.Stderr(), want) {
				t.Fatalf("second serve exited %d:\n%s\nwant an error saying %q", code, sv.Stderr(), want)
			}
			return
		}
		if listening(listen2) {
			t.Fatalf("a second serve serves on the same SQLite ledger: %s", sv.Stderr())
		}
		if time.Now().After(deadline) {
			t.Fatal("the second serve neither served nor stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A restart waits for the serve before it to finish and stop, then
// serves.
func TestServeWaitsForTheServeBeforeIt(t *testing.T) {
	path, listen := capvendtest.FreeToolsConfig(t, "")
	first := startCapvend(t, path)
	second, listen2 := sameLedgerConfig(t, path, listen)
	sv := startCapvend(t, second, capvendtest.Options{LockWait: time.Minute, NoWait: true})
	sv.Await("saying it waits for the first", func() bool {
		return strings.Contains(sv.Stderr(), "waiting up to 1m0s for it to stop")
	})
	if listening(listen2) {
		t.Fatal("the second serve listens while the first holds the ledger")
	}
	first.Stop()
	sv.Await("serving once the first stopped", func() bool { return listening(listen2) })
}
