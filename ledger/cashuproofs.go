package ledger

import (
	"context"
	"fmt"
	"strings"
)

// ProofsReceived reports how many of the given Cashu proof secret hashes
// (hex SHA-256 of each secret) were recorded by ClaimProofs before. It only
// reads: a backend uses it to refuse a replayed token before contacting the
// mint; ClaimProofs remains the exactly-once claim.
func (l *Ledger) ProofsReceived(ctx context.Context, secretHashes []string) (int, error) {
	if len(secretHashes) == 0 {
		return 0, nil
	}
	if len(secretHashes) > 1000 {
		return 0, fmt.Errorf("proofs received: %d hashes (at most 1000)", len(secretHashes))
	}
	args := make([]any, len(secretHashes))
	for i, h := range secretHashes {
		args[i] = h
	}
	var n int
	err := l.rdb.QueryRowContext(ctx, "SELECT count(*) FROM cashu_proofs WHERE secret_hash IN (?"+
		strings.Repeat(", ?", len(secretHashes)-1)+")", args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("proofs received: %w", err)
	}
	return n, nil
}
