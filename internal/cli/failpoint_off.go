//go:build !capvend_failpoints

package cli

// failpoints: a release build has no crash hook (see failpoint_on.go,
// built with -tags capvend_failpoints for the crash tests).
func failpoints(func(string) string) func(step string) { return nil }
