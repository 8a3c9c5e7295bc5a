package admin

import (
	"context"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The gauges, read from Sources at each scrape (nothing on a call's path
// keeps them up to date).
var (
	descOpenQuotes  = prometheus.NewDesc("capvend_open_quotes", "Priced calls quoted or awaiting payment (ledger).", nil, nil)
	descLockedHolds = prometheus.NewDesc("capvend_locked_hold_invoices", "Hold invoices whose payment is locked in, neither settled nor canceled yet (ledger).", nil, nil)
	descRefundsOwed = prometheus.NewDesc("capvend_refunds_owed", "Refunds owed to clients (ledger).", nil, nil)
	descOwedMsat    = prometheus.NewDesc("capvend_refunds_owed_msat", "Millisatoshis owed back to clients (ledger liabilities:refunds).", nil, nil)
	descInFlight    = prometheus.NewDesc("capvend_inflight_requests", "Call requests being served, those waiting for payment included.", nil, nil)
	descSessions    = prometheus.NewDesc("capvend_sessions", "Live client sessions, by front.", []string{"front"}, nil)
	descRelays      = prometheus.NewDesc("capvend_nostr_relays_connected", "Nostr relays connected.", nil, nil)
	descUpstreams   = prometheus.NewDesc("capvend_upstreams_connected", "Upstream MCP servers connected.", nil, nil)
	descScrapeError = prometheus.NewDesc("capvend_ledger_gauges_up", "1 if the ledger's gauges were read at this scrape, 0 if the read failed.", nil, nil)
	descPublished   = prometheus.NewDesc("capvend_nostr_published_total", "Events of the Nostr front a relay took, by relay.", []string{"relay"}, nil)
	descRefused     = prometheus.NewDesc("capvend_nostr_publish_failures_total",
		"Events of the Nostr front a relay did not take, by relay and reason (its OK false prefix: blocked, invalid, rate-limited ...; or timeout, connection, too-large).",
		[]string{"relay", "reason"}, nil)
	descUndelivered = prometheus.NewDesc("capvend_nostr_undelivered_answers_total", "Nostr answers no relay took (an error answer went instead, if it could).", nil, nil)
	descTransfers   = prometheus.NewDesc("capvend_nostr_oversized_transfers_total", "CEP-22 oversized transfers, by direction (out: answers, in: requests) and outcome.",
		[]string{"direction", "outcome"}, nil)
)

// gauges is the collector of the gauges of m.src.
type gauges struct{ m *Metrics }

// Describe implements prometheus.Collector.
func (g gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpenQuotes, descLockedHolds, descRefundsOwed, descOwedMsat, descInFlight,
		descSessions, descRelays, descUpstreams, descScrapeError, descPublished, descRefused, descUndelivered, descTransfers} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (g gauges) Collect(ch chan<- prometheus.Metric) {
	src := g.m.src
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if src.Open != nil {
		g.m.openMu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		o, err := src.Open(ctx)
		cancel()
		g.m.openMu.Unlock()
		if err != nil {
			g.m.log.Warn("metrics: reading the ledger's gauges", "err", err)
			gauge(descScrapeError, 0)
		} else {
			gauge(descScrapeError, 1)
			gauge(descOpenQuotes, float64(o.Quotes))
			gauge(descLockedHolds, float64(o.LockedHolds))
			gauge(descRefundsOwed, float64(o.RefundsOwed))
			gauge(descOwedMsat, float64(o.OwedMsat))
		}
	}
	if src.InFlight != nil {
		gauge(descInFlight, float64(src.InFlight()))
	}
	if src.Sessions != nil {
		s := src.Sessions()
		fronts := make([]string, 0, len(s))
		for f := range s {
			fronts = append(fronts, f)
		}
		sort.Strings(fronts)
		for _, f := range fronts {
			gauge(descSessions, float64(s[f]), f)
		}
	}
	if src.Relays != nil {
		gauge(descRelays, float64(src.Relays()))
	}
	if src.Upstreams != nil {
		gauge(descUpstreams, float64(src.Upstreams()))
	}
	if src.Nostr != nil {
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		n := src.Nostr()
		for _, r := range n.Relays {
			counter(descPublished, r.Accepted, r.URL)
			reasons := make([]string, 0, len(r.Failed))
			for k := range r.Failed {
				reasons = append(reasons, k)
			}
			sort.Strings(reasons)
			for _, k := range reasons {
				counter(descRefused, r.Failed[k], r.URL, k)
			}
		}
		counter(descUndelivered, n.Undelivered)
		for _, dir := range []string{"out", "in"} {
			for _, outcome := range []string{"ok", "failed"} {
				counter(descTransfers, n.Transfers[[2]string{dir, outcome}], dir, outcome)
			}
		}
	}
}
