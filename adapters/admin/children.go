package admin

import (
	"strconv"
	"sync"

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
	m        sync.Map // K -> M
	newChild func(K) M
}

func newChildren[K comparable, M any](newChild func(K) M) *children[K, M] {
	return &children[K, M]{newChild: newChild}
}

// get returns k's child.
func (c *children[K, M]) get(k K) M {
	if v, ok := c.m.Load(k); ok {
		return v.(M)
	}
	v, _ := c.m.LoadOrStore(k, c.newChild(k))
	return v.(M)
}

// callKey is a call metric's series: kind, server and tool label values,
// and an outcome (free calls and upstream calls: "" or a result).
type callKey struct{ kind, server, tool, outcome string }

// payKey is a payment metric's series: a backend and a state ("" for the
// metrics by backend only).
type payKey struct{ backend, state string }

// exemplarLabels lends the label sets of call-id exemplars: the client
// library copies an exemplar's labels (it keeps none of the map), so one
// map serves one observation after another instead of a new one each.
var exemplarLabels = sync.Pool{New: func() any { return prometheus.Labels{"call_id": ""} }}

// observeCall observes v on o (a histogram) with call id as exemplar.
func observeCall(o prometheus.Observer, v float64, id vend.CallID) {
	l := exemplarLabels.Get().(prometheus.Labels)
	l["call_id"] = strconv.FormatInt(int64(id), 10)
	o.(prometheus.ExemplarObserver).ObserveWithExemplar(v, l)
	exemplarLabels.Put(l)
}

// countCall adds 1 to c with call id as exemplar.
func countCall(c prometheus.Counter, id vend.CallID) {
	l := exemplarLabels.Get().(prometheus.Labels)
	l["call_id"] = strconv.FormatInt(int64(id), 10)
	c.(prometheus.ExemplarAdder).AddWithExemplar(1, l)
	exemplarLabels.Put(l)
}
