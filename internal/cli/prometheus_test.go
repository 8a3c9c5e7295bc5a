package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/internal/skip"
)

// startPrometheus runs Debian's prometheus on loopback, in a temp dir,
// scraping target (host:port) every second, until the test ends. It
// returns the base URL of its HTTP API.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		skip.Missing(t, "prometheus", "apt-get install prometheus")
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: capvend\n    static_configs:\n      - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := capvendtest.FreeAddr(t)
	var out bytes.Buffer
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+listen, "--enable-feature=exemplar-storage")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", out.String())
		}
	})
	return "http://" + listen
}

// promQuery evaluates q at Prometheus now: the sum of its samples, and
// whether it had any.
func promQuery(base, q string) (float64, bool, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, false, err
	}
	if r.Status != "success" {
		return 0, false, fmt.Errorf("query %s: %s", q, r.Status)
	}
	var sum float64
	for _, s := range r.Data.Result {
		v, err := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		if err != nil {
			return 0, false, err
		}
		sum += v
	}
	return sum, len(r.Data.Result) > 0, nil
}

// A real Prometheus scrapes capvend's admin listener while paid, free,
// failed and refunded calls are made on regtest: every counter and
// histogram moved by exactly the number of calls.
func TestPrometheusScrapesCallMetrics(t *testing.T) {
	t.Parallel()
	s := needStack(t)
	path, listen := writeServeConfig(t, s, serveOpts{hold: true})
	admin := capvendtest.AdminConfig(t, path, "")
	prom := startPrometheus(t, admin)
	startCapvend(t, path)
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))

	const paid, free, failed = 2, 3, 1
	for range free {
		if res, err := pc.Call(t, "t_word_count", map[string]any{"text": "free as in beer"}); err != nil || res.IsError {
			t.Fatalf("free call: %v %v", res, err)
		}
	}
	for range paid {
		if res, err := pc.Call(t, "t_sha256", map[string]any{"text": "hi"}); err != nil || res.IsError {
			t.Fatalf("paid call: %v %v", res, err)
		}
		if err := <-pc.Paid; err != nil {
			t.Fatal(err)
		}
	}
	for range failed { // paid (a hold invoice locked in), failed, refunded (the invoice canceled)
		if res, err := pc.Call(t, "t_always_fails", map[string]any{"text": "x"}); err != nil || !res.IsError {
			t.Fatalf("failing call: %v %v", res, err)
		}
		<-pc.Paid // the payment fails: the hold invoice was canceled
	}

	const priced = paid + failed
	want := []struct {
		q string
		v float64
	}{
		{`capvend_calls_total{kind="tool",server="tools",tool="sha256",outcome="delivered"}`, paid},
		{`capvend_calls_total{kind="tool",server="tools",tool="always_fails",outcome="failed"}`, failed},
		{`capvend_calls_total{kind="tool",server="tools",tool="always_fails",outcome="refunded"}`, failed},
		{`sum(capvend_calls_total{outcome=~"expired|canceled"}) or vector(0)`, 0},
		{`capvend_free_calls_total{kind="tool",server="tools",tool="other"}`, free},
		{`capvend_payments_total{backend="lnd",state="open"}`, priced},
		{`capvend_payments_total{backend="lnd",state="accepted"}`, priced},
		{`capvend_payments_total{backend="lnd",state="settled"}`, paid},
		{`capvend_payments_total{backend="lnd",state="canceled"}`, failed},
		{`capvend_received_msat_total{backend="lnd"}`, paid * 21000},
		{`capvend_refunded_msat_total{backend="lnd"}`, failed * 5000},
		{`capvend_quote_to_invoice_seconds_count`, priced},
		{`capvend_invoice_to_paid_seconds_count{backend="lnd"}`, priced},
		{`capvend_paid_to_execution_seconds_count`, priced},
		{`sum(capvend_upstream_call_seconds_count{server="tools"})`, free + priced},
		{`capvend_open_quotes`, 0},
		{`capvend_locked_hold_invoices`, 0},
		{`capvend_inflight_requests`, 0},
		{`capvend_upstreams_connected`, 2},
		{`capvend_ledger_gauges_up`, 1},
	}
	// Prometheus sees the calls at its next scrapes: wait for them (a
	// bound against a hang, not a speed check), then compare exactly.
	deadline := time.Now().Add(60 * time.Second)
	var bad []string
	for {
		bad = bad[:0]
		for _, w := range want {
			got, ok, err := promQuery(prom, w.q)
			if err != nil || !ok || got != w.v {
				bad = append(bad, fmt.Sprintf("%s = %v (present %v, %v), want %v", w.q, got, ok, err, w.v))
			}
		}
		if len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(bad) > 0 {
		t.Fatalf("Prometheus's view after %d paid, %d free and %d failed calls:\n%s", paid, free, failed, strings.Join(bad, "\n"))
	}
	if n, ok, err := promQuery(prom, `capvend_ledger_commit_seconds_count`); err != nil || !ok || n < 1 {
		t.Errorf("ledger commits: %v %v %v", n, ok, err)
	}
	// The call ids are exemplars of the call metrics.
	resp, err := http.Get(prom + "/api/v1/query_exemplars?query=" + url.QueryEscape(`capvend_calls_total`) +
		"&start=" + strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10) + "&end=" + strconv.FormatInt(time.Now().Unix(), 10))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ex bytes.Buffer
	ex.ReadFrom(resp.Body)
	if !strings.Contains(ex.String(), `"call_id":"`) {
		t.Errorf("no call_id exemplar in Prometheus: %s", ex.String())
	}
}
