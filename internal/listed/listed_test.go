package listed

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestUntil(t *testing.T) {
	lists := [][]string{nil, {"a"}, {"a", "b"}, {"a", "b", "c"}}
	for _, tc := range []struct {
		name  string
		done  func([]string) bool
		want  []string
		fails bool // ctx ends first
	}{
		{"any", Any, []string{"a"}, false},
		{"all", All("b", "a"), []string{"a", "b"}, false},
		{"count", Count(3), []string{"a", "b", "c"}, false},
		{"never", All("z"), []string{"a", "b", "c"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			list := func(context.Context) ([]string, error) {
				if i == 1 { // a failure in between is tried again
					i++
					return nil, errors.New("not yet")
				}
				l := lists[min(max(i-1, 0), len(lists)-1)]
				i++
				return l, nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*Interval)
			defer cancel()
			got, err := Until(ctx, list, tc.done)
			if (err != nil) != tc.fails || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v (fails %v)", got, err, tc.want, tc.fails)
			}
		})
	}
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := Until(ctx, func(context.Context) ([]string, error) { return nil, errors.New("down") }, Any)
		if !errors.Is(err, context.Canceled) || err.Error() != "listed []: context canceled (last: down)" {
			t.Fatalf("err %v", err)
		}
	})
}
