// Package retry runs an operation until it succeeds, with capped
// exponential backoff and jitter between attempts. It is the one retry loop
// of the payment backends (billing/lnd's invoice stream, billing/cashu's
// wallet load, reconcile and NUT-17 websocket), so their give-up rules read
// the same: stop when the context ends, when the operation says its error
// is permanent, or after a maximum number of attempts.
package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Policy says how long to wait between attempts. The zero Policy retries
// at once, forever; set at least Base.
//
// The n-th wait (n from 0) is drawn uniformly from [d/2, d] with d =
// min(Base·2^n, Max): "equal jitter", so processes that lost the same
// server at the same moment do not come back in step, while no wait is
// shorter than half its step or longer than Max.
type Policy struct {
	// Base is the first wait's upper bound.
	Base time.Duration
	// Max caps every wait; 0 means Base (a constant wait, jittered).
	Max time.Duration
	// Reset: an attempt that ran at least this long before it failed
	// (a connection that worked for a while) starts the backoff over
	// from Base. 0 never resets.
	Reset time.Duration
	// MaxAttempts stops after this many failed attempts, returning the
	// last error; 0 means no limit.
	MaxAttempts int
	// OnRetry, if set, is called after a failed attempt before its wait
	// (to log it): attempt counts from 1.
	OnRetry func(err error, attempt int, wait time.Duration)

	// Now is the clock used for Reset; nil means time.Now.
	Now func() time.Time
	// Sleep waits d or until ctx ends, returning ctx's error then; nil
	// means a timer. Tests pass a fake that records the waits.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a number in [0, 1) for the jitter; nil means
	// math/rand/v2.
	Rand func() float64
}

// permanent marks an error that retrying cannot fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so that Do stops at once and returns err (unwrapped).
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// Do calls op until it returns nil, waiting between failed attempts as p
// says. It returns nil on success; ctx's error when ctx ends (op is not
// called again, and a wait is cut short); the error op marked Permanent,
// unwrapped; or, after MaxAttempts failures, op's last error. op receives
// ctx unchanged.
func (p Policy) Do(ctx context.Context, op func(ctx context.Context) error) error {
	now, sleep, rnd := p.Now, p.Sleep, p.Rand
	if now == nil {
		now = time.Now
	}
	if sleep == nil {
		sleep = Sleep
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	step := min(p.Base, p.limit())
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		start := now()
		err := op(ctx)
		if err == nil {
			return nil
		}
		var perm permanent
		if errors.As(err, &perm) {
			return perm.err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if p.MaxAttempts > 0 && attempt >= p.MaxAttempts {
			return err
		}
		if p.Reset > 0 && now().Sub(start) >= p.Reset {
			step = min(p.Base, p.limit())
		}
		wait := Jitter(step, rnd())
		if p.OnRetry != nil {
			p.OnRetry(err, attempt, wait)
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		step = p.next(step)
	}
}

// limit is the longest step: Max, or Base when Max is unset.
func (p Policy) limit() time.Duration {
	if p.Max <= 0 {
		return p.Base
	}
	return p.Max
}

// next doubles step up to the limit.
func (p Policy) next(step time.Duration) time.Duration {
	if limit := p.limit(); step > limit/2 {
		return limit // also keeps step*2 from overflowing
	}
	return step * 2
}

// Jitter returns a wait in [d/2, d]: d/2 + r·d/2 for r in [0, 1).
func Jitter(d time.Duration, r float64) time.Duration {
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + time.Duration(r*float64(d-half))
}

// Sleep waits d or until ctx ends; it returns ctx's error if ctx ended
// first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
