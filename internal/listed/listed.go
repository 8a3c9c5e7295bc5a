// Package listed waits until a server lists what a client needs. capvend
// serve answers before its upstreams have connected (they connect in the
// background), so a client asking at once may get a short tools/list; it
// asks again, as it would after notifications/tools/list_changed. The
// demo and the tests wait this one way, whatever the transport.
package listed

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Interval is the time between two lists.
const Interval = 200 * time.Millisecond

// Until calls list until done holds for the names it returns, Interval
// apart, and returns those names. A failed list is tried again. When ctx
// ends first it returns the last names and an error naming the last
// failure, if any.
func Until(ctx context.Context, list func(context.Context) ([]string, error), done func([]string) bool) ([]string, error) {
	var names []string
	var last error
	for {
		got, err := list(ctx)
		if err == nil {
			names, last = got, nil
			if done(names) {
				return names, nil
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return names, fmt.Errorf("listed %v: %w (last: %v)", names, ctx.Err(), last)
			}
			return names, fmt.Errorf("listed %v: %w", names, ctx.Err())
		case <-time.After(Interval):
		}
	}
}

// All holds when every one of want is listed.
func All(want ...string) func([]string) bool {
	return func(names []string) bool {
		for _, w := range want {
			if !slices.Contains(names, w) {
				return false
			}
		}
		return true
	}
}

// Count holds when exactly n names are listed.
func Count(n int) func([]string) bool {
	return func(names []string) bool { return len(names) == n }
}

// Any holds when at least one name is listed.
func Any(names []string) bool { return len(names) > 0 }
