package admin

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/capvend/capvend/vend"
)

// Call-id exemplars are kept as they are observed (a value, a call id and
// a time, one small allocation) and given the client library's form only
// when scraped. The library's own (ObserveWithExemplar, AddWithExemplar)
// builds that form, a protobuf with a label pair and a timestamp, at each
// observation: seven allocations, a walk of the labels map and UTF-8
// checks, about half of what the metrics cost a paid call (its five
// exemplars: BenchmarkObservePaidCall 2.3 µs a call with them, 1.1 µs
// without, 35 allocations). What a scrape shows is the same: each bucket's
// (a counter's) latest exemplar.

// callExemplar is one observation's exemplar: its value, call and time.
type callExemplar struct {
	value float64
	call  vend.CallID
	at    time.Time
}

// exemplarSeries is one series (a counter, or a histogram with bounds)
// and the latest exemplar of each of its buckets (+Inf last).
type exemplarSeries struct {
	metric prometheus.Metric
	bounds []float64
	latest []atomic.Pointer[callExemplar]
}

// add records an exemplar of value v for call id: call it after the
// observation itself (a scrape reads the exemplars before the values, so
// it never shows an exemplar of an observation it does not count).
func (s *exemplarSeries) add(v float64, id vend.CallID) {
	i := len(s.bounds) // the histogram's bucket of v, as the library finds it
	for j, b := range s.bounds {
		if v <= b {
			i = j
			break
		}
	}
	s.latest[i].Store(&callExemplar{value: v, call: id, at: time.Now()})
}

// exemplars is a metric vector (or one metric) as registered: it collects
// the series made through series, each with its latest exemplars. Every
// series of the vector must be made through it.
type exemplars struct {
	prometheus.Collector // the vector: Describe
	mu                   sync.Mutex
	all                  []*exemplarSeries
}

func newExemplars(c prometheus.Collector) *exemplars {
	return &exemplars{Collector: c}
}

// series returns a new exemplarSeries of m, a series of e's vector: a
// histogram's with its buckets' bounds, as m has them.
func (e *exemplars) series(m prometheus.Metric) *exemplarSeries {
	bounds := histogramBounds(m)
	s := &exemplarSeries{metric: m, bounds: bounds, latest: make([]atomic.Pointer[callExemplar], len(bounds)+1)}
	e.mu.Lock()
	e.all = append(e.all, s)
	e.mu.Unlock()
	return s
}

// histogramBounds returns the upper bounds of m's buckets but +Inf; nil
// if m is not a histogram.
func histogramBounds(m prometheus.Metric) []float64 {
	var d dto.Metric
	if m.Write(&d) != nil || d.Histogram == nil {
		return nil
	}
	var bounds []float64
	for _, b := range d.Histogram.Bucket {
		if ub := b.GetUpperBound(); !math.IsInf(ub, +1) {
			bounds = append(bounds, ub)
		}
	}
	return bounds
}

// Collect implements prometheus.Collector.
func (e *exemplars) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	all := append([]*exemplarSeries(nil), e.all...)
	e.mu.Unlock()
	var exs []prometheus.Exemplar
	for _, s := range all {
		exs = exs[:0]
		for i := range s.latest {
			if x := s.latest[i].Load(); x != nil {
				exs = append(exs, prometheus.Exemplar{Value: x.value, Timestamp: x.at,
					Labels: prometheus.Labels{"call_id": strconv.FormatInt(int64(x.call), 10)}})
			}
		}
		if len(exs) == 0 {
			ch <- s.metric
			continue
		}
		m, err := prometheus.NewMetricWithExemplars(s.metric, exs...)
		if err != nil {
			m = prometheus.NewInvalidMetric(s.metric.Desc(), err)
		}
		ch <- m
	}
}

// exCounter is a counter child and its exemplars.
type exCounter struct {
	prometheus.Counter
	ex *exemplarSeries
}

// exObserver is a histogram child and its exemplars.
type exObserver struct {
	prometheus.Observer
	ex *exemplarSeries
}

// observeCall observes v on o with call id as exemplar.
func observeCall(o exObserver, v float64, id vend.CallID) {
	o.Observe(v)
	o.ex.add(v, id)
}

// countCall adds 1 to c with call id as exemplar.
func countCall(c exCounter, id vend.CallID) {
	c.Inc()
	c.ex.add(1, id)
}
