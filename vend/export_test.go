package vend

import "context"

// ParseArgsForTest exposes parseArgs to the fuzz target.
var ParseArgsForTest = parseArgs

// WaitingForTest reports whether a request waits for the payment ref.
func (v *Vendor) WaitingForTest(ref string) bool {
	return v.waiters.waiting(ref)
}

// SetIssueLineForTest gives v a line for turns to issue payment requests
// of turns turns and waiting places (before any call).
func SetIssueLineForTest(v *Vendor, turns, waiting int) { v.issue = newIssueQueue(turns, waiting) }

// TakeIssueTurnForTest takes a turn to issue a payment request, as a
// request being issued would; the returned func gives it back.
func TakeIssueTurnForTest(v *Vendor) (func(), error) {
	t, err := v.issue.join("test-holder", false)
	if err != nil {
		return nil, err
	}
	return func() { v.issue.leave(t) }, v.issue.wait(context.Background(), t)
}

// RecoveredForTest is closed when Run's Recover has returned: all a
// previous run left is handled then.
func (v *Vendor) RecoveredForTest() <-chan struct{} { return v.recovered }

// SetRecoverFullForTest makes Recover call f each time every worker is
// busy, with how many calls it had handed out (see recoverFull); the
// returned func removes it. Not for parallel tests.
func SetRecoverFullForTest(f func(started int)) (restore func()) {
	recoverFull = f
	return func() { recoverFull = nil }
}
