package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capvend/capvend/vend"
)

// Cashu proofs are recorded swapping, with their payment, before capvend
// asks the mint to swap them (ClaimToken); the settlement marks them
// swapped (SettlePayment). A swap whose answer never came (a crash, a
// timeout, a mint error) leaves them swapping until the mint's word on
// them is recorded with EndSwap: released (unspent: the swap never
// happened, the client's token may pay again), spent or rejected (the mint
// refused them), or, when the swap did happen, a late settlement
// (SettleSwap) that books the money and the refund owed for the call that
// never ran. Only hashes of secrets are stored; a proof's Y
// (hash_to_curve(secret)) is public and is what the mint is asked by.

// The ends of a swap EndSwap records (see vend.SwapReleased).
const (
	SwapReleased = vend.SwapReleased
	SwapSpent    = vend.SwapSpent
	SwapRejected = vend.SwapRejected
)

// ProofsReceived reports how many of the given Cashu proof secret hashes
// (hex SHA-256 of each secret) were recorded by ClaimProofs (ClaimToken)
// before and not released. It only reads: a backend uses it to refuse a
// replayed token before contacting the mint; the claim remains the
// exactly-once one.
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
	err := l.rdb.QueryRowContext(ctx, "SELECT count(*) FROM cashu_proofs WHERE state <> 'released' AND secret_hash IN (?"+
		strings.Repeat(", ?", len(secretHashes)-1)+")", args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("proofs received: %w", err)
	}
	return n, nil
}

// ClaimProofs implements vend.Ledger.
func (l *Ledger) ClaimProofs(ctx context.Context, payment vend.PaymentID, proofs []vend.Proof) error {
	if err := checkProofs(proofs); err != nil {
		return fmt.Errorf("claim proofs: %w", err)
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error { return claimProofs(ctx, tx, payment, proofs, now) })
	if err != nil {
		return fmt.Errorf("claim proofs: %w", err)
	}
	return nil
}

// checkProofs validates proofs before they are claimed.
func checkProofs(proofs []vend.Proof) error {
	if len(proofs) == 0 {
		return errors.New("no proofs")
	}
	for _, p := range proofs {
		if len(p.SecretHash) != 64 || p.AmountSat <= 0 || p.KeysetID == "" || p.MintURL == "" || (p.Y != "" && len(p.Y) != 66) {
			return errors.New("each proof needs a secret hash, a positive amount, a keyset id and a mint URL")
		}
	}
	return nil
}

// claimProofs records proofs swapping for payment inside tx, all or none.
func claimProofs(ctx context.Context, tx *wtx, payment vend.PaymentID, proofs []vend.Proof, now time.Time) error {
	for _, p := range proofs {
		res, err := tx.ExecContext(ctx, `INSERT INTO cashu_proofs (secret_hash, y, amount_sat, keyset_id, mint_url,
			payment_id, state, created_at, updated_at) VALUES (?, nullif(?, ''), ?, ?, ?, ?, 'swapping', ?, ?)
			ON CONFLICT (secret_hash) WHERE state <> 'released' DO NOTHING`,
			p.SecretHash, p.Y, p.AmountSat, p.KeysetID, p.MintURL, payment, ms(now), ms(now))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("%w (secret hash %s…)", vend.ErrProofSpent, p.SecretHash[:12])
		}
	}
	return nil
}

// ClaimToken records, in one transaction, a token payment for a call (the
// call moves to awaiting_payment) and its proofs in state swapping: what
// must be on disk before the mint is asked to swap them. All or nothing:
// ErrProofSpent if a proof is held by another payment (not released),
// ErrDuplicatePayment if the ref exists.
func (l *Ledger) ClaimToken(ctx context.Context, id vend.CallID, np vend.NewPayment, proofs []vend.Proof) (vend.Payment, error) {
	if np.Kind != vend.KindToken || np.Backend != vend.BackendCashu || np.Ref == "" || np.Amount <= 0 || np.ExpiresAt.IsZero() {
		return vend.Payment{}, errors.New("claim token: a Cashu token payment with a ref, an amount and an expiry is required")
	}
	if err := checkProofs(proofs); err != nil {
		return vend.Payment{}, fmt.Errorf("claim token: %w", err)
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = recordPayment(ctx, tx, id, np, now); err != nil {
			return err
		}
		return claimProofs(ctx, tx, p.ID, proofs, now)
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("claim token: %w", err)
	}
	return p, nil
}

// SwappingToken is a token payment whose proofs are recorded swapping
// (see vend.SwappingToken).
type SwappingToken = vend.SwappingToken

// SwappingTokens returns the token payments with proofs in state swapping,
// oldest first; with secretHashes, only those holding one of them.
func (l *Ledger) SwappingTokens(ctx context.Context, secretHashes []string) ([]SwappingToken, error) {
	if len(secretHashes) > 1000 {
		return nil, fmt.Errorf("swapping tokens: %d hashes (at most 1000)", len(secretHashes))
	}
	q := `SELECT c.payment_id, c.secret_hash, coalesce(c.y, ''), c.amount_sat, c.keyset_id, c.mint_url
		FROM cashu_proofs c WHERE c.state = 'swapping' AND c.payment_id IS NOT NULL`
	args := make([]any, len(secretHashes))
	if len(secretHashes) > 0 {
		q += ` AND c.payment_id IN (SELECT payment_id FROM cashu_proofs WHERE state = 'swapping' AND secret_hash IN (?` +
			strings.Repeat(", ?", len(secretHashes)-1) + `))`
		for i, h := range secretHashes {
			args[i] = h
		}
	}
	rows, err := l.rdb.QueryContext(ctx, q+" ORDER BY c.payment_id, c.id", args...)
	if err != nil {
		return nil, fmt.Errorf("swapping tokens: %w", err)
	}
	var out []SwappingToken
	var ids []vend.PaymentID
	for rows.Next() {
		var id vend.PaymentID
		var pr vend.Proof
		if err := rows.Scan(&id, &pr.SecretHash, &pr.Y, &pr.AmountSat, &pr.KeysetID, &pr.MintURL); err != nil {
			rows.Close()
			return nil, fmt.Errorf("swapping tokens: %w", err)
		}
		if len(ids) == 0 || ids[len(ids)-1] != id {
			ids = append(ids, id)
			out = append(out, SwappingToken{})
		}
		out[len(out)-1].Proofs = append(out[len(out)-1].Proofs, pr)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("swapping tokens: %w", err)
	}
	for i, id := range ids {
		ps, err := l.payments(ctx, "id = ?", id)
		if err != nil {
			return nil, err
		}
		if len(ps) != 1 {
			return nil, fmt.Errorf("swapping tokens: payment %d: %w", id, vend.ErrNotFound)
		}
		out[i].Payment = ps[0]
	}
	return out, nil
}

// EndSwap records that the swap of a token payment's swapping proofs did
// not pay capvend, in one transaction: the proofs become to (SwapReleased,
// SwapSpent or SwapRejected) and the payment, if it is still open,
// canceled with its call. It returns vend.ErrIllegalTransition if no proof
// of the payment is swapping (the outcome was recorded before).
func (l *Ledger) EndSwap(ctx context.Context, ref, to, reason string) error {
	if to != SwapReleased && to != SwapSpent && to != SwapRejected {
		return fmt.Errorf("end swap %s: %q is not an end of a failed swap", ref, to)
	}
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		p, err := getPayment(ctx, tx, ref)
		if err != nil {
			return err
		}
		if p.Kind != vend.KindToken || p.State == vend.PaymentSettled {
			return &vend.TransitionError{What: "payment " + ref + " (swap)", From: string(p.State), To: to}
		}
		res, err := tx.ExecContext(ctx, `UPDATE cashu_proofs SET state = ?, updated_at = ? WHERE payment_id = ? AND state = 'swapping'`,
			to, ms(now), p.ID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return &vend.TransitionError{What: "payment " + ref + " (swap)", From: "no proofs swapping", To: to}
		}
		if p.State != vend.PaymentOpen {
			return nil
		}
		return endPayment(ctx, tx, &p, vend.PaymentCanceled, reason, now)
	})
	if err != nil {
		return fmt.Errorf("end swap: %w", err)
	}
	return nil
}

// SettleSwap records that the swap of a token payment happened although
// capvend never recorded it (its answer was lost, or capvend stopped
// before recording it), in one transaction: an open payment is first
// canceled with its call (the call never ran and will not: the client was
// told the payment failed, or is gone), then the settlement is booked
// late, which owes the call's money back as a refund (vend.LatePayable).
// vend.ErrAlreadySettled if it was recorded before.
func (l *Ledger) SettleSwap(ctx context.Context, s vend.Settlement, reason string) (vend.Payment, error) {
	if s.Amount <= 0 || s.Fee < 0 || s.Fee > s.Amount {
		return vend.Payment{}, fmt.Errorf("settle swap %s: amount must be positive and fee within it", s.Ref)
	}
	var p vend.Payment
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		var err error
		if p, err = getPayment(ctx, tx, s.Ref); err != nil {
			return err
		}
		if p.Kind != vend.KindToken {
			return fmt.Errorf("payment %s is a %s, not a token", s.Ref, p.Kind)
		}
		if p.State == vend.PaymentOpen {
			if err := endPayment(ctx, tx, &p, vend.PaymentCanceled, reason, now); err != nil {
				return err
			}
		}
		p, err = settlePayment(ctx, tx, s, now)
		return err
	})
	if err != nil {
		return vend.Payment{}, fmt.Errorf("settle swap: %w", err)
	}
	return p, nil
}
