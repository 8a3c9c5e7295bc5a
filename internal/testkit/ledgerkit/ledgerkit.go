// Package ledgerkit is the part of capvend's test kit (internal/testkit)
// that knows the ledger: opening one for a test and checking it verifies.
// It is apart so that tests of packages that must not depend on the
// ledger (adapters) can use the rest of the kit.
package ledgerkit

import (
	"context"
	"strings"
	"testing"

	"github.com/capvend/capvend/ledger"
)

// Open opens the ledger at path with opts until the test ends.
func Open(t testing.TB, path string, opts ledger.Options) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// Verify fails the test unless l verifies, printing the report.
func Verify(t testing.TB, l *ledger.Ledger) {
	t.Helper()
	r, err := l.Verify(context.Background())
	if err != nil || !r.OK() {
		var b strings.Builder
		if r != nil {
			r.WriteTo(&b)
		}
		t.Fatalf("verify: %v\n%s", err, b.String())
	}
}

// OpenVerified opens the existing ledger at path until the test ends and
// fails the test unless it verifies.
func OpenVerified(t testing.TB, path string) *ledger.Ledger {
	t.Helper()
	l := Open(t, path, ledger.Options{MustExist: true})
	Verify(t, l)
	return l
}
