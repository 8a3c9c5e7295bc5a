package mcpfront

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/rpcerr"
)

// verifyLedger fails t unless `ledger verify` passes on w's ledger.
func verifyLedger(t *testing.T, w *l402World) {
	t.Helper()
	r, err := w.led.Verify(context.Background())
	if err != nil || !r.OK() {
		var b strings.Builder
		if r != nil {
			r.WriteTo(&b)
		}
		t.Fatalf("ledger verify: %v\n%s", err, b.String())
	}
}

// parked is how many asks wait for a retry, and for how many sources.
func parked(s *Server) (n, by int) {
	s.elicitMu.Lock()
	defer s.elicitMu.Unlock()
	return len(s.elicits), len(s.elicitBy)
}

// TestURLElicitationPaysMRTR: an mcp-go client on protocol 2026-07-28
// that declared URL-mode elicitation calls a priced tool: the first round
// answers input_required with an elicitation/create (mode url) of the
// call's pay page (the client's handler sees it: there are no
// server-initiated requests on this protocol), the client retries with
// "accept", and the retry answers with the result once the page's
// invoice is paid (half a second after the handler answered): the tool
// ran once and the ledger verifies. Declining ends the call unpaid and
// runs nothing; a client that declared only form mode keeps the
// explicit-gating result.
func TestURLElicitationPaysMRTR(t *testing.T) {
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
			h := &payByPage{w: w, decline: tc.decline, after: 500 * time.Millisecond}
			c := client.NewClient(tr, client.WithClientCapabilities(mcp.ClientCapabilities{Elicitation: tc.caps}),
				client.WithElicitationHandler(h))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
				t.Fatal(err)
			}
			if !mcp.IsModernProtocol(c.ProtocolVersion()) {
				t.Fatalf("protocol %s", c.ProtocolVersion())
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
			urls, ref := h.urls, h.ref
			h.mu.Unlock()
			if elicited := len(urls) == 1 && strings.HasPrefix(urls[0], "url http://") && strings.Contains(urls[0], "/pay/cvv_"); elicited != tc.elicited {
				t.Fatalf("elicitations %q", urls)
			}
			if tc.runs == 1 && w.be.preimage(ref) == "" {
				t.Fatal("answered before the invoice was paid")
			}
			if n := w.runs(); n != tc.runs {
				t.Fatalf("ran %d times", n)
			}
			if n, by := parked(w.front); n != 0 || by != 0 {
				t.Fatalf("%d asks parked for %d sources", n, by)
			}
			verifyLedger(t, w)
		})
	}
}

// payPost sends one protocol 2026-07-28 tools/call declaring URL-mode
// elicitation and returns its JSON-RPC response (the last SSE event).
func payPost(t *testing.T, url, tool, params string, header ...string) map[string]any {
	t.Helper()
	_, body := modernRaw(t, url, tool, `{"elicitation":{"url":{}}}`, params, header...)
	b := []byte(body)
	if strings.Contains(body, "data: ") {
		lines := strings.Split(strings.TrimSpace(body), "\n")
		b = []byte(strings.TrimPrefix(lines[len(lines)-1], "data: "))
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("response %s: %v", body, err)
	}
	return out
}

func payAnswer(state, action string) string {
	return `,"requestState":"` + state + `","inputResponses":{"` + elicitKey + `":{"action":"` + action + `"}}`
}

// TestURLElicitationStateMRTR: the requestState of a pay page ask
// continues only its own call, for its own client: a retry with other
// arguments or another tool (-32600), from another source or as another
// client (-32602, even to decline) runs nothing, releases nothing and
// leaves the call waiting; the right retry waits for the payment and gets
// the result; replayed, the state is unknown (-32602) and nothing runs
// again.
func TestURLElicitationStateMRTR(t *testing.T) {
	w, _ := newPayWorld(t, Config{ClientID: func(r *http.Request) string { return r.Header.Get("X-Client") },
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	alice := []string{"X-Forwarded-For", "198.51.100.1"}
	first := payPost(t, w.url, "ex_dear", `,"arguments":{"text":"a"}`, alice...)
	st := state(t, first)
	res := first["result"].(map[string]any)
	ir, _ := res["inputRequests"].(map[string]any)[elicitKey].(map[string]any)
	p, _ := ir["params"].(map[string]any)
	url, _ := p["url"].(string)
	if ir["method"] != "elicitation/create" || p["mode"] != "url" || !strings.Contains(url, "/pay/cvv_") || p["elicitationId"] == "" {
		t.Fatalf("input request %v", ir)
	}
	if strings.Contains(st, "cvv_") || strings.Contains(url, st) {
		t.Fatal("the requestState is in the page URL")
	}
	for _, tc := range []struct {
		name, tool, params string
		header             []string
		code               float64
	}{
		{"other arguments", "ex_dear", `,"arguments":{"text":"b"}` + payAnswer(st, "accept"), alice, rpcerr.CodeInvalidRequest},
		{"other tool", "ex_cheap", `,"arguments":{"text":"a"}` + payAnswer(st, "accept"), alice, rpcerr.CodeInvalidRequest},
		{"other source", "ex_dear", `,"arguments":{"text":"a"}` + payAnswer(st, "accept"), []string{"X-Forwarded-For", "198.51.100.2"}, rpcerr.CodeInvalidParams},
		{"other source declines", "ex_dear", `,"arguments":{"text":"a"}` + payAnswer(st, "decline"), []string{"X-Forwarded-For", "198.51.100.2"}, rpcerr.CodeInvalidParams},
		{"other client", "ex_dear", `,"arguments":{"text":"a"}` + payAnswer(st, "accept"), append([]string{"X-Client", "mallory"}, alice...), rpcerr.CodeInvalidParams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, msg := errCode(payPost(t, w.url, tc.tool, tc.params, tc.header...)); code != tc.code {
				t.Errorf("%v %q, want %v", code, msg, tc.code)
			}
			if n, _ := parked(w.front); n != 1 || w.runs() != 0 {
				t.Fatalf("%d parked, %d runs", n, w.runs())
			}
		})
	}
	// The right retry waits for the payment.
	got := make(chan map[string]any, 1)
	go func() {
		got <- payPost(t, w.url, "ex_dear", `,"arguments":{"text":"a"}`+payAnswer(st, "accept"), alice...)
	}()
	select {
	case m := <-got:
		t.Fatalf("answered before the payment: %v", m)
	case <-time.After(300 * time.Millisecond):
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	var page strings.Builder
	_, _ = io.Copy(&page, resp.Body)
	resp.Body.Close()
	_, rest, _ := strings.Cut(page.String(), `<code id="invoice">`)
	inv, _, _ := strings.Cut(rest, "</code>")
	w.be.pay(strings.TrimPrefix(inv, bolt11Prefix))
	final := <-got
	if b, _ := json.Marshal(final); !strings.Contains(string(b), "ran dear") || w.runs() != 1 {
		t.Fatalf("final %s, %d runs", b, w.runs())
	}
	if code, _ := errCode(payPost(t, w.url, "ex_dear", `,"arguments":{"text":"a"}`+payAnswer(st, "accept"), alice...)); code != rpcerr.CodeInvalidParams {
		t.Errorf("replayed state: code %v", code)
	}
	if n, by := parked(w.front); n != 0 || by != 0 || w.runs() != 1 {
		t.Fatalf("%d asks parked for %d sources, %d runs", n, by, w.runs())
	}
	verifyLedger(t, w)
}

// TestURLElicitationExpiresMRTR: a pay page ask never retried expires
// with its invoice: its slot is freed, the call ends unpaid (nothing
// runs), and a late retry finds no state.
func TestURLElicitationExpiresMRTR(t *testing.T) {
	w, _ := newPayWorldTTL(t, Config{}, 2*time.Second)
	st := state(t, payPost(t, w.url, "ex_dear", `,"arguments":{"text":"a"}`))
	deadline := time.Now().Add(waitLimit)
	for {
		if n, by := parked(w.front); n == 0 && by == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pay page ask did not expire")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := errCode(payPost(t, w.url, "ex_dear", `,"arguments":{"text":"a"}`+payAnswer(st, "accept"))); code != rpcerr.CodeInvalidParams {
		t.Errorf("late retry: code %v", code)
	}
	if n := w.runs(); n != 0 {
		t.Fatalf("ran %d times", n)
	}
	verifyLedger(t, w)
}
