package cashu

import "github.com/capvend/capvend/ledger"

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
