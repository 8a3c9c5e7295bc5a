package admin

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/capvend/capvend/vend"
)

// DashboardSource is what the dashboard reads (cmd wires the ledger).
// Both methods are read only and bounded: their cost does not grow with
// the ledger.
type DashboardSource interface {
	// Snapshot reads what the dashboard shows, from one consistent
	// snapshot of the books.
	Snapshot(ctx context.Context) (*Snapshot, error)
	// CallHistory reads one call's history; an error matching
	// vend.ErrNotFound if there is no such call.
	CallHistory(ctx context.Context, id vend.CallID) (*CallHistory, error)
}

// Snapshot is the books as the dashboard shows them.
type Snapshot struct {
	Now time.Time
	// Tools is the net revenue (settlements less refunds) of each income
	// account, ever: what `capvend ledger balance` prints.
	Tools []Revenue
	// Days is the net revenue per income account on the recent days
	// (UTC) that had any, oldest first.
	Days    []DayRevenue
	Pending Pending
	// Open are the newest open payment requests, Held the hold invoices
	// locked in, Owed the refunds owed, newest first (bounded lists;
	// Pending has the totals).
	Open, Held []vend.Payment
	Owed       []vend.Refund
	// Calls are the newest calls, newest first.
	Calls []CallRow
	// Reconcile are the newest reconciliation runs, newest first.
	Reconcile []ReconcileRun
}

// Revenue is one income account's net revenue.
type Revenue struct {
	Account string
	Calls   int // settlements booked to it
	Revenue vend.Msat
}

// DayRevenue is one income account's net revenue on one UTC day.
type DayRevenue struct {
	Day     string // YYYY-MM-DD
	Account string
	Revenue vend.Msat
}

// Pending is money on its way: asked for and not in yet, locked in hold
// invoices, or owed back.
type Pending struct {
	OpenPayments  int
	OpenAmount    vend.Msat
	HeldPayments  int
	HeldAmount    vend.Msat
	AwaitingCalls int
	RefundsOwed   int
	OwedAmount    vend.Msat
}

// CallRow is one call in the list of the newest.
type CallRow struct {
	vend.Call
	Backend  vend.Backend // of its newest payment request; "" if none
	Duration time.Duration
}

// ReconcileRun is one reconciliation run and (a bounded list of) its
// differences.
type ReconcileRun struct {
	ID               int64
	Started          time.Time
	Finished         time.Time // zero while it runs
	Repaired         int
	Error            string
	Differences      []Difference
	DifferencesCount int
}

// Difference is one disagreement reconciliation found between a payment
// backend and the books.
type Difference struct {
	ID, Run                 int64
	Kind, Backend, Ref      string
	CallID                  vend.CallID
	MintURL, Ledger, Remote string
	Detail                  string
	Repair                  string // "" if left to the operator
	Found                   time.Time
}

// CallHistory is everything the books hold about one call.
type CallHistory struct {
	Call        vend.Call
	Payments    []vend.Payment
	Executions  []Execution
	Result      *Result // nil if no answer is stored
	Refund      *vend.Refund
	Entries     []Entry
	Differences []Difference
}

// Execution is one start of a call's execution upstream.
type Execution struct {
	Seq          int
	Server, Tool string
	Started      time.Time
	Backfilled   bool
}

// Result is a stored answer's outcome.
type Result struct {
	IsError bool
	Stored  time.Time
	Bytes   int
}

// Entry is one journal entry and its postings.
type Entry struct {
	ID          int64
	Time        time.Time
	Kind        string
	Description string
	Sealed      bool
	Postings    []Posting
}

// Posting is one line of an entry: debits positive, credits negative.
type Posting struct {
	Account string
	Amount  vend.Msat
}

//go:embed dashboard
var dashboardFiles embed.FS

// RefreshEvery is how often the dashboard page polls for fresh data.
const RefreshEvery = 5 * time.Second

// Dashboard is the operator's dashboard: a server-rendered page at /,
// each call's history at /calls/{id}, the same data as JSON at
// /dashboard.json (which the page polls to refresh itself), and its
// script and style under /static/. It shows the revenue, what is pending,
// the newest calls, the refunds owed, the health of the upstreams and
// relays (the readiness checks and gauges of the admin listener) and the
// last reconciliations.
type Dashboard struct {
	src     DashboardSource
	srv     *Server
	metrics *Metrics // its gauges' sources; nil: none shown
	tmpl    *template.Template
}

// NewDashboard makes the dashboard of src and routes it on srv (whose
// readiness checks it shows, with the gauges of m if not nil).
func NewDashboard(srv *Server, m *Metrics, src DashboardSource) (*Dashboard, error) {
	t, err := template.New("").Funcs(templateFuncs).ParseFS(dashboardFiles, "dashboard/*.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard templates: %w", err)
	}
	d := &Dashboard{src: src, srv: srv, metrics: m, tmpl: t}
	static, _ := fs.Sub(dashboardFiles, "dashboard/static")
	srv.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	srv.Handle("GET /{$}", http.HandlerFunc(d.page))
	srv.Handle("GET /dashboard.json", http.HandlerFunc(d.serveJSON))
	srv.Handle("GET /calls/{id}", http.HandlerFunc(d.call))
	return d, nil
}

// view is what the page's templates render.
type view struct {
	*Snapshot
	Health  Health
	Chart   Chart
	Refresh int // ms
}

// Health is the state of capvend's parts: the admin listener's readiness
// checks and gauges.
type Health struct {
	Checks    []CheckResult
	Upstreams int // connected (listed their tools)
	Relays    int // Nostr relays connected
	InFlight  int64
	Sessions  map[string]int
	HasGauges bool
}

// CheckResult is one readiness check's outcome.
type CheckResult struct {
	Name string
	OK   bool
	Why  string // why not ready; when ready, the check's Info, if any
}

func (d *Dashboard) view(ctx context.Context) (*view, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := d.src.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return &view{Snapshot: s, Health: d.health(ctx), Chart: chart(s.Now, s.Days), Refresh: int(RefreshEvery / time.Millisecond)}, nil
}

// health runs the readiness checks and reads the gauges.
func (d *Dashboard) health(ctx context.Context) Health {
	h := Health{Checks: d.srv.runChecks(ctx)}
	if d.metrics == nil {
		return h
	}
	src := d.metrics.sources()
	h.HasGauges = true
	if src.Upstreams != nil {
		h.Upstreams = src.Upstreams()
	}
	if src.Relays != nil {
		h.Relays = src.Relays()
	}
	if src.InFlight != nil {
		h.InFlight = src.InFlight()
	}
	if src.Sessions != nil {
		h.Sessions = src.Sessions()
	}
	return h
}

func (d *Dashboard) fail(w http.ResponseWriter, what string, err error) {
	d.srv.log.Error("dashboard: "+what, "err", err)
	http.Error(w, "the dashboard could not read the books (see capvend's log)", http.StatusInternalServerError)
}

// page serves the dashboard page.
func (d *Dashboard) page(w http.ResponseWriter, r *http.Request) {
	v, err := d.view(r.Context())
	if err != nil {
		d.fail(w, "read", err)
		return
	}
	d.render(w, "page.html", v)
}

func (d *Dashboard) render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := d.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		d.fail(w, "render "+name, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:")
	w.Write(b.Bytes())
}

// sections are the page's parts the script replaces at each refresh, by
// element id: each is a template of the same name.
var sections = []string{"summary", "revenue", "pending", "calls", "refunds", "health", "reconcile"}

// dashboardJSON is /dashboard.json: the snapshot's data, and each section
// of the page rendered (the script swaps them in).
type dashboardJSON struct {
	Snapshot *Snapshot         `json:"snapshot"`
	Health   Health            `json:"health"`
	Sections map[string]string `json:"sections"`
}

// serveJSON serves /dashboard.json.
func (d *Dashboard) serveJSON(w http.ResponseWriter, r *http.Request) {
	v, err := d.view(r.Context())
	if err != nil {
		d.fail(w, "read", err)
		return
	}
	out := dashboardJSON{Snapshot: v.Snapshot, Health: v.Health, Sections: make(map[string]string, len(sections))}
	var b bytes.Buffer
	for _, s := range sections {
		b.Reset()
		if err := d.tmpl.ExecuteTemplate(&b, s, v); err != nil {
			d.fail(w, "render "+s, err)
			return
		}
		out.Sections[s] = b.String()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(out) // an error here is the client gone
}

// call serves a call's history page.
func (d *Dashboard) call(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "no such call", http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	h, err := d.src.CallHistory(ctx, vend.CallID(id))
	if errors.Is(err, vend.ErrNotFound) {
		http.Error(w, "no such call", http.StatusNotFound)
		return
	}
	if err != nil {
		d.fail(w, "call history", err)
		return
	}
	d.render(w, "call.html", h)
}
