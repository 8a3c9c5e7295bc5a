package cashu

import (
	"context"
	"time"

	"github.com/capvend/capvend/ledger"
)

// Covered reports whether an acknowledged NUT-17 subscription covers the
// watched quote ref: what the NUT-17 tests wait for before they pay.
func (b *Backend) Covered(ref string) bool {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	q, ok := b.watched[ref]
	return ok && q.covered
}

// The ledger is what the backend and the operator commands use; billing/cashu
// itself does not import it.
var (
	_ tokenLedger = (*ledger.Ledger)(nil)
	_ Journal     = (*ledger.Ledger)(nil)
)

// CheckNow has the watched quote ref checked at once by Run and returns
// once a check of it that began after the call has ended, or ref is no
// longer watched (Run is done with it: nothing checks it again). Tests
// call it before a negative check ("nothing was booked"), which is then
// strict. It fails when ctx ends first.
func (b *Backend) CheckNow(ctx context.Context, ref string) error {
	b.qmu.Lock()
	q, ok := b.watched[ref]
	var want int
	if ok {
		want = q.checks + 1
		if q.busy {
			want++ // the check under way began before the call
		}
	}
	b.qmu.Unlock()
	if !ok {
		return nil
	}
	b.urgent(ref)
	for {
		b.qmu.Lock()
		q, ok := b.watched[ref]
		done := !ok || q.checks >= want
		b.qmu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// SetCLIFailpoint sets the operator commands' FailAfterPayout hook.
func SetCLIFailpoint(f func(step string)) { cliFailpoint = f }
