package ledger_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
)

// TestClaimRequestOnceAcrossHandles: two ledger handles on one database
// (two instances) race to claim the same request keys; each key is won by
// exactly one holder, a holder claiming its own key again still has it,
// the other never gets it, and pruning deletes the claims made before.
func TestClaimRequestOnceAcrossHandles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	a := openLedger(t, path)
	b, err := ledger.OpenForTest(t, ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const keys = 20
	var won [keys]atomic.Int32
	var wg sync.WaitGroup
	for i := range keys {
		for j, l := range []*ledger.Ledger{a, b, a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				holder := fmt.Sprint("instance-", j%2)
				ok, err := l.ClaimRequest(ctx, fmt.Sprint("nostr:ev", i), holder)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					won[i].Add(1 << (4 * (j % 2)))
				}
			}()
		}
	}
	wg.Wait()
	for i := range keys {
		// Each holder claimed twice: the winner got true twice (its
		// own claim again), the other got false twice.
		if w := won[i].Load(); w != 2 && w != 2<<4 {
			t.Errorf("key %d: claims won %#x, want both by one holder", i, w)
		}
	}
	if _, err := a.ClaimRequest(ctx, "", "x"); err == nil {
		t.Error("an empty key was claimed")
	}
	if n, err := b.PruneRequestClaims(ctx, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil || n != 0 {
		t.Errorf("prune before 2000: %d, %v", n, err)
	}
	if n, err := b.PruneRequestClaims(ctx, time.Now().Add(time.Hour*24*365*100)); err != nil || n != keys {
		t.Errorf("prune all: %d, %v; want %d", n, err, keys)
	}
	if ok, err := a.ClaimRequest(ctx, "nostr:ev0", "instance-9"); err != nil || !ok {
		t.Errorf("a pruned key claimed again: %v, %v", ok, err)
	}
}
