package lnd

// WatchHold starts ref's hold invoice watch as Request and the reconcile
// do, for tests that start it late.
func (b *Backend) WatchHold(ref string) { b.watchHold(ref) }
