package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// fakeBooks is a DashboardSource with fixed contents (the real one, the
// ledger, is tested in internal/cli: TestDashboardInChromium).
type fakeBooks struct {
	snap *Snapshot
	hist map[vend.CallID]*CallHistory
	err  error
}

func (f *fakeBooks) Snapshot(context.Context) (*Snapshot, error) { return f.snap, f.err }

func (f *fakeBooks) CallHistory(_ context.Context, id vend.CallID) (*CallHistory, error) {
	if h, ok := f.hist[id]; ok {
		return h, nil
	}
	return nil, fmt.Errorf("call %d: %w", id, vend.ErrNotFound)
}

func dashboardServer(t *testing.T, books *fakeBooks, token string) *httptest.Server {
	t.Helper()
	srv, err := NewServer("127.0.0.1:0", []byte(token), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.AddCheck(Check{Name: "upstreams", Check: func(context.Context) error { return errors.New("not listed yet: web") }})
	m := NewMetrics(nil, nil, Sources{Upstreams: func() int { return 1 }, Relays: func() int { return 2 }}, nil)
	if _, err := NewDashboard(srv, m, books); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts
}

func fetch(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func sampleBooks() *fakeBooks {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	call := vend.Call{ID: 7, State: vend.CallDelivered, CreatedAt: now.Add(-2 * time.Second), UpdatedAt: now}
	call.Server, call.Name, call.Kind, call.Price = "tools", "sha256", vend.ItemTool, 21_000
	pay := vend.Payment{ID: 3, CallID: 8, State: vend.PaymentOpen}
	pay.Backend, pay.Kind, pay.Ref, pay.Amount = vend.BackendLND, vend.KindInvoice, "ab12cd34ef56ab12cd34ef56", 5_000
	return &fakeBooks{
		snap: &Snapshot{
			Now:   now,
			Tools: []Revenue{{Account: "income:tools:tools:sha256", Calls: 2, Revenue: 42_000}, {Account: "income:tools:tools:<b>x", Calls: 1, Revenue: -1_500}},
			Days: []DayRevenue{{Day: "2026-11-23", Account: "income:tools:tools:sha256", Revenue: 21_000},
				{Day: "2026-11-24", Account: "income:tools:tools:sha256", Revenue: 21_000}, {Day: "2026-11-24", Account: "income:tools:tools:<b>x", Revenue: -1_500}},
			Pending: Pending{OpenPayments: 1, OpenAmount: 5_000, RefundsOwed: 1, OwedAmount: 1_500},
			Open:    []vend.Payment{pay},
			Calls:   []CallRow{{Call: call, Backend: vend.BackendLND, Duration: 2 * time.Second}},
			Reconcile: []ReconcileRun{{ID: 4, Started: now, Finished: now, DifferencesCount: 1,
				Differences: []Difference{{Run: 4, Kind: "canceled_unbooked", Backend: "lnd", Ref: "ab12", Detail: "canceled at LND"}}}},
		},
		hist: map[vend.CallID]*CallHistory{7: {Call: call, Entries: []Entry{{ID: 9, Kind: "settlement", Sealed: true,
			Postings: []Posting{{Account: "assets:lightning:lnd", Amount: 21_000}, {Account: "income:tools:tools:sha256", Amount: -21_000}}}}}},
	}
}

// The page shows each part of the books, escaped; the JSON the page
// polls has the data and each section rendered; a call's page has its
// journal; a missing call is 404.
func TestDashboardPages(t *testing.T) {
	ts := dashboardServer(t, sampleBooks(), "")
	code, page := fetch(t, ts.URL+"/", "")
	if code != 200 {
		t.Fatalf("GET /: %d %s", code, page)
	}
	for _, want := range []string{
		`<tr data-account="income:tools:tools:sha256"><td>income:tools:tools:sha256</td><td class="num calls">2</td><td class="num revenue">42.000</td></tr>`,
		`income:tools:tools:&lt;b&gt;x`, // escaped
		`<g class="day" data-day="2026-11-24" data-total="19.500">`,
		`<a href="calls/7">#7</a>`, `2.0 s`, `<td class="state delivered">delivered</td>`,
		`data-ref="ab12cd34ef56ab12cd34ef56"`,
		`<tr data-check="upstreams"><td>upstreams</td><td class="bad">not ready</td><td>not listed yet: web</td></tr>`,
		`Upstreams connected: <b id="upstreams">1</b>`, `relays connected: <b id="relays">2</b>`,
		`<b id="open-differences">1</b>`, `<tr data-kind="canceled_unbooked" data-ref="ab12" class="open">`,
		`<script src="static/dashboard.js"></script>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(page, "<b>x") {
		t.Error("an account name was not escaped")
	}
	code, body := fetch(t, ts.URL+"/dashboard.json", "")
	var j struct {
		Snapshot Snapshot
		Sections map[string]string
	}
	if err := json.Unmarshal([]byte(body), &j); code != 200 || err != nil {
		t.Fatalf("dashboard.json: %d %v %s", code, err, body)
	}
	if j.Snapshot.Tools[0].Revenue != 42_000 || len(j.Sections) != len(sections) || !strings.Contains(j.Sections["revenue"], `42.000`) {
		t.Fatalf("dashboard.json: %+v", j)
	}
	for _, id := range sections {
		if !strings.Contains(page, `<section id="`+id+`">`+j.Sections[id]+`</section>`) {
			t.Errorf("section %s of the JSON is not the page's", id)
		}
	}
	if code, body := fetch(t, ts.URL+"/calls/7", ""); code != 200 || !strings.Contains(body, "entry 9 · settlement") ||
		!strings.Contains(body, `<tr><td>income:tools:tools:sha256</td><td class="num">-21.000</td></tr>`) {
		t.Fatalf("call 7: %d %s", code, body)
	}
	for _, p := range []string{"/calls/8", "/calls/x", "/calls/-1"} {
		if code, _ := fetch(t, ts.URL+p, ""); code != 404 {
			t.Errorf("%s: %d, want 404", p, code)
		}
	}
	for _, p := range []string{"/static/dashboard.js", "/static/dashboard.css"} {
		if code, _ := fetch(t, ts.URL+p, ""); code != 200 {
			t.Errorf("%s: %d", p, code)
		}
	}
}

// Behind a token, every part of the dashboard needs it; a failed read is
// a 500 that shows no detail.
func TestDashboardAuthAndErrors(t *testing.T) {
	const token = "0123456789abcdef0123"
	books := sampleBooks()
	ts := dashboardServer(t, books, token)
	for _, p := range []string{"/", "/dashboard.json", "/calls/7", "/static/dashboard.js"} {
		if code, _ := fetch(t, ts.URL+p, ""); code != 401 {
			t.Errorf("%s without the token: %d", p, code)
		}
		if code, _ := fetch(t, ts.URL+p, token); code != 200 {
			t.Errorf("%s with the token: %d", p, code)
		}
	}
	books.err = errors.New("disk on fire at /secret/path")
	for _, p := range []string{"/", "/dashboard.json"} {
		if code, body := fetch(t, ts.URL+p, token); code != 500 || strings.Contains(body, "secret") {
			t.Errorf("%s when the books cannot be read: %d %s", p, code, body)
		}
	}
}

// The chart spans ChartDays days up to today: income stacks up from the
// zero line, net refunds go below it.
func TestChartLayout(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	c := chart(now, []DayRevenue{{Day: "2026-11-24", Account: "a", Revenue: 3_000}, {Day: "2026-11-24", Account: "b", Revenue: 1_000},
		{Day: "2026-11-23", Account: "a", Revenue: -2_000}, {Day: "2026-10-01", Account: "a", Revenue: 99_000}})
	if len(c.Days) != ChartDays || c.Days[ChartDays-1].Day != "2026-11-24" || c.Days[0].Day != "2026-10-26" {
		t.Fatalf("days %v .. %v", c.Days[0].Day, c.Days[len(c.Days)-1].Day)
	}
	today, yesterday := c.Days[ChartDays-1], c.Days[ChartDays-2]
	if c.Top != 4_000 || today.Total != 4_000 || len(today.Bars) != 2 || yesterday.Total != -2_000 {
		t.Fatalf("chart %+v", c)
	}
	a, b, r := today.Bars[0], today.Bars[1], yesterday.Bars[0]
	near := func(x, y int) bool { return x-y <= 2 && y-x <= 2 } // heights are rounded to pixels
	if a.Y+a.H != c.ZeroY || b.Y+b.H != a.Y || !near(a.H, 3*b.H) || r.Y != c.ZeroY || !near(r.H, 2*b.H) || a.Color == b.Color || b.Y < 8 {
		t.Fatalf("bars: a %+v b %+v refund %+v zero %d", a, b, r, c.ZeroY)
	}
}
