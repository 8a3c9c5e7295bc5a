package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capvend/capvend/vend"
)

func TestNeedsTokenOffLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		token string
		ok    bool
	}{
		{"127.0.0.1:9402", "", true},
		{"[::1]:9402", "", true},
		{"localhost:9402", "", true},
		{"0.0.0.0:9402", "", false},
		{":9402", "", false},
		{"10.1.2.3:9402", "", false},
		{"0.0.0.0:9402", "0123456789abcdef", true},
	} {
		_, err := NewServer(tc.addr, []byte(tc.token), nil)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrNeedsToken)) {
			t.Errorf("NewServer(%q, token %q) = %v, want ok=%v", tc.addr, tc.token, err, tc.ok)
		}
	}
}

func TestTokenAuth(t *testing.T) {
	const token = "0123456789abcdef0123"
	s, err := NewServer("0.0.0.0:0", []byte(token), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Handle("GET /metrics", NewMetrics(nil, nil, Sources{}, nil).Handler())
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/healthz", "", http.StatusUnauthorized},
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "Bearer wrong-token-0123456", http.StatusUnauthorized},
		{"/metrics", "Basic " + token, http.StatusUnauthorized},
		{"/metrics", "Bearer " + token + "x", http.StatusUnauthorized},
		{"/metrics", "Bearer " + token, http.StatusOK},
		{"/healthz", "Bearer " + token, http.StatusOK},
		{"/readyz", "Bearer " + token, http.StatusOK},
		{"/mcp", "Bearer " + token, http.StatusNotFound},
	} {
		r := httptest.NewRequest("GET", tc.path, nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("GET %s with %q: %d, want %d", tc.path, tc.auth, w.Code, tc.want)
		}
	}
}

func TestReadyzStates(t *testing.T) {
	s, err := NewServer("127.0.0.1:0", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ledgerErr, upstreamErr error = nil, errors.New("not listed yet: words")
	s.AddCheck(Check{Name: "ledger", Check: func(context.Context) error { return ledgerErr }})
	s.AddCheck(Check{Name: "upstreams", Check: func(context.Context) error { return upstreamErr }})
	get := func(path string) (int, string) {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		b, _ := io.ReadAll(w.Body)
		return w.Code, string(b)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("healthz while not ready: %d %s (alive is not ready)", code, body)
	}
	code, body := get("/readyz")
	if code != 503 || !strings.Contains(body, "not ready: upstreams: not listed yet: words") || !strings.Contains(body, "ok: ledger") {
		t.Fatalf("readyz with an upstream down: %d\n%s", code, body)
	}
	upstreamErr = nil
	if code, body := get("/readyz"); code != 200 || strings.Contains(body, "not ready") {
		t.Fatalf("readyz with everything up: %d\n%s", code, body)
	}
	ledgerErr = errors.New("ledger closed")
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "not ready: ledger: ledger closed") {
		t.Fatalf("readyz with the ledger closed: %d\n%s", code, body)
	}
}

// A check's Info is shown beside it while it passes; its reason while it
// fails.
func TestReadyzInfo(t *testing.T) {
	s, err := NewServer("127.0.0.1:0", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pricesErr error
	s.AddCheck(Check{Name: "prices", Check: func(context.Context) error { return pricesErr }, Info: func() string { return "unpriced items free" }})
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	if body := w.Body.String(); w.Code != 200 || body != "ok: prices: unpriced items free\n" {
		t.Fatalf("readyz: %d %q", w.Code, body)
	}
	pricesErr = errors.New("a price names nothing")
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	if body := w.Body.String(); w.Code != 503 || body != "not ready: prices: a price names nothing\n" {
		t.Fatalf("readyz: %d %q", w.Code, body)
	}
}

// Label values come from the configuration only: a tool, server or kind
// nobody configured is counted as "other", however many there are.
func TestLabelsBounded(t *testing.T) {
	m := NewMetrics([]string{"words"}, []Item{{"words", "word_count"}}, Sources{}, nil)
	for i := range 1000 {
		name := "client_chosen_" + strings.Repeat("x", i%50)
		m.LedgerChanged([]vend.Change{{What: vend.ChangeCall, Call: vend.CallID(i), Kind: vend.ItemTool, Server: "words", Tool: name,
			CallFrom: vend.CallExecuting, CallTo: vend.CallDelivered}})
		m.LedgerChanged([]vend.Change{{What: vend.ChangeCall, Call: vend.CallID(i), Kind: vend.ItemKind(name), Server: name, Tool: name,
			CallFrom: vend.CallExecuting, CallTo: vend.CallDelivered}})
		m.FreeCall(vend.Item{Server: name, UpstreamName: name}, nil)
		m.UpstreamCall(vend.Item{Server: "words", UpstreamName: name}, 0, time.Millisecond, nil)
	}
	m.LedgerChanged([]vend.Change{{What: vend.ChangeCall, Call: 1, Kind: vend.ItemTool, Server: "words", Tool: "word_count",
		CallFrom: vend.CallExecuting, CallTo: vend.CallDelivered}})
	if n := testutil.CollectAndCount(m.calls); n != 3 {
		t.Errorf("capvend_calls_total has %d series, want 3 (words/word_count, words/other, other/other)", n)
	}
	if got := testutil.ToFloat64(m.calls.WithLabelValues("tool", "words", Other, "delivered")); got != 1000 {
		t.Errorf("words/other delivered = %v, want 1000", got)
	}
	if got := testutil.ToFloat64(m.calls.WithLabelValues(Other, Other, Other, "delivered")); got != 1000 {
		t.Errorf("other/other delivered = %v, want 1000", got)
	}
	if n := testutil.CollectAndCount(m.free); n != 1 {
		t.Errorf("capvend_free_calls_total has %d series, want 1", n)
	}
	if n := testutil.CollectAndCount(m.upstream); n != 1 {
		t.Errorf("capvend_upstream_call_seconds has %d series, want 1", n)
	}
}

// The call metrics carry the call id as an exemplar (OpenMetrics).
func TestCallIDExemplar(t *testing.T) {
	m := NewMetrics([]string{"words"}, []Item{{"words", "word_count"}}, Sources{}, nil)
	m.LedgerChanged([]vend.Change{
		{What: vend.ChangeCall, Call: 42, Kind: vend.ItemTool, Server: "words", Tool: "word_count", CallFrom: vend.CallQuoted, CallTo: vend.CallAwaitingPayment, Since: time.Millisecond},
		{What: vend.ChangeCall, Call: 42, Kind: vend.ItemTool, Server: "words", Tool: "word_count", CallFrom: vend.CallExecuting, CallTo: vend.CallDelivered},
	})
	m.UpstreamCall(vend.Item{Server: "words", UpstreamName: "word_count"}, 42, 3*time.Millisecond, nil)
	m.UpstreamCall(vend.Item{Server: "words", UpstreamName: "word_count"}, 0, 30*time.Millisecond, nil) // free: no exemplar
	body := scrapeOpenMetrics(m)
	for _, want := range []string{
		`capvend_calls_total{kind="tool",outcome="delivered",server="words",tool="word_count"} 1.0 # {call_id="42"} 1.0`,
		`capvend_quote_to_invoice_seconds_bucket{le="0.001"} 1 # {call_id="42"} 0.001`,
		`capvend_upstream_call_seconds_bucket{result="ok",server="words",tool="word_count",le="0.005"} 1 # {call_id="42"} 0.003`,
		`capvend_upstream_call_seconds_bucket{result="ok",server="words",tool="word_count",le="0.05"} 2` + "\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in\n%s", want, grep(body, "capvend_calls_total", "capvend_quote_to_invoice_seconds_bucket", "capvend_upstream_call_seconds_bucket"))
		}
	}
}

// A scrape shows each bucket's latest exemplar, the +Inf bucket's too,
// and a counter's latest, however many calls were observed before.
func TestLatestExemplars(t *testing.T) {
	m := NewMetrics([]string{"words"}, []Item{{"words", "word_count"}}, Sources{}, nil)
	tool := vend.Item{Server: "words", UpstreamName: "word_count"}
	for id := vend.CallID(1); id <= 100; id++ {
		m.UpstreamCall(tool, id, 3*time.Millisecond, nil)
		m.UpstreamCall(tool, 1000+id, 100*time.Second, nil) // above the last bound
		m.LedgerChanged([]vend.Change{{What: vend.ChangeCall, Call: id, Kind: vend.ItemTool, Server: "words", Tool: "word_count",
			CallFrom: vend.CallExecuting, CallTo: vend.CallDelivered}})
	}
	body := scrapeOpenMetrics(m)
	for _, want := range []string{
		`capvend_calls_total{kind="tool",outcome="delivered",server="words",tool="word_count"} 100.0 # {call_id="100"} 1.0`,
		`capvend_upstream_call_seconds_bucket{result="ok",server="words",tool="word_count",le="0.005"} 100 # {call_id="100"} 0.003`,
		`capvend_upstream_call_seconds_bucket{result="ok",server="words",tool="word_count",le="+Inf"} 200 # {call_id="1100"} 100.0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in\n%s", want, grep(body, "capvend_calls_total", "capvend_upstream_call_seconds_bucket"))
		}
	}
	if n := strings.Count(body, "# {call_id="); n != 3 {
		t.Errorf("%d exemplars, want 3:\n%s", n, grep(body, "# {"))
	}
}

// scrapeOpenMetrics is m's /metrics as a scraper asking for OpenMetrics
// (with exemplars) reads it.
func scrapeOpenMetrics(m *Metrics) string {
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, r)
	return w.Body.String()
}

func grep(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}

// The gauges are read from their sources at each scrape.
func TestGauges(t *testing.T) {
	m := NewMetrics(nil, nil, Sources{
		Open: func(context.Context) (Open, error) {
			return Open{Quotes: 3, LockedHolds: 2, RefundsOwed: 1, OwedMsat: 21000}, nil
		},
		InFlight:  func() int64 { return 7 },
		Sessions:  func() map[string]int { return map[string]int{"http": 4, "nostr": 5} },
		Relays:    func() int { return 2 },
		Upstreams: func() int { return 1 },
	}, nil)
	m.SetReconcileDifferences("lnd_settled_not_booked", 1)
	want := `
# HELP capvend_open_quotes Priced calls quoted or awaiting payment (ledger).
# TYPE capvend_open_quotes gauge
capvend_open_quotes 3
# HELP capvend_locked_hold_invoices Hold invoices whose payment is locked in, neither settled nor canceled yet (ledger).
# TYPE capvend_locked_hold_invoices gauge
capvend_locked_hold_invoices 2
# HELP capvend_refunds_owed_msat Millisatoshis owed back to clients (ledger liabilities:refunds).
# TYPE capvend_refunds_owed_msat gauge
capvend_refunds_owed_msat 21000
# HELP capvend_inflight_requests Call requests being served, those waiting for payment included.
# TYPE capvend_inflight_requests gauge
capvend_inflight_requests 7
# HELP capvend_sessions Live client sessions, by front.
# TYPE capvend_sessions gauge
capvend_sessions{front="http"} 4
capvend_sessions{front="nostr"} 5
# HELP capvend_nostr_relays_connected Nostr relays connected.
# TYPE capvend_nostr_relays_connected gauge
capvend_nostr_relays_connected 2
# HELP capvend_upstreams_connected Upstream MCP servers connected.
# TYPE capvend_upstreams_connected gauge
capvend_upstreams_connected 1
# HELP capvend_reconcile_differences Differences between the ledger and the payment backends found by the last reconciliation, by kind.
# TYPE capvend_reconcile_differences gauge
capvend_reconcile_differences{kind="lnd_settled_not_booked"} 1
`
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(want), "capvend_open_quotes", "capvend_locked_hold_invoices",
		"capvend_refunds_owed_msat", "capvend_inflight_requests", "capvend_sessions", "capvend_nostr_relays_connected",
		"capvend_upstreams_connected", "capvend_reconcile_differences"); err != nil {
		t.Error(err)
	}
}

// A free call counts once, in its item's series; an upstream call is ok
// or error; a series appears at its first observation only, and an item
// past maxItems is counted all the same.
func TestFreeAndUpstreamSeries(t *testing.T) {
	m := NewMetrics([]string{"words"}, []Item{{"words", "word_count"}}, Sources{}, nil)
	tool := vend.Item{Server: "words", UpstreamName: "word_count"}
	m.UpstreamCall(tool, 0, time.Millisecond, nil)
	m.FreeCall(tool, nil)
	if n := testutil.CollectAndCount(m.upstream); n != 1 {
		t.Fatalf("capvend_upstream_call_seconds has %d series before any error, want 1", n)
	}
	m.UpstreamCall(tool, 0, time.Millisecond, errors.New("down"))
	m.FreeCall(tool, errors.New("down")) // did not run: not counted
	for range 2 {
		m.UpstreamCall(tool, 0, time.Millisecond, nil)
		m.FreeCall(tool, nil)
	}
	if got := testutil.ToFloat64(m.free.WithLabelValues("tool", "words", "word_count")); got != 3 {
		t.Errorf("free calls = %v, want 3", got)
	}
	if n := testutil.CollectAndCount(m.upstream); n != 2 {
		t.Errorf("capvend_upstream_call_seconds has %d series, want 2 (ok, error)", n)
	}
	for i := range maxItems + 5 {
		m.FreeCall(vend.Item{Server: "words", UpstreamName: "t" + strconv.Itoa(i)}, nil)
	}
	if got := testutil.ToFloat64(m.free.WithLabelValues("tool", "words", Other)); got != maxItems+5 {
		t.Errorf("words/other free calls = %v, want %d", got, maxItems+5)
	}
	if n := m.items.len(); n != maxItems {
		t.Errorf("%d items kept, want %d", n, maxItems)
	}
}
