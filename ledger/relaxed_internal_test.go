package ledger

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// openTemp opens a new ledger in the test's temporary directory, closed
// when the test ends.
func openTemp(t *testing.T) *Ledger {
	t.Helper()
	l, err := OpenForTest(t, context.Background(), filepath.Join(t.TempDir(), "capvend.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestWriteRelaxedRestoresFullSync: money transactions after a stored
// reply (or a failed relaxed write) are fsynced again.
func TestWriteRelaxedRestoresFullSync(t *testing.T) {
	ctx := context.Background()
	l := openTemp(t)
	sync := func() int {
		t.Helper()
		l.wmu.Lock()
		defer l.wmu.Unlock()
		var v int
		if l.pg { // synchronous_commit: on is FULL's counterpart
			var s string
			if err := l.wconn.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&s); err != nil {
				t.Fatal(err)
			}
			return map[string]int{"on": 2, "off": 1}[s]
		}
		if err := l.wconn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	const full = 2
	if got := sync(); got != full {
		t.Fatalf("synchronous = %d at open, want FULL (2)", got)
	}
	if _, err := l.RememberReply(ctx, "k", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if got := sync(); got != full {
		t.Fatalf("synchronous = %d after a stored reply, want FULL (2)", got)
	}
	boom := errors.New("boom")
	if err := l.writeRelaxed(ctx, func(*wtx, time.Time) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if got := sync(); got != full {
		t.Fatalf("synchronous = %d after a failed relaxed write, want FULL (2)", got)
	}
}
