package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/capvend/capvend/vend"
)

var _ vend.RequestClaimer = (*Ledger)(nil)

// Several instances. capvend processes sharing a PostgreSQL ledger
// coordinate through it, each with a claim checked by rows affected: a
// Nostr request is served by the instance whose ClaimRequest inserted its
// event id (request_claims); a lease (TakeLease: one upsert that goes
// through only when the lease is free, expired or the taker's) decides
// which instance recovers and reconciles, and a run's lease tells the
// others it is alive; CountCall counts a client's calls per minute
// against the rate limit (rate_counts); and RegisterPrices refuses an
// instance whose price book differs from a live one's (instance_prices).
// These tables are coordination, not books: they are not copied by
// CopyTo, nor checked by Verify. OpenUnpaid counts a client's open unpaid
// payment requests across the instances from the books themselves (the
// calls' limit_key, a partial index of awaiting calls that have one): a
// read, no write. docs/OPERATING.md, "Several instances on one ledger",
// says what an operator sees of it.

// DefaultClaimTakeover is how long, unless Options.ClaimTakeover says
// otherwise, a request claim of an instance that died (it holds no run
// lease) stands before another instance may take the request over (the
// client sends it again): longer than a run lease lasts, so that an
// instance that has just started and not yet taken its lease keeps its
// claims.
const DefaultClaimTakeover = time.Minute

// ClaimRequest implements vend.RequestClaimer: it inserts key's claim for
// holder (an upsert checked by rows affected, as every claim here) and
// reports whether holder has it: the insert went through, holder claimed
// key before (a copy of the request delivered again to the same
// instance), or the claim's holder died (it holds no run lease, and
// claimed key over Options.ClaimTakeover ago): a request its dead instance never
// answered is served when the client sends it again. Another live
// holder's claim is false. On PostgreSQL every write transaction holds
// the write lock (see writeLockKey), so two instances claiming the
// same key at once get true and false. It costs one write: capvend claims
// Nostr requests only on a shared (PostgreSQL) ledger.
func (l *Ledger) ClaimRequest(ctx context.Context, key, holder string) (bool, error) {
	if key == "" || holder == "" {
		return false, errors.New("claim request: key and holder are required")
	}
	var mine bool
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		// The claim is holder's if new, holder's already, or taken over
		// from a dead holder: claimed over claimTakeover ago by an
		// instance holding no run lease (see Ledger.TakeLease).
		res, err := tx.ExecContext(ctx, `INSERT INTO request_claims (request_key, holder, claimed_at) VALUES (?, ?, ?)
			ON CONFLICT (request_key) DO UPDATE SET holder = excluded.holder, claimed_at = excluded.claimed_at
			WHERE request_claims.holder = excluded.holder OR (request_claims.claimed_at <= ? AND NOT EXISTS (
				SELECT 1 FROM leases WHERE name LIKE 'run:%' AND leases.holder = request_claims.holder AND expires_at > ?))`,
			key, holder, ms(now), ms(now.Add(-l.claimTakeover)), ms(now))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		mine = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("claim request: %w", err)
	}
	return mine, nil
}

// PruneRequestClaims deletes the request claims made before t and returns
// how many. Requests that old are refused anyway (outside the window).
func (l *Ledger) PruneRequestClaims(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM request_claims WHERE claimed_at < ?", ms(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune request claims: %w", err)
	}
	return n, nil
}

var _ vend.Leaser = (*Ledger)(nil)

// TakeLease implements vend.Leaser: one upsert that sets holder and
// now+ttl on the lease name when it is free, expired, or holder's already
// (renewing it), and does nothing when another holder's lease is still
// running; rows affected says which.
func (l *Ledger) TakeLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return false, errors.New("take lease: name, holder and a positive ttl are required")
	}
	var held bool
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
			WHERE leases.holder = excluded.holder OR leases.expires_at <= ?`,
			name, holder, ms(now.Add(ttl)), ms(now))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		held = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("take lease %s: %w", name, err)
	}
	return held, nil
}

// ReleaseLease implements vend.Leaser: it ends holder's lease on name at
// once (a clean stop), so that another instance takes it at its next
// try; another holder's lease is left alone.
func (l *Ledger) ReleaseLease(ctx context.Context, name, holder string) error {
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM leases WHERE name = ? AND holder = ?", name, holder)
		return err
	})
	if err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// LeaseHolder implements vend.Leaser: the holder of the lease name, ""
// when nobody holds it (never taken, released or expired).
func (l *Ledger) LeaseHolder(ctx context.Context, name string) (string, error) {
	var holder string
	err := l.read(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, "SELECT holder FROM leases WHERE name = ? AND expires_at > ?", name, ms(l.now())).Scan(&holder)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("lease %s: %w", name, err)
	}
	return holder, nil
}

// LeaseHolders returns the holders of the running leases whose name
// starts with prefix, sorted and without duplicates (the member set of
// the Nostr servers sharing a key: see ctxvm.Members). One read.
func (l *Ledger) LeaseHolders(ctx context.Context, prefix string) ([]string, error) {
	var holders []string
	err := l.read(ctx, func(tx *sql.Tx) error {
		holders = holders[:0]
		rows, err := tx.QueryContext(ctx, `SELECT DISTINCT holder FROM leases WHERE substr(name, 1, ?) = ? AND expires_at > ?
			ORDER BY holder`, len(prefix), prefix, ms(l.now()))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var h string
			if err := rows.Scan(&h); err != nil {
				return err
			}
			holders = append(holders, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("lease holders %s: %w", prefix, err)
	}
	slices.Sort(holders) // byte order whatever the engine's collation
	return holders, nil
}

var _ vend.RateCounter = (*Ledger)(nil)

// CountCall implements vend.RateCounter: one upsert adds the call to
// client's count for the minute starting at minute, only while the count
// is below limit (rows affected says whether it was). The first count of
// a new minute also deletes the counts of minutes before the last one.
func (l *Ledger) CountCall(ctx context.Context, client string, minute time.Time, limit int) (bool, error) {
	if client == "" || limit <= 0 {
		return false, errors.New("count call: a client and a positive limit are required")
	}
	m := ms(minute.Truncate(time.Minute))
	var counted bool
	err := l.write(ctx, func(tx *wtx, _ time.Time) error {
		if l.rateSwept.Swap(m) != m {
			if _, err := tx.ExecContext(ctx, "DELETE FROM rate_counts WHERE minute < ?", m-time.Minute.Milliseconds()); err != nil {
				return err
			}
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO rate_counts (client, minute, calls) VALUES (?, ?, 1)
			ON CONFLICT (client, minute) DO UPDATE SET calls = rate_counts.calls + 1 WHERE rate_counts.calls < ?`,
			client, m, limit)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		counted = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("count call: %w", err)
	}
	return counted, nil
}

var _ vend.UnpaidCounter = (*Ledger)(nil)

// OpenUnpaid implements vend.UnpaidCounter: two counts from the indexes
// (calls_unpaid_key, payments_state), no write.
func (l *Ledger) OpenUnpaid(ctx context.Context, key string, now time.Time) (ofKey, total int, err error) {
	if key == "" {
		return 0, 0, errors.New("open unpaid: a key is required")
	}
	err = l.reader(ctx).QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM calls c JOIN payments p ON p.call_id = c.id
			WHERE c.limit_key = ? AND c.limit_key <> '' AND c.state = 'awaiting_payment'
			AND p.state = 'open' AND p.expires_at > ?),
		(SELECT count(*) FROM payments WHERE state = 'open' AND expires_at > ?)`,
		key, ms(now), ms(now)).Scan(&ofKey, &total)
	if err != nil {
		return 0, 0, fmt.Errorf("open unpaid: %w", err)
	}
	return ofKey, total, nil
}

// ErrPricesDiffer: RegisterPrices found a live instance whose price book
// differs from the registering one's.
var ErrPricesDiffer = errors.New("the price book differs from a running instance's")

// RegisterPrices records hash, the hash of instance's price book, after
// comparing it with the price books of the other live instances: those
// holding a lease on a run ("run:..."), or registered within fresh (an
// instance that started and has not taken its lease yet). If one differs,
// it returns ErrPricesDiffer naming that instance and records nothing,
// unless force (a reload: the new hash is recorded, and the error still
// returned so that the caller can say so). Rows of instances no longer
// live are deleted. One write transaction: of two instances starting
// together with different prices, the second is refused.
func (l *Ledger) RegisterPrices(ctx context.Context, instance, hash string, fresh time.Duration, force bool) error {
	if instance == "" || len(hash) != 64 {
		return errors.New("register prices: an instance and a hex SHA-256 are required")
	}
	var differs error
	err := l.write(ctx, func(tx *wtx, now time.Time) error {
		live := `instance <> ? AND (registered_at > ? OR instance IN
			(SELECT holder FROM leases WHERE name LIKE 'run:%' AND expires_at > ?))`
		args := []any{instance, ms(now.Add(-fresh)), ms(now)}
		var other string
		err := tx.QueryRowContext(ctx, "SELECT instance FROM instance_prices WHERE "+live+` AND price_hash <> ?
			ORDER BY registered_at DESC LIMIT 1`, append(args, hash)...).Scan(&other)
		switch {
		case err == nil:
			differs = fmt.Errorf("%w: instance %s", ErrPricesDiffer, other)
			if !force {
				return differs
			}
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM instance_prices WHERE NOT ("+live+")", args...); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO instance_prices (instance, price_hash, registered_at) VALUES (?, ?, ?)
			ON CONFLICT (instance) DO UPDATE SET price_hash = excluded.price_hash, registered_at = excluded.registered_at`,
			instance, hash, ms(now))
		return err
	})
	if err != nil {
		return fmt.Errorf("register prices: %w", err)
	}
	return differs
}
