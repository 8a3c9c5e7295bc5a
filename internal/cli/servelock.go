package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// One serve per SQLite ledger.
//
// A serve watches every invoice of its LND node and takes a payment it
// has no waiting call for as an orphan: a locked-in hold invoice is
// canceled, a settled one is run and its answer kept. Two serves on one
// SQLite ledger (no leases, no claims: those are PostgreSQL's) would each
// take the other's paid calls for orphans. That happened in a restart:
// the old serve, still draining its requests, canceled the hold invoices
// of calls the new one was running, and the customers' paid calls failed.
// So serve holds an exclusive lock on LEDGER.lock while it runs; a second
// serve waits for it (a restart waits for the old serve's drain, up to
// 30 s) and then refuses. The kernel releases the lock when the process
// ends, however it ends.

// serveLockWait is how long a serve waits for the serve before it to stop.
const serveLockWait = 40 * time.Second

// lockLedger takes the lock of the SQLite ledger at path, waiting up to
// wait for a serve holding it (saying so on say), and returns its release.
func lockLedger(ctx context.Context, path string, wait time.Duration, say io.Writer) (func(), error) {
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	told := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("ledger lock %s: %w", name, err)
		}
		holder := lockHolder(f)
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("ledger %s is in use by another capvend serve%s: one serve per SQLite ledger "+
				"(give each its own ledger.path, or share a PostgreSQL ledger: ledger.driver postgres)", path, holder)
		}
		if !told {
			fmt.Fprintf(say, "capvend: ledger %s is in use by another capvend serve%s; waiting up to %s for it to stop\n",
				path, holder, wait.Round(time.Second))
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Who holds it, for the message of the next serve.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}

// lockHolder is " (pid N)" from the lock file, or "" if it does not say.
func lockHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}
