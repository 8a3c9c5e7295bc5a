package admin

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capvend/capvend/vend"
)

// children caches the label-bound children of a metric vector by a key of
// their label values: an observation on a call's path then costs one map
// read, not the vector's hashing and checking of every label value (and
// its lock). Label values are bounded (see Other), so the cache is. A
// child is made the first time its key is seen, as WithLabelValues would:
// no series appears before its first observation.
type children[K comparable, M any] struct {
	m        readMap[K, M]
	newChild func(K) M
}

func newChildren[K comparable, M any](newChild func(K) M) *children[K, M] {
	return &children[K, M]{newChild: newChild}
}

// get returns k's child.
func (c *children[K, M]) get(k K) M {
	if v, ok := c.m.load(k); ok {
		return v
	}
	return c.m.loadOrStore(k, func() M { return c.newChild(k) })
}

// readMap is a map read without a lock and written by copying it (under
// a lock): for keys that stop coming after a while. A plain map's hash
// of a struct key is the compiler's, several times faster than sync.Map's
// (which hashes an interface: runtime.typehash walks the type).
type readMap[K comparable, V any] struct {
	p  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

func (r *readMap[K, V]) load(k K) (V, bool) {
	if m := r.p.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// loadOrStore returns k's value, storing newV()'s first if k has none.
func (r *readMap[K, V]) loadOrStore(k K, newV func() V) V {
	r.mu.Lock()
	defer r.mu.Unlock()
	var old map[K]V
	if p := r.p.Load(); p != nil {
		old = *p
	}
	if v, ok := old[k]; ok {
		return v
	}
	m := make(map[K]V, 1+len(old))
	for k, v := range old {
		m[k] = v
	}
	v := newV()
	m[k] = v
	r.p.Store(&m)
	return v
}

// len is how many keys r holds.
func (r *readMap[K, V]) len() int {
	if m := r.p.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// callKey is a call metric's series: kind, server and tool label values,
// and an outcome (free calls and upstream calls: "" or a result).
type callKey struct{ kind, server, tool, outcome string }

// payKey is a payment metric's series: a backend and a state ("" for the
// metrics by backend only).
type payKey struct{ backend, state string }

// itemKey is an item as vend.Item names it.
type itemKey struct {
	kind         vend.ItemKind
	server, tool string
}

// itemSeries is an item's label values (free calls; upstream calls ok and
// failed) and the children of them, each set at its first use: no series
// appears before its first observation.
type itemSeries struct {
	freeKey, okKey, failedKey callKey
	free                      atomic.Pointer[prometheus.Counter]
	ok, failed                atomic.Pointer[exObserver]
}

// itemCache maps itemKeys to their *itemSeries. Items come from the
// upstreams' catalogs, not from clients; still, past maxItems items the
// series of a new one is worked out on each observation, not kept.
type itemCache = readMap[itemKey, *itemSeries]

const maxItems = 10_000

// series returns t's series.
func (m *Metrics) series(t *vend.Item) *itemSeries {
	k := itemKey{t.Kind.Or(), t.Server, t.UpstreamName}
	if s, ok := m.items.load(k); ok {
		return s
	}
	newSeries := func() *itemSeries {
		server, tool := m.label(t.Server, t.UpstreamName)
		return &itemSeries{
			freeKey:   callKey{kind: kindLabel(t.Kind), server: server, tool: tool},
			okKey:     callKey{server: server, tool: tool, outcome: "ok"},
			failedKey: callKey{server: server, tool: tool, outcome: "error"},
		}
	}
	if m.items.len() >= maxItems {
		return newSeries()
	}
	return m.items.loadOrStore(k, newSeries)
}

// child returns c's child for k, kept in p after the first time.
func child[M any](p *atomic.Pointer[M], c *children[callKey, M], k callKey) M {
	if v := p.Load(); v != nil {
		return *v
	}
	v := c.get(k)
	p.Store(&v)
	return v
}
