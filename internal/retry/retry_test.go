package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// fakeClock records the waits Do asks for and advances its own time by
// them instead of sleeping.
type fakeClock struct {
	t     time.Time
	waits []time.Duration
	// onSleep, if set, runs at each wait before it returns (to cancel
	// the context, say).
	onSleep func(n int)
}

func newFake() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (f *fakeClock) now() time.Time { return f.t }

func (f *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	f.waits = append(f.waits, d)
	if f.onSleep != nil {
		f.onSleep(len(f.waits))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.t = f.t.Add(d)
	return nil
}

func (f *fakeClock) policy(p Policy, r float64) Policy {
	p.Now, p.Sleep = f.now, f.sleep
	p.Rand = func() float64 { return r }
	return p
}

// failing returns an op that fails n times, then succeeds, counting calls.
func failing(n int, calls *int) func(context.Context) error {
	return func(context.Context) error {
		*calls++
		if *calls <= n {
			return fmt.Errorf("attempt %d failed", *calls)
		}
		return nil
	}
}

const ms = time.Millisecond

func TestDoBacksOffExponentiallyToTheCap(t *testing.T) {
	p := Policy{Base: 100 * ms, Max: time.Second}
	steps := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}
	for _, tc := range []struct {
		name string
		r    float64
		want func(d time.Duration) time.Duration
	}{
		{"shortest draw", 0, func(d time.Duration) time.Duration { return d / 2 }},
		{"middle draw", 0.5, func(d time.Duration) time.Duration { return d/2 + d/4 }},
		{"longest draw", 0.999999999, func(d time.Duration) time.Duration { return d }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			var calls, retries int
			var told []time.Duration
			pp := f.policy(p, tc.r)
			pp.OnRetry = func(err error, attempt int, wait time.Duration) {
				retries++
				if attempt != retries || err == nil {
					t.Errorf("OnRetry(%v, %d) at retry %d", err, attempt, retries)
				}
				told = append(told, wait)
			}
			if err := pp.Do(context.Background(), failing(len(steps), &calls)); err != nil {
				t.Fatal(err)
			}
			if calls != len(steps)+1 || retries != len(steps) || len(f.waits) != len(steps) {
				t.Fatalf("calls %d, retries %d, waits %d; want %d, %d, %d", calls, retries, len(f.waits), len(steps)+1, len(steps), len(steps))
			}
			if fmt.Sprint(told) != fmt.Sprint(f.waits) {
				t.Errorf("OnRetry was told %v, Do waited %v", told, f.waits)
			}
			for i, d := range steps {
				want := tc.want(d)
				if diff := f.waits[i] - want; diff < -time.Microsecond || diff > time.Microsecond {
					t.Errorf("wait %d = %v, want %v (step %v)", i, f.waits[i], want, d)
				}
			}
		})
	}
}

func TestJitterStaysWithinHalfAndWholeStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, d := range []time.Duration{1, 2, 3, 7 * ms, 100 * ms, 5 * time.Second, time.Hour} {
		for range 10_000 {
			w := Jitter(d, rng.Float64())
			if w < d/2 || w > d {
				t.Fatalf("Jitter(%v) = %v, outside [%v, %v]", d, w, d/2, d)
			}
		}
	}
	if w := Jitter(0, 0.5); w != 0 {
		t.Errorf("Jitter(0) = %v", w)
	}
	if w := Jitter(-time.Second, 0.5); w != 0 {
		t.Errorf("Jitter(-1s) = %v", w)
	}
	// The default source draws different waits: runs that fail together
	// do not retry in step.
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[Jitter(time.Second, rand.Float64())] = true
	}
	if len(seen) < 50 {
		t.Errorf("100 draws gave %d distinct waits", len(seen))
	}
}

func TestDoStopsOnPermanentError(t *testing.T) {
	errGone := errors.New("mint offers no subscriptions")
	f := newFake()
	calls := 0
	err := f.policy(Policy{Base: ms, Max: 8 * ms}, 0).Do(context.Background(), func(context.Context) error {
		calls++
		if calls == 3 {
			return Permanent(fmt.Errorf("info: %w", errGone))
		}
		return errors.New("transient")
	})
	if !errors.Is(err, errGone) || IsPermanent(err) {
		t.Fatalf("Do = %v (permanent %v), want the unwrapped permanent error", err, IsPermanent(err))
	}
	if calls != 3 || len(f.waits) != 2 {
		t.Fatalf("calls %d, waits %d; want 3, 2", calls, len(f.waits))
	}
	if Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
	if !IsPermanent(fmt.Errorf("wrapped: %w", Permanent(errGone))) {
		t.Error("IsPermanent misses a wrapped permanent error")
	}
}

func TestDoStopsWhenTheContextEnds(t *testing.T) {
	t.Run("during a wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := newFake()
		f.onSleep = func(n int) {
			if n == 2 {
				cancel()
			}
		}
		calls := 0
		err := f.policy(Policy{Base: ms, Max: 8 * ms}, 0).Do(ctx, failing(100, &calls))
		if !errors.Is(err, context.Canceled) || calls != 2 {
			t.Fatalf("Do = %v after %d calls; want context.Canceled after 2", err, calls)
		}
	})
	t.Run("during an attempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := newFake()
		calls := 0
		pp := f.policy(Policy{Base: ms}, 0)
		pp.OnRetry = func(error, int, time.Duration) { t.Error("retried after the context ended") }
		err := pp.Do(ctx, func(ctx context.Context) error {
			calls++
			cancel()
			return fmt.Errorf("stream: %w", ctx.Err())
		})
		if err != context.Canceled || calls != 1 || len(f.waits) != 0 {
			t.Fatalf("Do = %v, calls %d, waits %d; want context.Canceled itself, 1, 0", err, calls, len(f.waits))
		}
	})
	t.Run("before the first attempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		calls := 0
		if err := (Policy{Base: ms}).Do(ctx, failing(0, &calls)); !errors.Is(err, context.Canceled) || calls != 0 {
			t.Fatalf("Do = %v after %d calls", err, calls)
		}
	})
	t.Run("real timer", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		err := Policy{Base: time.Hour}.Do(ctx, func(context.Context) error {
			calls++
			cancel() // ends the hour-long wait that follows
			return errors.New("down")
		})
		if !errors.Is(err, context.Canceled) || calls != 1 {
			t.Fatalf("Do = %v after %d calls", err, calls)
		}
	})
}

func TestDoGivesUpAfterMaxAttempts(t *testing.T) {
	f := newFake()
	calls := 0
	err := f.policy(Policy{Base: ms, MaxAttempts: 3}, 0.5).Do(context.Background(), failing(100, &calls))
	if err == nil || err.Error() != "attempt 3 failed" || calls != 3 || len(f.waits) != 2 {
		t.Fatalf("Do = %v, calls %d, waits %d; want the 3rd error, 3, 2", err, calls, len(f.waits))
	}
}

func TestDoResetsAfterALongAttempt(t *testing.T) {
	f := newFake()
	calls := 0
	p := f.policy(Policy{Base: 100 * ms, Max: 10 * time.Second, Reset: 30 * time.Second}, 0.999999999)
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls == 4 {
			f.t = f.t.Add(30 * time.Second) // connected, worked a while, broke
		}
		if calls == 6 {
			return nil
		}
		return errors.New("broke")
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 100 * ms, 200 * ms}
	if len(f.waits) != len(want) {
		t.Fatalf("waits %v, want about %v", f.waits, want)
	}
	for i := range want {
		if f.waits[i] < want[i]-time.Microsecond || f.waits[i] > want[i] {
			t.Errorf("wait %d = %v, want %v", i, f.waits[i], want[i])
		}
	}
}

func TestDoConstantWaitWithoutMax(t *testing.T) {
	for _, p := range []Policy{{Base: 5 * time.Second}, {Base: 5 * time.Second, Max: time.Second}} {
		f := newFake()
		calls := 0
		if err := f.policy(p, 0.999999999).Do(context.Background(), failing(4, &calls)); err != nil {
			t.Fatal(err)
		}
		limit := p.limit()
		for i, w := range f.waits {
			if w < limit-time.Microsecond || w > limit {
				t.Errorf("%+v: wait %d = %v, want %v", p, i, w, limit)
			}
		}
	}
}

func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on an ended context = %v", err)
	}
}
