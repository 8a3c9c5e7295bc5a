package cli

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
)

// page is a tab of the chromium browser a test started (browser).
type page struct {
	t   *testing.T
	ctx context.Context // for chromedp.Run
}

// browser starts Debian's chromium, headless, with a fresh profile, for
// the test's length; every request it makes carries headers.
func browser(t *testing.T, headers map[string]any) *page {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		skip.Missing(t, "chromium", "apt-get install chromium")
	}
	// The profile is not a t.TempDir: chromium's helper processes may
	// still write into it for a moment after the browser was stopped, and
	// TempDir's cleanup fails the test on a directory not yet empty.
	profile, err := os.MkdirTemp("", "capvend-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(bin),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 1000))
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // stops the browser and waits for its process
		removeSettled(t, profile)
	})
	if err := chromedp.Run(ctx, network.Enable(), network.SetExtraHTTPHeaders(network.Headers(headers))); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &page{t: t, ctx: ctx}
}

// screenshot saves the whole page as a PNG under dir and logs its path.
func (p *page) screenshot(dir, name string) {
	t, ctx := p.t, p.ctx
	t.Helper()
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// js evaluates expr in the page into out, failing t on an error.
func (p *page) js(expr string, out any) {
	p.t.Helper()
	if err := chromedp.Run(p.ctx, chromedp.Evaluate(expr, out)); err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
}

// waitJS waits until expr is true in the page (a bound against a hang,
// not a speed check: the page refreshes itself every few seconds and the
// reconciler runs every 10 s).
func (p *page) waitJS(what, expr string) {
	t := p.t
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var ok bool
		p.js(expr, &ok)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var text string
			p.js("document.body.innerText", &text)
			t.Fatalf("the page never showed %s:\n%s", what, text)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// balanceRows parses the revenue tables of `capvend ledger balance`: per
// tool "account calls revenue", per day "day account revenue".
func balanceRows(out string) (tools, days [][]string) {
	var table *[][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "Revenue per tool"):
			table = &tools
		case strings.HasPrefix(line, "Revenue per day"):
			table = &days
		case len(f) == 0 || strings.HasPrefix(line, "Accounts"):
			table = nil
		case table != nil && len(f) == 3 && f[0] != "total" && f[0] != "TOOL" && f[0] != "DAY":
			*table = append(*table, f)
		}
	}
	return tools, days
}

// unpaidCall starts a priced call whose payment request nobody pays, and
// returns the request's payment hash (hex) and the call's outcome.
func unpaidCall(t *testing.T, s *testnet.Stack, url string) (string, <-chan error) {
	t.Helper()
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	bolt11 := make(chan string, 1)
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == "notifications/payment_required" {
			b, _ := json.Marshal(n.Params.AdditionalFields)
			var p struct {
				PayReq string `json:"pay_req"`
			}
			json.Unmarshal(b, &p)
			select {
			case bolt11 <- p.PayReq:
			default:
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, capvendtest.PayingInit()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		res, err := c.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_sha256", Arguments: map[string]any{"text": "never paid"}}})
		if err == nil && !res.IsError {
			err = fmt.Errorf("the unpaid call was answered: %v", res.Content)
		}
		done <- err
	}()
	var pr string
	select {
	case pr = <-bolt11:
	case <-ctx.Done():
		t.Fatal("no payment request for the unpaid call")
	}
	conn, err := s.Conn(testnet.Vendor)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := lnrpc.NewLightningClient(conn).DecodePayReq(ctx, &lnrpc.PayReqString{PayReq: pr})
	if err != nil {
		t.Fatal(err)
	}
	return dec.PaymentHash, done
}

// The operator's dashboard in a real headless Chromium, on a capvend
// serving the regtest stack: its revenue equals `capvend ledger balance`,
// a call's link leads to its history (payment, settlement, execution,
// journal), and a reconciliation difference made for real (an invoice
// canceled at LND behind capvend's back) appears on the page by its own
// refresh, without a reload. Screenshots are saved in the test's temp dir.
func TestDashboardInChromium(t *testing.T) {
	t.Parallel()
	const token = "dashboard-token-0123456789"
	s := needStack(t)
	pg := browser(t, map[string]any{"Authorization": "Bearer " + token})
	ctx := pg.ctx
	path, listen := writeServeConfig(t, s, serveOpts{})
	tokenFile := filepath.Join(filepath.Dir(path), "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := capvendtest.AdminConfig(t, path, "  token_file: "+tokenFile+"\nreconcile:\n  interval: 10s\n")
	startCapvend(t, path)
	pc := capvendtest.NewPayingClient(t, s, "http://"+listen+"/mcp")
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	shots := t.TempDir()
	if d := os.Getenv("CAPVEND_SCREENSHOTS"); d != "" {
		shots = d
	}

	for _, c := range []struct {
		tool string
		fail bool
	}{{"t_sha256", false}, {"t_sha256", false}, {"w_sha256", false}, {"t_always_fails", true}} {
		res, err := pc.Call(t, c.tool, map[string]any{"text": "hi"})
		if err != nil || res.IsError != c.fail {
			t.Fatalf("%s: %v %v", c.tool, res, err)
		}
		if err := <-pc.Paid; err != nil {
			t.Fatal(err)
		}
	}
	if res, err := pc.Call(t, "t_word_count", map[string]any{"text": "free"}); err != nil || res.IsError {
		t.Fatalf("free call: %v %v", res, err)
	}

	// The revenue shown is what `capvend ledger balance` prints.
	base := "http://" + addr + "/"
	if err := chromedp.Run(ctx, chromedp.Navigate(base), chromedp.WaitVisible("#revenue table.tools")); err != nil {
		t.Fatal(err)
	}
	var shownTools, shownDays [][]string
	pg.js(`[...document.querySelectorAll('#revenue table.tools tr[data-account]')].map(r => [...r.cells].map(c => c.textContent.trim()))`, &shownTools)
	pg.js(`[...document.querySelectorAll('#revenue table.days tr[data-account]')].map(r => [...r.cells].map(c => c.textContent.trim()))`, &shownDays)
	tools, days := balanceRows(capvendIn(t, "", nil, "ledger", "balance", "--config", path))
	if len(tools) != 3 || !reflect.DeepEqual(shownTools, tools) || len(days) == 0 || !reflect.DeepEqual(shownDays, days) {
		t.Fatalf("the dashboard shows revenue\n%v\n%v\ncapvend ledger balance prints\n%v\n%v", shownTools, shownDays, tools, days)
	}
	var owed string
	pg.js(`document.querySelector('#refunds table.owed tbody').innerText`, &owed)
	if !strings.Contains(owed, "5.000") || !strings.Contains(owed, "the tool reported an error") {
		t.Errorf("refunds owed: %q", owed)
	}
	pg.screenshot(shots, "dashboard")

	// The newest delivered sha256 call's link leads to its history.
	var href string
	pg.js(`(() => { for (const r of document.querySelectorAll('#calls tr[data-call]')) {
		if (r.innerText.includes('tools/sha256') && r.querySelector('.state.delivered')) return r.querySelector('a').getAttribute('href'); } return ''; })()`, &href)
	if href == "" {
		t.Fatal("no delivered tools/sha256 call listed")
	}
	if err := chromedp.Run(ctx, chromedp.Click(`#calls a[href="`+href+`"]`, chromedp.ByQuery), chromedp.WaitVisible("#journal")); err != nil {
		t.Fatal(err)
	}
	var hist struct {
		URL, State, Payment, Settlement, Execution, Result, Journal string
	}
	pg.js(`({URL: location.pathname, State: document.querySelector('#call-state').textContent,
		Payment: document.querySelector('#payments tbody').innerText, Settlement: document.querySelector('#settlement tbody').innerText,
		Execution: document.querySelector('#execution tbody').innerText,
		Result: document.querySelector('#result').innerText, Journal: document.querySelector('#journal').innerText})`, &hist)
	if hist.URL != "/"+href || hist.State != "delivered" || !strings.Contains(hist.Payment, "settled") || !strings.Contains(hist.Payment, "21.000") ||
		!strings.Contains(hist.Settlement, "21.000\t0.000") ||
		!strings.Contains(hist.Execution, "tools/sha256") || !strings.Contains(hist.Result, "a result") ||
		!strings.Contains(hist.Journal, "settlement") || !strings.Contains(hist.Journal, "income:tools:tools:sha256\t-21.000") ||
		!strings.Contains(hist.Journal, "21.000") {
		t.Fatalf("call history %s:\n%+v", href, hist)
	}
	pg.screenshot(shots, "call")

	// A call nobody pays: its invoice is pending; then canceled at LND
	// behind capvend's back. The reconciler finds it, and the open page
	// shows it at its next refresh.
	if err := chromedp.Run(ctx, chromedp.Navigate(base), chromedp.WaitVisible("#reconcile"),
		chromedp.Evaluate(`window.notReloaded = true`, nil)); err != nil {
		t.Fatal(err)
	}
	hash, unpaid := unpaidCall(t, s, "http://"+listen+"/mcp")
	pg.waitJS("the unpaid invoice as pending", `!!document.querySelector('#pending .open tr[data-ref="`+hash+`"]')`)
	conn, err := s.Conn(testnet.Vendor)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := hex.DecodeString(hash)
	if _, err := invoicesrpc.NewInvoicesClient(conn).CancelInvoice(context.Background(), &invoicesrpc.CancelInvoiceMsg{PaymentHash: h}); err != nil {
		t.Fatal(err)
	}
	pg.waitJS("the canceled invoice as a reconciliation difference",
		`!!document.querySelector('#reconcile tr[data-kind="canceled_unbooked"][data-ref="`+hash+`"]')`)
	var still bool
	pg.js(`window.notReloaded === true && Number(document.body.dataset.refreshes) > 0`, &still)
	if !still {
		t.Fatal("the page was reloaded, or never refreshed itself")
	}
	var diff string
	pg.js(`document.querySelector('#reconcile tr[data-kind="canceled_unbooked"]').innerText`, &diff)
	if !strings.Contains(diff, "reconcile") {
		t.Errorf("the difference was not repaired: %q", diff)
	}
	pg.screenshot(shots, "reconcile")
	select {
	case err := <-unpaid:
		if err == nil {
			t.Error("the unpaid call ended without an error")
		}
	case <-time.After(2 * time.Minute):
		t.Error("the unpaid call never ended after its invoice was canceled")
	}
	// The per-day totals the dashboard reads agree with the journal.
	if out := capvendIn(t, "", nil, "ledger", "verify", "--config", path); !strings.Contains(out, "ok    the daily account totals") {
		t.Errorf("ledger verify:\n%s", out)
	}
}

// removeSettled removes dir once whatever still writes into it is done:
// it tries again for a few seconds, then leaves it with a log line.
func removeSettled(t *testing.T, dir string) {
	var err error
	for range 50 {
		if err = os.RemoveAll(dir); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("chromium profile %s left behind: %v", dir, err)
}
