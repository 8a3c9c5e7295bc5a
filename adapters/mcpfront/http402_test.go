package mcpfront

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// l402World is the HTTP front over a real Vendor and ledger, with the
// honest backend of the fuzz tests.
type l402World struct {
	t     *testing.T
	led   *ledger.Ledger
	be    *honestBackend
	tools *recordingTools
	url   string
	front *Server // newPayWorld's
}

func newL402World(t *testing.T, cfg Config) *l402World {
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
	v, err := vend.New(vend.Config{Ledger: led, Backends: []vend.PaymentBackend{w.be}, Tools: w.tools, Prices: book, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done; led.Close() })
	<-w.be.ready
	cfg.Vendor = v
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	front, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.url = startHTTP(t, front)
	return w
}

// post sends a tools/call of a fresh session of protocol 2025-11-25 (what
// the MCP TypeScript SDK speaks) with the extra headers hdr (name,
// value pairs), and returns the response and its body.
func (w *l402World) post(sid, body string, hdr ...string) (*http.Response, string) {
	w.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, w.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var challengeRE = regexp.MustCompile(`^L402 macaroon="([^"]+)", invoice="([^"]+)"$`)

// pay402 checks a 402 answer, pays its invoice and returns the macaroon
// (base64, as sent) and the preimage the payer learnt.
func (w *l402World) pay402(resp *http.Response, body, id string) (mac, preimage string) {
	w.t.Helper()
	if resp.StatusCode != http.StatusPaymentRequired {
		w.t.Fatalf("status %d, want 402: %s", resp.StatusCode, body)
	}
	chs := resp.Header.Values("WWW-Authenticate")
	if len(chs) != 3 || !strings.HasPrefix(chs[1], "L402 token=") || !strings.HasPrefix(chs[2], "LSAT macaroon=") {
		w.t.Fatalf("challenges %q", chs)
	}
	m := challengeRE.FindStringSubmatch(chs[0])
	if m == nil {
		w.t.Fatalf("challenge %q", chs[0])
	}
	var rpc struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Code int `json:"code"`
			Data struct {
				Invoice    string `json:"invoice"`
				AmountMsat int64  `json:"amount_msat"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &rpc); err != nil || string(rpc.ID) != id || rpc.Error.Code != CodePaymentRequired402 ||
		rpc.Error.Data.Invoice != m[2] {
		w.t.Fatalf("402 body %s (%v)", body, err)
	}
	ref := strings.TrimPrefix(m[2], bolt11Prefix)
	w.be.pay(ref)
	return m[1], w.be.preimage(ref)
}

func (w *l402World) runs() int {
	w.tools.mu.Lock()
	defer w.tools.mu.Unlock()
	return len(w.tools.runs)
}

const acceptL402 = "application/json, text/event-stream, application/vnd.l402"

// TestHTTP402L402: an unpaid priced call whose Accept names L402 gets
// HTTP 402 with the L402 challenges (macaroon=, token=, LSAT) and a
// JSON-RPC 402 error body; the retry with Authorization: L402
// <macaroon>:<preimage> runs the call once, the LSAT form too; every
// refused credential is 401 and runs nothing; a replay is 401. Without
// the Accept, nothing changes (the explicit-gating tool result, 200).
func TestHTTP402L402(t *testing.T) {
	w := newL402World(t, Config{})
	sid := newRawSession(t, w.url).sid

	resp, body := w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("WWW-Authenticate") != "" || !strings.Contains(body, `"isError":true`) {
		t.Fatalf("without L402 in Accept: %d %q %s", resp.StatusCode, resp.Header.Values("WWW-Authenticate"), body)
	}

	resp, body = w.post(sid, call(`2`, "ex_dear", `,"arguments":{"text":"a"}`), "Accept", acceptL402)
	mac, pre := w.pay402(resp, body, `2`)

	// Refusals: each 401, nothing runs.
	_, bodyB := w.post(sid, call(`3`, "ex_dear", `,"arguments":{"text":"b"}`), "Accept", acceptL402)
	wrongPre := strings.Repeat("ab", 32)
	for _, tc := range []struct{ name, args, auth, want string }{
		{"malformed", `{"text":"a"}`, "L402 " + mac, "malformed L402 credential"},
		{"not base64", `{"text":"a"}`, "L402 !!!:" + pre, "malformed L402 credential"},
		{"wrong preimage", `{"text":"a"}`, "L402 " + mac + ":" + wrongPre, "not the invoice's"},
		{"other arguments", `{"text":"b"}`, "L402 " + mac + ":" + pre, "another call"},
		{"not a macaroon", `{"text":"a"}`, "L402 " + base64.StdEncoding.EncodeToString([]byte("nope")) + ":" + pre, "not a macaroon"},
	} {
		resp, body := w.post(sid, call(`4`, "ex_dear", `,"arguments":`+tc.args), "Authorization", tc.auth)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, tc.want) || resp.Header.Get("WWW-Authenticate") != "" {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
	}
	if n := w.runs(); n != 0 {
		t.Fatalf("refused credentials ran %d calls (402 for b: %s)", n, bodyB)
	}

	resp, body = w.post(sid, call(`2`, "ex_dear", `,"arguments":{"text":"a"}`), "Authorization", "L402 "+mac+":"+pre)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `ran dear`) {
		t.Fatalf("paid retry: %d %s", resp.StatusCode, body)
	}
	resp, body = w.post(sid, call(`2`, "ex_dear", `,"arguments":{"text":"a"}`), "Authorization", "L402 "+mac+":"+pre)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "already used") {
		t.Fatalf("replay: %d %s", resp.StatusCode, body)
	}
	if n := w.runs(); n != 1 {
		t.Fatalf("ran %d times", n)
	}

	// The legacy LSAT scheme, in a session that did not say Accept: a
	// credential asks for L402 answers by itself.
	resp, body = w.post(sid, call(`5`, "ex_cheap", `,"arguments":{"text":"c"}`), "Accept", acceptL402)
	mac, pre = w.pay402(resp, body, `5`)
	resp, body = w.post(newRawSession(t, w.url).sid, call(`9`, "ex_cheap", `,"arguments":{"text":"c"}`), "Authorization", "LSAT "+mac+":"+pre)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `ran cheap`) {
		t.Fatalf("LSAT retry: %d %s", resp.StatusCode, body)
	}
	if n := w.runs(); n != 2 {
		t.Fatalf("ran %d times", n)
	}
}

// TestHTTP402Config: with HTTP402 (payments.http_402) an unpaid priced
// call gets 402 whatever its Accept says; a free call is untouched.
func TestHTTP402Config(t *testing.T) {
	w := newL402World(t, Config{HTTP402: true})
	sid := newRawSession(t, w.url).sid
	resp, body := w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`))
	mac, pre := w.pay402(resp, body, `1`)
	resp, body = w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`), "Authorization", "L402 "+mac+":"+pre)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `ran dear`) {
		t.Fatalf("paid retry: %d %s", resp.StatusCode, body)
	}
	resp, body = w.post(sid, call(`2`, "ex_free", `,"arguments":{"text":"a"}`))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `ran free`) {
		t.Fatalf("free call: %d %s", resp.StatusCode, body)
	}
}

// TestDiscovery: GET /.well-known/capvend.json lists the tools offered
// with their prices in msat and sats, the payment methods, mints, the
// relay pubkey and L402 support; other methods are refused.
func TestDiscovery(t *testing.T) {
	led, _ := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "d.db"), ledger.Options{})
	t.Cleanup(func() { led.Close() })
	book, _ := pricing.NewBook(map[string]map[string]pricing.Rule{"ex": fuzzPrices})
	v, err := vend.New(vend.Config{Ledger: led, Backends: []vend.PaymentBackend{&honestBackend{led: led}}, Tools: &recordingTools{}, Prices: book, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Vendor: v, Name: "shop", HTTP402: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Discovery(DiscoveryInfo{MCPPath: "/mcp", PMIs: []string{vend.PMILightning}, Mints: []string{"http://127.0.0.1:3338"},
		RelayPubkey: strings.Repeat("ab", 32), Relays: []string{"ws://127.0.0.1:7777"}, L402: true})
	rec := httptestRecorder(h, http.MethodGet)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET: %d %s", rec.Code, rec.Body)
	}
	var doc struct {
		Name  string `json:"name"`
		MCP   string `json:"mcp"`
		Tools []struct {
			Name      string `json:"name"`
			PriceMsat int64  `json:"price_msat"`
			PriceSats int64  `json:"price_sats"`
		} `json:"tools"`
		Payments struct {
			PMIs  []string `json:"pmis"`
			Mints []string `json:"mints"`
			L402  struct {
				Supported, Always bool
			} `json:"l402"`
		} `json:"payments"`
		Nostr struct {
			Pubkey string `json:"pubkey"`
		} `json:"nostr"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for _, tl := range doc.Tools {
		got[tl.Name] = [2]int64{tl.PriceMsat, tl.PriceSats}
	}
	if doc.Name != "shop" || doc.MCP != "/mcp" || got["ex_dear"] != [2]int64{21000, 21} || got["ex_cheap"] != [2]int64{1000, 1} ||
		got["ex_free"] != [2]int64{0, 0} || len(doc.Payments.PMIs) != 1 || len(doc.Payments.Mints) != 1 ||
		!doc.Payments.L402.Supported || !doc.Payments.L402.Always || doc.Nostr.Pubkey != strings.Repeat("ab", 32) {
		t.Fatalf("document %s", rec.Body)
	}
	if rec := httptestRecorder(h, http.MethodPost); rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", rec.Code)
	}
}

func httptestRecorder(h http.Handler, method string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, DiscoveryPath, nil))
	return rec
}
