package ledger

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/capvend/capvend/vend"
)

var _ vend.L402Keys = (*Ledger)(nil)

// L402RootKey implements vend.L402Keys: key 1 of l402_root_keys (schema
// 12), generated and stored by the first call. Concurrent first calls, in
// this process or another, all return the one key stored (INSERT ... ON
// CONFLICT DO NOTHING, then read it back in the same transaction).
func (l *Ledger) L402RootKey(ctx context.Context) ([]byte, error) {
	var key []byte
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT root_key FROM l402_root_keys WHERE id = 1").Scan(&key)
	if err == nil {
		return key, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("L402 root key: %w", l.fileError(err))
	}
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("L402 root key: %w", err)
	}
	err = l.write(ctx, func(tx *wtx, now time.Time) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO l402_root_keys (id, root_key, created_at) VALUES (1, ?, ?) ON CONFLICT DO NOTHING",
			fresh, ms(now)); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, "SELECT root_key FROM l402_root_keys WHERE id = 1").Scan(&key)
	})
	if err != nil {
		return nil, fmt.Errorf("L402 root key: %w", l.fileError(err))
	}
	return key, nil
}

// RevokeL402 implements vend.L402Keys: one row of l402_revocations.
// Revoking a token revoked before changes nothing (the first reason
// stays) and is not an error.
func (l *Ledger) RevokeL402(ctx context.Context, tokenID, reason string) error {
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO l402_revocations (token_id, reason, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
			tokenID, reason, ms(now))
		return err
	})
	if err != nil {
		return fmt.Errorf("revoke L402 token: %w", l.fileError(err))
	}
	return nil
}

// L402Revoked implements vend.L402Keys. It only reads.
func (l *Ledger) L402Revoked(ctx context.Context, tokenID string) (bool, error) {
	var one int
	err := l.reader(ctx).QueryRowContext(ctx, "SELECT 1 FROM l402_revocations WHERE token_id = ?", tokenID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("L402 revocation: %w", l.fileError(err))
	}
	return true, nil
}

// L402Revocation is one revoked L402 token.
type L402Revocation struct {
	TokenID string // 64 hex digits (vend.L402TokenID)
	Call    vend.CallID
	Reason  string
	At      time.Time
}

// L402Revocations returns every revoked L402 token, oldest first. Read
// only. Call is the call id the token id begins with (the call a call
// token pays, or the top-up of a credit token).
func (l *Ledger) L402Revocations(ctx context.Context) ([]L402Revocation, error) {
	rows, err := l.reader(ctx).QueryContext(ctx, "SELECT token_id, reason, created_at FROM l402_revocations ORDER BY created_at, token_id")
	if err != nil {
		return nil, fmt.Errorf("L402 revocations: %w", l.fileError(err))
	}
	defer rows.Close()
	var out []L402Revocation
	for rows.Next() {
		var r L402Revocation
		var at int64
		if err := rows.Scan(&r.TokenID, &r.Reason, &at); err != nil {
			return nil, err
		}
		r.At = fromMS(at)
		if b, err := hex.DecodeString(r.TokenID); err == nil && len(b) >= 8 {
			r.Call = vend.CallID(binary.BigEndian.Uint64(b))
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
