package vend_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// commitWatch is the Observer of a test's ledger: each committed write
// wakes whoever waits for the ledger to change, so a test waits for the
// change it expects (waitState) instead of reading the ledger in a loop.
type commitWatch struct {
	vend.NopObserver
	mu      sync.Mutex
	changed chan struct{} // closed at the next commit
}

// LedgerCommit implements vend.Observer.
func (w *commitWatch) LedgerCommit(time.Duration, int) {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// next is closed at the next commit after it was taken: take it, then
// read the ledger, then wait on it, and no commit is missed between.
func (w *commitWatch) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// watches maps each ledger openLedger opened to its commitWatch.
var watches sync.Map

// openLedger opens a ledger as ledger.Open does, watched: waitState can
// wait for its commits.
func openLedger(ctx context.Context, path string, o ledger.Options) (*ledger.Ledger, error) {
	w := &commitWatch{changed: make(chan struct{})}
	o.Observer = w
	l, err := ledger.Open(ctx, path, o)
	if err == nil {
		watches.Store(l, w)
	}
	return l, err
}

// tempLedger opens a watched ledger (openLedger) in a new file of the
// test's temp dir, closed when the test ends.
func tempLedger(t testing.TB) *ledger.Ledger {
	t.Helper()
	l, err := openLedger(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// waitState waits until call id is in state want, waking at each commit
// of the ledger, and returns it.
func waitState(t *testing.T, l *ledger.Ledger, id vend.CallID, want vend.CallState) vend.Call {
	t.Helper()
	v, ok := watches.Load(l)
	if !ok {
		t.Fatal("waitState: open the ledger with openLedger")
	}
	w := v.(*commitWatch)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		changed := w.next()
		c, err := l.Call(context.Background(), id)
		if err == nil && c.State == want {
			return c
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("call %d is %s, want %s (err %v)", id, c.State, want, err)
		}
	}
}
