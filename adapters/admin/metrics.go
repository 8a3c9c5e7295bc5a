package admin

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/capvend/capvend/vend"
)

// Other is the label value of a server or tool that is not in the
// configuration: labels only ever take values the operator wrote, never
// one a client (or an upstream's tool list) chose, so the number of
// series stays bounded.
const Other = "other"

// Item is a priced or configured item whose server and name may appear
// as label values.
type Item struct {
	Server string // the upstream's configured name
	Tool   string // the item's upstream name (a tool, prompt or resource URI)
}

// Sources give the gauges their values, read at each scrape. A nil
// source leaves its gauge out.
type Sources struct {
	// Open counts what the ledger holds open. It is called once per
	// scrape, with a context bounded by the scrape.
	Open func(ctx context.Context) (Open, error)
	// InFlight is the number of call requests being served.
	InFlight func() int64
	// Sessions are the live sessions of each front, by front name
	// ("http", "nostr"): a fixed set of keys.
	Sessions func() map[string]int
	// Relays is the number of Nostr relays connected.
	Relays func() int
	// Upstreams is the number of upstreams connected (listed their tools).
	Upstreams func() int
	// Nostr is what became of the Nostr front's publications: counters,
	// read at each scrape.
	Nostr func() NostrPublish
}

// NostrPublish counts the Nostr front's publications (see Sources.Nostr).
// Relay URLs are the configured ones, reasons a fixed set of classes.
type NostrPublish struct {
	Relays []RelayPublish
	// Undelivered: answers no relay took (each replaced by an error
	// answer when one could go).
	Undelivered uint64
	// Oversized transfers (CEP-22), by direction ("out": answers, "in":
	// requests) and outcome ("ok", "failed").
	Transfers map[[2]string]uint64
}

// RelayPublish is one relay's share of NostrPublish.
type RelayPublish struct {
	URL      string
	Accepted uint64
	Failed   map[string]uint64 // by reason class (blocked, invalid, rate-limited, timeout, too-large ...)
}

// Open is what the ledger holds open (see Sources.Open).
type Open struct {
	Quotes      int       // calls quoted or awaiting payment
	LockedHolds int       // hold invoices accepted, neither settled nor canceled
	RefundsOwed int       // refunds owed
	OwedMsat    vend.Msat // their sum
}

// Metrics is capvend's Prometheus metrics: it implements vend.Observer
// (counters and histograms of calls, payments and the ledger) and reads
// its gauges from Sources at each scrape. Safe for concurrent use.
type Metrics struct {
	reg  *prometheus.Registry
	log  *slog.Logger
	src  Sources
	keep map[Item]bool   // the items whose names are label values
	srv  map[string]bool // the servers whose names are label values

	calls, free        *prometheus.CounterVec
	payments           *prometheus.CounterVec
	received, refunded *prometheus.CounterVec
	quoteToInvoice     prometheus.Histogram
	invoiceToPaid      *prometheus.HistogramVec
	paidToExecution    prometheus.Histogram
	upstream           *prometheus.HistogramVec
	commit             prometheus.Histogram
	differences        *prometheus.GaugeVec

	// The call metrics' exemplars (see exemplars), registered in the
	// place of the call metrics.
	callsEx, quoteToInvoiceEx, invoiceToPaidEx, paidToExecutionEx, upstreamEx *exemplars
	quoteToInvoiceBy, paidToExecutionBy                                       exObserver

	// The children of the vectors observed on a call's path.
	callsBy                            *children[callKey, exCounter]
	freeBy                             *children[callKey, prometheus.Counter]
	upstreamBy                         *children[callKey, exObserver]
	paymentsBy, receivedBy, refundedBy *children[payKey, prometheus.Counter]
	invoiceToPaidBy                    *children[payKey, exObserver]
	// items holds each item's series of free and upstream calls (see
	// series): one map read per observation instead of four.
	items itemCache

	openMu sync.Mutex // one ledger read at a time
}

var _ vend.Observer = (*Metrics)(nil)

// Buckets for the durations of people and Lightning (quote to invoice,
// invoice to payment: seconds to minutes) and of machines (upstream calls,
// ledger commits: milliseconds to seconds).
var (
	slowBuckets = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	fastBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60}
)

// NewMetrics returns the metrics of a capvend whose configuration names
// servers (its upstreams) and items (its priced tools, prompts and
// resources): only those appear as label values, anything else as Other.
// Go runtime and process collectors are registered too. The gauges read
// src (see SetSources).
func NewMetrics(servers []string, items []Item, src Sources, log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{reg: prometheus.NewRegistry(), log: log, src: src, keep: map[Item]bool{}, srv: map[string]bool{}}
	for _, s := range servers {
		m.srv[s] = true
	}
	for _, it := range items {
		m.keep[it] = true
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m.calls = counter("capvend_calls_total", "Priced calls that reached an outcome (delivered, failed, refunded, expired, canceled; a failed call is refunded too), by kind, server and tool; exemplar: call_id.",
		"kind", "server", "tool", "outcome")
	m.free = counter("capvend_free_calls_total", "Calls nobody paid for (free items, daily free quota) that ran upstream, by kind, server and tool.",
		"kind", "server", "tool")
	m.payments = counter("capvend_payments_total", "Payment requests recorded (state open) and their moves to each later state, by backend.",
		"backend", "state")
	m.received = counter("capvend_received_msat_total", "Millisatoshis received (settled payments), by backend.", "backend")
	m.refunded = counter("capvend_refunded_msat_total", "Millisatoshis given back: refunds owed, and locked-in hold invoices canceled, by backend.", "backend")
	m.quoteToInvoice = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "capvend_quote_to_invoice_seconds",
		Help: "From a priced call's quote to its payment request; exemplar: call_id.", Buckets: fastBuckets})
	m.invoiceToPaid = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "capvend_invoice_to_paid_seconds",
		Help: "From a payment request to its payment (settled, or a hold invoice locked in), by backend; exemplar: call_id.", Buckets: slowBuckets}, []string{"backend"})
	m.paidToExecution = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "capvend_paid_to_execution_seconds",
		Help: "From a call's payment to the start of its execution; exemplar: call_id.", Buckets: fastBuckets})
	m.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "capvend_upstream_call_seconds",
		Help: "Upstream executions (free and paid), by server, tool and result (ok, error); exemplar: call_id (paid calls).", Buckets: fastBuckets}, []string{"server", "tool", "result"})
	m.commit = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "capvend_ledger_commit_seconds",
		Help: "Ledger write transactions, BEGIN to durable COMMIT (a group commit counts once).", Buckets: fastBuckets})
	m.differences = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "capvend_reconcile_differences",
		Help: "Differences between the ledger and the payment backends found by the last reconciliation, by kind."}, []string{"kind"})
	m.cacheChildren()
	m.reg.MustRegister(m.callsEx, m.free, m.payments, m.received, m.refunded, m.quoteToInvoiceEx, m.invoiceToPaidEx,
		m.paidToExecutionEx, m.upstreamEx, m.commit, m.differences, gauges{m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// cacheChildren makes the caches of the vectors' children.
func (m *Metrics) cacheChildren() {
	m.callsEx, m.upstreamEx, m.invoiceToPaidEx = newExemplars(m.calls), newExemplars(m.upstream), newExemplars(m.invoiceToPaid)
	m.quoteToInvoiceEx, m.paidToExecutionEx = newExemplars(m.quoteToInvoice), newExemplars(m.paidToExecution)
	m.quoteToInvoiceBy = exObserver{m.quoteToInvoice, m.quoteToInvoiceEx.series(m.quoteToInvoice)}
	m.paidToExecutionBy = exObserver{m.paidToExecution, m.paidToExecutionEx.series(m.paidToExecution)}
	m.callsBy = newChildren(func(k callKey) exCounter {
		c := m.calls.WithLabelValues(k.kind, k.server, k.tool, k.outcome)
		return exCounter{c, m.callsEx.series(c)}
	})
	m.freeBy = newChildren(func(k callKey) prometheus.Counter { return m.free.WithLabelValues(k.kind, k.server, k.tool) })
	m.upstreamBy = newChildren(func(k callKey) exObserver {
		h := m.upstream.WithLabelValues(k.server, k.tool, k.outcome)
		return exObserver{h, m.upstreamEx.series(h.(prometheus.Metric))}
	})
	byBackend := func(v *prometheus.CounterVec, state bool) *children[payKey, prometheus.Counter] {
		return newChildren(func(k payKey) prometheus.Counter {
			if state {
				return v.WithLabelValues(k.backend, k.state)
			}
			return v.WithLabelValues(k.backend)
		})
	}
	m.paymentsBy, m.receivedBy, m.refundedBy = byBackend(m.payments, true), byBackend(m.received, false), byBackend(m.refunded, false)
	m.invoiceToPaidBy = newChildren(func(k payKey) exObserver {
		h := m.invoiceToPaid.WithLabelValues(k.backend)
		return exObserver{h, m.invoiceToPaidEx.series(h.(prometheus.Metric))}
	})
}

// SetSources replaces the gauges' sources: for parts made after the
// metrics (the ledger needs its Observer when opened). Call it before
// Handler serves; it is not synchronized with scrapes.
func (m *Metrics) SetSources(src Sources) { m.src = src }

// sources are the gauges' sources (the dashboard shows them too).
func (m *Metrics) sources() Sources { return m.src }

// Registry is where the metrics are registered: another part of capvend
// may register its own collectors there (names prefixed capvend_).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format, or
// OpenMetrics (with exemplars) to a scraper that asks for it.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true, ErrorLog: slogPrinter{m.log},
		ErrorHandling: promhttp.ContinueOnError, Timeout: 10 * time.Second})
}

// SetReconcileDifferences sets the number of differences of one kind the
// last reconciliation found (0 clears it). kind must come from a fixed
// set the caller owns (e.g. "lnd_settled_not_booked"), never from data.
func (m *Metrics) SetReconcileDifferences(kind string, n int) {
	m.differences.WithLabelValues(kind).Set(float64(n))
}

// label returns the server and tool label values of an item: the
// configured ones, else Other.
func (m *Metrics) label(server, tool string) (string, string) {
	switch {
	case m.keep[Item{server, tool}]:
		return server, tool
	case m.srv[server]:
		return server, Other
	}
	return Other, Other
}

func kindLabel(k vend.ItemKind) string {
	switch k := k.Or(); k {
	case vend.ItemTool, vend.ItemPrompt, vend.ItemResource:
		return string(k)
	}
	return Other
}

// LedgerChanged implements vend.Observer.
func (m *Metrics) LedgerChanged(changes []vend.Change) {
	for i := range changes {
		c := &changes[i]
		switch c.What {
		case vend.ChangeCall:
			m.callMoved(c)
		case vend.ChangePayment:
			m.paymentMoved(c)
		case vend.ChangeRefund:
			m.refundedBy.get(payKey{backend: string(c.Backend)}).Add(float64(c.Amount))
		}
	}
}

func (m *Metrics) callMoved(c *vend.Change) {
	switch c.CallTo {
	case vend.CallAwaitingPayment:
		if c.CallFrom == vend.CallQuoted {
			observeCall(m.quoteToInvoiceBy, c.Since.Seconds(), c.Call)
		}
	case vend.CallExecuting:
		observeCall(m.paidToExecutionBy, c.Since.Seconds(), c.Call)
	case vend.CallDelivered, vend.CallFailed, vend.CallRefunded, vend.CallExpired, vend.CallCanceled:
		server, tool := m.label(c.Server, c.Tool)
		countCall(m.callsBy.get(callKey{kindLabel(c.Kind), server, tool, string(c.CallTo)}), c.Call)
	}
}

func (m *Metrics) paymentMoved(c *vend.Change) {
	backend := string(c.Backend)
	m.paymentsBy.get(payKey{backend, string(c.PayTo)}).Inc()
	switch {
	case c.PayFrom == vend.PaymentOpen && (c.PayTo == vend.PaymentSettled || c.PayTo == vend.PaymentAccepted):
		observeCall(m.invoiceToPaidBy.get(payKey{backend: backend}), c.Since.Seconds(), c.Call)
	case c.PayFrom == vend.PaymentAccepted && c.PayTo == vend.PaymentCanceled:
		m.refundedBy.get(payKey{backend: backend}).Add(float64(c.Amount)) // Lightning returns the locked-in money
	}
	if c.PayTo == vend.PaymentSettled {
		m.receivedBy.get(payKey{backend: backend}).Add(float64(c.Amount))
	}
}

// LedgerCommit implements vend.Observer.
func (m *Metrics) LedgerCommit(d time.Duration, _ int) { m.commit.Observe(d.Seconds()) }

// FreeCall implements vend.Observer.
func (m *Metrics) FreeCall(t vend.Item, err error) {
	if err != nil {
		return // it did not run
	}
	s := m.series(&t)
	child(&s.free, m.freeBy, s.freeKey).Inc()
}

// UpstreamCall implements vend.Observer.
// A priced call's observation carries its call id as an exemplar.
func (m *Metrics) UpstreamCall(t vend.Item, call vend.CallID, d time.Duration, err error) {
	s := m.series(&t)
	h := child(&s.ok, m.upstreamBy, s.okKey)
	if err != nil {
		h = child(&s.failed, m.upstreamBy, s.failedKey)
	}
	if call == 0 {
		h.Observe(d.Seconds())
		return
	}
	observeCall(h, d.Seconds(), call)
}

// slogPrinter lets promhttp log through slog.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("metrics", "err", v) }
