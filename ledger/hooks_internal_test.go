package ledger

import "context"

// ExecForTest runs q on the writer connection outside the ledger's
// methods: tests use it to write what an older capvend (or a damaged
// file) would hold.
func (l *Ledger) ExecForTest(ctx context.Context, q string, args ...any) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.wconn.ExecContext(ctx, q, args...)
	return err
}
