package mcpfront

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/capvend/capvend/vend"
)

// mppAuthParam reads one auth-param as lightning-tools' parseMppChallenge
// does: over the whole joined WWW-Authenticate.
var mppAuthParam = regexp.MustCompile(`(\w+)=("([^"]*)"|'([^']*)'|([^,\s]*))`)

// mppRetry builds the retry lightning-tools 9.0.1 sends for a 402 (its
// parseMppChallenge and buildMppCredential), after paying: the joined
// WWW-Authenticate must start with "Payment".
func (w *l402World) mppRetry(resp *http.Response) (auth, invoice string) {
	w.t.Helper()
	joined := strings.Join(resp.Header.Values("WWW-Authenticate"), ", ")
	if !strings.HasPrefix(strings.ToLower(joined), "payment") {
		w.t.Fatalf("WWW-Authenticate %q does not start with Payment", joined)
	}
	p := map[string]string{}
	for _, m := range mppAuthParam.FindAllStringSubmatch(joined[len("payment"):], -1) {
		p[m[1]] = m[3] + m[4] + m[5]
	}
	if p["method"] != "lightning" || p["intent"] != "charge" || p["id"] == "" || p["realm"] == "" || p["request"] == "" {
		w.t.Fatalf("challenge %q", joined)
	}
	rb, err := base64.RawURLEncoding.DecodeString(p["request"])
	var req struct {
		MethodDetails struct{ Invoice string } `json:"methodDetails"`
	}
	if err != nil || json.Unmarshal(rb, &req) != nil || req.MethodDetails.Invoice == "" {
		w.t.Fatalf("request %s", rb)
	}
	ref := strings.TrimPrefix(req.MethodDetails.Invoice, bolt11Prefix)
	w.be.pay(ref)
	echo := map[string]string{}
	for _, k := range []string{"id", "realm", "method", "intent", "request", "expires"} {
		if p[k] != "" {
			echo[k] = p[k]
		}
	}
	b, _ := json.Marshal(map[string]any{"challenge": echo, "payload": map[string]string{"preimage": w.be.preimage(ref)}})
	return "Payment " + base64.RawURLEncoding.EncodeToString(b), req.MethodDetails.Invoice
}

// x402Retry builds the PAYMENT-SIGNATURE lightning-tools 9.0.1 sends
// (buildX402PaymentSignature) for a 402's PAYMENT-REQUIRED, after paying.
func (w *l402World) x402Retry(resp *http.Response) (sig string, accepted map[string]any) {
	w.t.Helper()
	raw, err := base64.StdEncoding.DecodeString(resp.Header.Get(HeaderX402Required))
	var req struct {
		X402Version int              `json:"x402Version"`
		Accepts     []map[string]any `json:"accepts"`
	}
	if err != nil || json.Unmarshal(raw, &req) != nil || req.X402Version != 2 || len(req.Accepts) != 1 {
		w.t.Fatalf("PAYMENT-REQUIRED %s", raw)
	}
	a := req.Accepts[0]
	extra, _ := a["extra"].(map[string]any)
	inv, _ := extra["invoice"].(string)
	if extra["paymentMethod"] != "lightning" || a["scheme"] != "exact" || a["amount"] != "21000" || inv == "" {
		w.t.Fatalf("requirements %v", a)
	}
	w.be.pay(strings.TrimPrefix(inv, bolt11Prefix))
	b, _ := json.Marshal(map[string]any{"x402Version": 2, "scheme": a["scheme"], "network": a["network"],
		"payload": map[string]string{"invoice": inv}, "accepted": a})
	return base64.StdEncoding.EncodeToString(b), a
}

// TestHTTP402MPP: with "mpp" listed first (payments.http_402_schemes), a
// 402 starts its WWW-Authenticate with the Payment challenge, keeps the
// L402 ones after it, and says Cache-Control: no-store. The retry with
// Authorization: Payment runs the call once, with a Payment-Receipt
// naming the payment hash (never the preimage); the same credential
// again, or for other arguments or another tool, is 401 and runs nothing.
func TestHTTP402MPP(t *testing.T) {
	w := newL402World(t, Config{HTTP402: true, HTTP402Schemes: []string{SchemeMPP, SchemeL402, SchemeX402}})
	sid := newRawSession(t, w.url).sid
	resp, body := w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`))
	chs := resp.Header.Values("WWW-Authenticate")
	if resp.StatusCode != http.StatusPaymentRequired || len(chs) != 4 || !strings.HasPrefix(chs[1], "L402 macaroon=") ||
		resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get(HeaderX402Required) == "" {
		t.Fatalf("402: %d %q %s", resp.StatusCode, chs, body)
	}
	auth, _ := w.mppRetry(resp)
	resp, body = w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`), "Authorization", auth)
	receipt, _ := base64.RawURLEncoding.DecodeString(resp.Header.Get(HeaderMPPReceipt))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "ran dear") || !strings.Contains(string(receipt), `"reference":"`) ||
		!strings.Contains(string(receipt), `"status":"success"`) {
		t.Fatalf("paid retry: %d %s receipt %s", resp.StatusCode, body, receipt)
	}
	for _, tc := range []struct{ name, body string }{
		{"replay", call(`2`, "ex_dear", `,"arguments":{"text":"a"}`)},
		{"other arguments", call(`3`, "ex_dear", `,"arguments":{"text":"b"}`)},
		{"another tool", call(`4`, "ex_cheap", `,"arguments":{"text":"a"}`)},
		{"not base64url", call(`5`, "ex_dear", `,"arguments":{"text":"a"}`)},
	} {
		a := auth
		if tc.name == "not base64url" {
			a = "Payment !!"
		}
		resp, body := w.post(sid, tc.body, "Authorization", a)
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != "" {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
	}
	if n := w.runs(); n != 1 {
		t.Fatalf("ran %d times", n)
	}
}

// TestHTTP402X402: a 402 (default schemes) carries PAYMENT-REQUIRED with
// the invoice's exact Lightning requirements; the retry with
// PAYMENT-SIGNATURE, from the same session, runs the call once and
// answers PAYMENT-RESPONSE and _meta["x402/payment-response"]; the same
// payload again, or for other arguments or another tool, is 401; from
// another session it releases nothing (a 402 of its own).
func TestHTTP402X402(t *testing.T) {
	w := newL402World(t, Config{HTTP402: true})
	sid := newRawSession(t, w.url).sid
	resp, body := w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`))
	if resp.StatusCode != http.StatusPaymentRequired || len(resp.Header.Values("WWW-Authenticate")) != 3 {
		t.Fatalf("402: %d %s", resp.StatusCode, body)
	}
	sig, _ := w.x402Retry(resp)
	other := newRawSession(t, w.url).sid
	resp, body = w.post(other, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`), HeaderX402Payment, sig)
	if resp.StatusCode != http.StatusPaymentRequired || w.runs() != 0 {
		t.Fatalf("another session: %d %s", resp.StatusCode, body)
	}
	resp, body = w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`), HeaderX402Payment, sig)
	settled, _ := base64.StdEncoding.DecodeString(resp.Header.Get(HeaderX402Response))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "ran dear") || !strings.Contains(string(settled), `"success":true`) ||
		!strings.Contains(body, `"x402/payment-response":{"success":true`) {
		t.Fatalf("paid retry: %d %s, PAYMENT-RESPONSE %s", resp.StatusCode, body, settled)
	}
	for _, tc := range []struct{ name, body, sig string }{
		{"replay", call(`2`, "ex_dear", `,"arguments":{"text":"a"}`), sig},
		{"other arguments", call(`3`, "ex_dear", `,"arguments":{"text":"b"}`), sig},
		{"another tool", call(`4`, "ex_cheap", `,"arguments":{"text":"a"}`), sig},
		{"not base64", call(`5`, "ex_dear", `,"arguments":{"text":"a"}`), "%%%"},
	} {
		resp, body := w.post(sid, tc.body, HeaderX402Payment, tc.sig)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
	}
	if n := w.runs(); n != 1 {
		t.Fatalf("ran %d times", n)
	}
}

// TestX402MCPBinding: x402's MCP binding without HTTP 402: the
// payment-required tool result carries structuredContent["x402/error"]
// (code 402, data: the PaymentRequired with the invoice's requirements);
// the repeat with _meta["x402/payment"] runs the call once and its result
// carries _meta["x402/payment-response"].
func TestX402MCPBinding(t *testing.T) {
	w := newL402World(t, Config{})
	sid := newRawSession(t, w.url).sid
	_, body := w.post(sid, call(`1`, "ex_dear", `,"arguments":{"text":"a"}`))
	var res struct {
		Result struct {
			StructuredContent struct {
				X402 struct {
					Code int `json:"code"`
					Data struct {
						X402Version int                     `json:"x402Version"`
						Accepts     []vend.X402Requirements `json:"accepts"`
					} `json:"data"`
				} `json:"x402/error"`
			} `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(firstJSON(body)), &res); err != nil || res.Result.StructuredContent.X402.Code != 402 ||
		len(res.Result.StructuredContent.X402.Data.Accepts) != 1 {
		t.Fatalf("payment required: %s (%v)", body, err)
	}
	a := res.Result.StructuredContent.X402.Data.Accepts[0]
	w.be.pay(strings.TrimPrefix(a.Extra.Invoice, bolt11Prefix))
	payload, _ := json.Marshal(map[string]any{"x402Version": 2, "accepted": a, "payload": map[string]string{"invoice": a.Extra.Invoice}})
	_, body = w.post(sid, call(`2`, "ex_dear", `,"arguments":{"text":"a"},"_meta":{"x402/payment":`+string(payload)+`}`))
	if !strings.Contains(body, "ran dear") || !strings.Contains(body, `"x402/payment-response":{"success":true`) {
		t.Fatalf("paid repeat: %s", body)
	}
	if n := w.runs(); n != 1 {
		t.Fatalf("ran %d times", n)
	}
}

// firstJSON is the JSON of a response body: itself, or the data of its
// first SSE event.
func firstJSON(body string) string {
	for _, l := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			return d
		}
	}
	return body
}

// TestDiscoveryListsEveryScheme: the discovery document lists every row
// of vend.Schemes with its rules and wire parameters, and the order of
// a 402's challenges; MPP is offered only where that order lists it.
func TestDiscoveryListsEveryScheme(t *testing.T) {
	for _, tc := range []struct {
		schemes []string
		mpp     bool
	}{{nil, false}, {[]string{SchemeMPP, SchemeL402, SchemeX402}, true}} {
		s, _ := newServer(t, Config{HTTP402Schemes: tc.schemes})
		doc := s.discovery(DiscoveryInfo{MCPPath: "/mcp", L402: true})
		if len(doc.Payments.Schemes) != len(vend.Schemes()) || len(doc.Payments.HTTP402) == 0 {
			t.Fatalf("schemes %+v, order %v", doc.Payments.Schemes, doc.Payments.HTTP402)
		}
		by := map[string]discoveryScheme{}
		for _, d := range doc.Payments.Schemes {
			by[d.Name] = d
		}
		if m := by["mpp"]; m.Offered != tc.mpp || !m.Bearer || m.Params["method"] != "lightning" || m.Params["intent"] != "charge" {
			t.Fatalf("mpp %+v", m)
		}
		if x := by["x402"]; !x.Offered || x.Bearer || !x.Private || x.Params["credential"] != HeaderX402Payment ||
			x.Params["mcp_meta"] != "x402/payment" {
			t.Fatalf("x402 %+v", x)
		}
		if l := by["l402"]; !l.Offered || l.Params["service"] != "capvend" {
			t.Fatalf("l402 %+v", l)
		}
	}
}
