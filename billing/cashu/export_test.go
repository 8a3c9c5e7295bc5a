package cashu

// Covered reports whether an acknowledged NUT-17 subscription covers the
// watched quote ref: what the NUT-17 tests wait for before they pay.
func (b *Backend) Covered(ref string) bool {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	q, ok := b.watched[ref]
	return ok && q.covered
}
