package mcpfront

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// newPayWorld is l402World with the pay page mounted beside /mcp and
// Config.PayBaseURL pointing at it.
func newPayWorld(t *testing.T, cfg Config) (*l402World, string) {
	t.Helper()
	return newPayWorldTTL(t, cfg, time.Hour)
}

// newPayWorldTTL is newPayWorld whose invoices stay payable for ttl.
func newPayWorldTTL(t *testing.T, cfg Config, ttl time.Duration) (*l402World, string) {
	t.Helper()
	led, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	book, err := pricing.NewBook(map[string]map[string]pricing.Rule{"ex": fuzzPrices})
	if err != nil {
		t.Fatal(err)
	}
	w := &l402World{t: t, led: led, tools: &recordingTools{},
		be: &honestBackend{led: led, ready: make(chan struct{}), preimages: map[string]string{}, paid: map[string]bool{}}}
	v, err := vend.New(vend.Config{Ledger: led, Backends: []vend.PaymentBackend{w.be}, Tools: w.tools, Prices: book, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done; led.Close() })
	<-w.be.ready
	mux := http.NewServeMux()
	ts := httptest.NewUnstartedServer(mux)
	base := "http://" + ts.Listener.Addr().String()
	cfg.Vendor, cfg.PayBaseURL = v, base
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	front, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.front = front
	mux.Handle("/mcp", front.Handler())
	mux.Handle(PayPagePath, front.PayPage())
	ts.Start()
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	w.url = base + "/mcp"
	return w, base
}

// gatedAnswer is what an explicit-gating answer carries: its text and
// its structuredContent's pay page, invoice and payment token.
type gatedAnswer struct {
	Text    string `json:"-"`
	PayURL  string `json:"pay_url"`
	Invoice string `json:"invoice"`
	Token   string `json:"capvend_payment"`
}

// gatedCall calls ex_dear in session sid, unpaid, and returns its
// explicit-gating answer and the response body.
func gatedCall(t *testing.T, w *l402World, sid string) (gatedAnswer, string) {
	t.Helper()
	_, body := w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`))
	var res struct {
		Result struct {
			Content           []struct{ Text string } `json:"content"`
			StructuredContent gatedAnswer             `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(firstJSON(body)), &res); err != nil || len(res.Result.Content) == 0 {
		t.Fatalf("answer %s: %v", body, err)
	}
	a := res.Result.StructuredContent
	a.Text = res.Result.Content[0].Text
	return a, body
}

// getPage GETs url and returns the response and its body.
func getPage(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestPayPage: an explicit-gating answer links its call's pay page
// (pay_url, and in the text); the page shows the tool, the amount, the
// invoice (text, lightning: link, QR code) and its status, and never the
// payment token; its events say "open", then "paid" once the invoice is
// paid, and the page then says so. A forged token, or the payment token
// in its place, is 404: the page token is the only key, and it releases
// nothing (the call is still the payment token's).
func TestPayPage(t *testing.T) {
	w, base := newPayWorld(t, Config{})
	sid := newRawSession(t, w.url).sid
	sc, body := gatedCall(t, w, sid)
	if !strings.HasPrefix(sc.PayURL, base+"/pay/cvv_") || !strings.Contains(sc.Text, sc.PayURL) || sc.Token == "" ||
		strings.Contains(sc.PayURL, sc.Token) {
		t.Fatalf("answer: %s", body)
	}
	resp, page := getPage(t, sc.PayURL)
	if resp.StatusCode != 200 || !strings.Contains(page, "ex_dear") || !strings.Contains(page, "21 sats") ||
		!strings.Contains(page, `<code id="invoice">`+sc.Invoice+`</code>`) || !strings.Contains(page, `href="lightning:`+sc.Invoice+`"`) ||
		!strings.Contains(page, `<svg id="qr"`) || !strings.Contains(page, `http-equiv="refresh"`) ||
		!strings.Contains(page, "waiting for payment") || strings.Contains(page, sc.Token) ||
		resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Referrer-Policy") != "no-referrer" ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'nonce-") {
		t.Fatalf("page: %d %v\n%s", resp.StatusCode, resp.Header, page)
	}
	for _, bad := range []string{base + "/pay/" + sc.Token, sc.PayURL + "x", base + "/pay/cvv_AAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		if resp, _ := getPage(t, bad); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s: %d", bad, resp.StatusCode)
		}
	}

	// The events: open, then paid.
	ev, err := http.Get(sc.PayURL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Body.Close()
	lines := bufio.NewScanner(ev.Body)
	next := func() string {
		for lines.Scan() {
			if d, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
				return d
			}
		}
		return "(ended: " + lines.Text() + ")"
	}
	if st := next(); st != "open" || ev.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("first status %q", st)
	}
	w.be.pay(strings.TrimPrefix(sc.Invoice, bolt11Prefix))
	if st := next(); st != "paid" {
		t.Fatalf("status after paying %q", st)
	}
	_, page = getPage(t, sc.PayURL)
	if !strings.Contains(page, "paid: go back to your chat") || strings.Contains(page, `http-equiv="refresh"`) {
		t.Fatalf("paid page:\n%s", page)
	}
	if n := w.runs(); n != 0 {
		t.Fatalf("the page ran the call (%d)", n)
	}
	// The payment token still releases it, once.
	_, body = w.post(sid, call(`2`, "ex_dear", `,"arguments":{"text":"a","capvend_payment":"`+sc.Token+`"}`))
	if !strings.Contains(body, "ran dear") || w.runs() != 1 {
		t.Fatalf("the paid repeat: %s", body)
	}
}

// payByPage is an elicitation handler that acts as a person on the pay
// page: it opens the URL, reads the invoice and has the backend pay it,
// or declines.
type payByPage struct {
	w       *l402World
	decline bool
	after   time.Duration // how long after answering it pays
	mu      sync.Mutex
	urls    []string
	ref     string // the invoice's payment ref
}

func (p *payByPage) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	p.mu.Lock()
	p.urls = append(p.urls, req.Params.Mode+" "+req.Params.URL)
	p.mu.Unlock()
	if p.decline {
		return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionDecline}}, nil
	}
	resp, err := http.Get(req.Params.URL)
	if err != nil {
		return nil, err
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, rest, _ := strings.Cut(string(page), `<code id="invoice">`)
	inv, _, _ := strings.Cut(rest, "</code>")
	ref := strings.TrimPrefix(inv, bolt11Prefix)
	p.mu.Lock()
	p.ref = ref
	p.mu.Unlock()
	go func() { // paid a moment after the page opened
		time.Sleep(p.after)
		p.w.be.pay(ref)
	}()
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept}}, nil
}

// TestURLElicitationPays: an mcp-go client on protocol 2025-11-25 that
// declared URL-mode elicitation calls a priced tool once: it is sent
// elicitation/create (mode url) with the call's pay page, and when the
// page's invoice is paid the same request answers with the result. One
// that declines gets an error and nothing runs. A client that declared
// only form-mode elicitation keeps the explicit-gating result.
func TestURLElicitationPays(t *testing.T) {
	for _, tc := range []struct {
		name     string
		caps     *mcp.ElicitationCapability
		decline  bool
		want     string
		runs     int
		elicited bool
	}{
		{"accept and pay", &mcp.ElicitationCapability{URL: &struct{}{}}, false, "ran dear", 1, true},
		{"decline", &mcp.ElicitationCapability{URL: &struct{}{}}, true, "", 0, true},
		{"form mode only", &mcp.ElicitationCapability{Form: &struct{}{}}, false, "payment_required", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := newPayWorld(t, Config{})
			tr, err := transport.NewStreamableHTTP(w.url)
			if err != nil {
				t.Fatal(err)
			}
			h := &payByPage{w: w, decline: tc.decline}
			c := client.NewClient(tr, client.WithProtocolVersion(mcp.ProtocolVersion20251125),
				client.WithClientCapabilities(mcp.ClientCapabilities{Elicitation: tc.caps}), client.WithElicitationHandler(h))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
				t.Fatal(err)
			}
			req := mcp.CallToolRequest{}
			req.Params.Name, req.Params.Arguments = "ex_dear", map[string]any{"text": "a"}
			res, err := c.CallTool(ctx, req)
			got := ""
			if res != nil {
				b, _ := json.Marshal(res)
				got = string(b)
			}
			if tc.want == "" && err == nil || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("answer %s, %v", got, err)
			}
			h.mu.Lock()
			urls := h.urls
			h.mu.Unlock()
			if elicited := len(urls) == 1 && strings.HasPrefix(urls[0], "url http://") && strings.Contains(urls[0], "/pay/cvv_"); elicited != tc.elicited {
				t.Fatalf("elicitations %q", urls)
			}
			if n := w.runs(); n != tc.runs {
				t.Fatalf("ran %d times", n)
			}
		})
	}
}

// TestPayPageOfACanceledCall: the page of a call the operator's restore
// canceled says so and shows no invoice to pay (its events say
// "canceled"); paid all the same (the invoice was still payable), it
// says the payment is owed back, not "go back to your chat", and nothing
// runs.
func TestPayPageOfACanceledCall(t *testing.T) {
	w, _ := newPayWorld(t, Config{})
	sid := newRawSession(t, w.url).sid
	sc, _ := gatedCall(t, w, sid)
	if _, err := w.led.SettleRestored(context.Background(), "the ledger was restored from file:///srv/replica"); err != nil {
		t.Fatal(err)
	}
	get := func(url string) string {
		t.Helper()
		resp, page := getPage(t, url)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", url, resp.StatusCode)
		}
		return page
	}
	page := get(sc.PayURL)
	if !strings.Contains(page, `<p id="status" class="canceled">this call was canceled: do not pay`) || strings.Contains(page, `<svg id="qr"`) ||
		strings.Contains(page, `<code id="invoice">`) || strings.Contains(page, "/srv/replica") {
		t.Fatalf("page of the canceled call:\n%s", page)
	}
	if ev := get(sc.PayURL + "/events"); !strings.Contains(ev, "data: canceled\n") {
		t.Fatalf("events: %q", ev)
	}
	w.be.pay(strings.TrimPrefix(sc.Invoice, bolt11Prefix))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		page = get(sc.PayURL)
		if strings.Contains(page, "owed back") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("page of the canceled call, paid:\n%s", page)
		}
	}
	if !strings.Contains(page, `<p id="status" class="owed">paid, but this call was canceled`) ||
		!strings.Contains(get(sc.PayURL+"/events"), "data: owed\n") {
		t.Fatalf("page of the canceled call, paid:\n%s", page)
	}
	if n := w.runs(); n != 0 {
		t.Fatalf("ran %d times", n)
	}
}
