package vend

// ParseArgsForTest exposes parseArgs to the fuzz target.
var ParseArgsForTest = parseArgs

// WaitingForTest reports whether a request waits for the payment ref.
func (v *Vendor) WaitingForTest(ref string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.waiters[ref]) > 0
}
