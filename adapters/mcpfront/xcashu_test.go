package mcpfront

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/nut18"
	"github.com/capvend/capvend/vend"
)

// tokenVendor sells "buy" for 21 sats the way vend does with a Cashu
// backend: explicit gating answers with the payment options; a Cashu
// token is accepted or refused by its (fake) content, and a refused one is
// never run.
type tokenVendor struct {
	mu    sync.Mutex
	calls []vend.CallRequest
	runs  int
}

func (v *tokenVendor) Tools() []vend.Item {
	return []vend.Item{{Name: "buy", Price: 21000}, {Name: "gratis"}}
}

// tokenRefusals are the fake tokens vend refuses, with the error and the
// reason the client must read.
var tokenRefusals = map[string]struct {
	err    error
	reason string
}{
	"cashuBforeign": {vend.ErrForeignMint, "from a mint this server does not accept"},
	"cashuBunit":    {vend.ErrWrongUnit, "not in sats"},
	"cashuBlow":     {vend.ErrUnderpaid, "does not cover the price"},
	"cashuBspent":   {vend.ErrProofSpent, "already spent"},
	"cashuBjunk":    {vend.ErrBadToken, "malformed"},
}

func (v *tokenVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r.Notify, r.Elicit = nil, nil
	v.calls = append(v.calls, r)
	ok := vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"bought"}]}`)}
	if r.Name == "gratis" {
		return ok, nil
	}
	switch tok := r.CashuToken; {
	case tok == "cashuBnone":
		return vend.CallResult{}, fmt.Errorf("%w: this server takes no Cashu tokens", vend.ErrNoPaymentMethod)
	case tok == "cashuBdown":
		return vend.CallResult{}, fmt.Errorf("%w: %w", vend.ErrPaymentFailed, vend.ErrMintUnavailable)
	case tokenRefusals[tok].err != nil:
		return vend.CallResult{}, fmt.Errorf("%w: cashu: %w", vend.ErrPaymentFailed, tokenRefusals[tok].err)
	case tok != "":
		v.runs++
		return ok, nil
	case r.Explicit || r.L402: // vend: L402 implies explicit gating
		return vend.CallResult{}, &vend.PaymentRequiredError{Amount: 20500, Invoice: "lnbcrt210n1fake", ExpiresAt: fakeExpiry,
			Options: []vend.PaymentOption{{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, TTL: 600}}}
	}
	return vend.CallResult{}, fmt.Errorf("the test expects explicit gating or a token")
}

func (v *tokenVendor) last() vend.CallRequest {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.calls[len(v.calls)-1]
}

var testMints = []string{"http://127.0.0.1:3338", "https://mint.example.com"}

func newTokenServer(t *testing.T, cfg Config) (*rawSession, *tokenVendor) {
	t.Helper()
	v := &tokenVendor{}
	cfg.Vendor = v
	return newRawSession(t, startHTTP(t, newServerOf(t, cfg))), v
}

// TestX402Challenge: an unpaid priced call that asks for HTTP 402 (an
// Accept naming cashu, or Config.HTTP402) is answered 402, its body the
// usual payment-required tool result, with X-Cashu carrying a NUT-18
// request for the price in sats (rounded up), unit sat, the configured
// mints, single use, no transport. Without asking, or without mints,
// nothing of it.
func TestX402Challenge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		accept    string
		status    int
		wantCreq  bool
		modernReq bool
	}{
		{"accept cashu", Config{CashuMints: testMints}, "application/json, text/event-stream, cashu", 402, true, false},
		{"accept application/cashu", Config{CashuMints: testMints}, "application/json, application/cashu;q=0.5, text/event-stream", 402, true, false},
		{"http_402", Config{CashuMints: testMints, HTTP402: true}, "", 402, true, false},
		{"http_402, 2026-07-28", Config{CashuMints: testMints, HTTP402: true}, "", 402, true, true},
		{"http_402 without mints: no challenge, no 402", Config{HTTP402: true}, "", 200, false, false},
		{"not asked", Config{CashuMints: testMints}, "", 200, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, v := newTokenServer(t, tc.cfg)
			var h []string
			if tc.accept != "" {
				h = []string{"Accept", tc.accept}
			}
			var resp *http.Response
			var body string
			if tc.modernReq {
				resp, body = modernRaw(t, r.url, "buy", `{}`, ``, h...)
			} else {
				var msgs []json.RawMessage
				msgs, resp = r.post(call(`1`, "buy", ``), h...)
				body = msgsText(msgs)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if !strings.Contains(body, `"payment_required"`) || !strings.Contains(body, "lnbcrt210n1fake") {
				t.Fatalf("body is not the payment-required answer: %s", body)
			}
			// A 402's body is http402.go's JSON-RPC 402 error; a 200's the
			// explicit-gating tool result.
			if is402 := strings.Contains(body, `"error":{"code":402`); is402 != (tc.status == 402) ||
				strings.Contains(body, `"isError":true`) == is402 {
				t.Fatalf("status %d with body %s", resp.StatusCode, body)
			}
			creq := resp.Header.Get(HeaderCashu)
			if !tc.wantCreq {
				if creq != "" {
					t.Fatalf("X-Cashu %q, want none", creq)
				}
				return
			}
			if !v.last().L402 {
				t.Fatal("a request that wants 402 did not ask vend for a challenge (L402, explicit gating)")
			}
			pr, err := nut18.Decode(creq)
			if err != nil {
				t.Fatalf("X-Cashu %q: %v", creq, err)
			}
			if pr.Amount != 21 || pr.Unit != "sat" || fmt.Sprint(pr.Mints) != fmt.Sprint(testMints) || !pr.SingleUse ||
				pr.Transports != nil || len(pr.ID) != 16 || !strings.Contains(pr.Description, "21 sats") {
				t.Fatalf("payment request %+v", pr)
			}
		})
	}
}

// TestX402Pending: over a real Vendor and ledger, a repeat that finds
// the first request's invoice unpaid (the same request again, or a new one
// of the same client for the same call) is a 402 with X-Cashu too, not a
// 200 "payment pending": the client can still pay with Cashu at once.
func TestX402Pending(t *testing.T) {
	w := newL402World(t, Config{CashuMints: testMints})
	sid := newRawSession(t, w.url).sid
	accept := "application/json, text/event-stream, cashu"
	var invoice string
	for i, id := range []string{`1`, `1`, `2`} {
		resp, body := w.post(sid, call(id, "ex_dear", `,"arguments":{"text":"a"}`), "Accept", accept)
		pr, err := nut18.Decode(resp.Header.Get(HeaderCashu))
		if resp.StatusCode != http.StatusPaymentRequired || err != nil || pr.Amount == 0 || !strings.Contains(body, `"payment_required"`) {
			t.Fatalf("request %d (id %s): %d %s, X-Cashu %+v (%v)", i, id, resp.StatusCode, body, pr, err)
		}
		var rpc struct {
			Error struct {
				Data struct {
					Invoice string `json:"invoice"`
				} `json:"data"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(body), &rpc)
		if i == 0 {
			invoice = rpc.Error.Data.Invoice
		} else if rpc.Error.Data.Invoice != invoice {
			t.Fatalf("request %d offers invoice %q, the first %q", i, rpc.Error.Data.Invoice, invoice)
		}
	}
	if n := w.runs(); n != 0 {
		t.Fatalf("an unpaid call ran %d times", n)
	}
}

// TestXCashuTokenPays: a retry of the same request (same JSON-RPC id,
// same session) with X-Cashu: cashuB... is a new call paid by that token,
// not a replay of the unpaid one: vend gets the token and a request id of
// its own, the same for the same token. A free tool ignores the header.
func TestXCashuTokenPays(t *testing.T) {
	r, v := newTokenServer(t, Config{CashuMints: testMints})
	accept := []string{"Accept", "application/json, text/event-stream, cashu"}
	if _, resp := r.post(call(`7`, "buy", ``), accept...); resp.StatusCode != 402 {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	first := v.last().RequestID
	for _, tok := range []string{"cashuBgood", "cashuAgood"} {
		msgs, resp := r.post(call(`7`, "buy", ``), append(accept, HeaderCashu, tok)...)
		if resp.StatusCode != 200 || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "bought") {
			t.Fatalf("%s: %d %s", tok, resp.StatusCode, msgs)
		}
		got := v.last()
		if got.CashuToken != tok || got.RequestID == first || !strings.HasPrefix(got.RequestID, first+xcashuSuffix) {
			t.Fatalf("%s: vend got token %q request id %q (the 402's: %q)", tok, got.CashuToken, got.RequestID, first)
		}
		r.post(call(`7`, "buy", ``), append(accept, HeaderCashu, tok)...)
		if again := v.last(); again.RequestID != got.RequestID {
			t.Fatalf("the same token's retry has request id %q, then %q", got.RequestID, again.RequestID)
		}
	}
	// _meta's token wins over the header.
	r.post(call(`8`, "buy", `,"_meta":{"capvend/cashu":"cashuBmeta"}`), HeaderCashu, "cashuBheader")
	if got := v.last(); got.CashuToken != "cashuBmeta" || strings.Contains(got.RequestID, xcashuSuffix) {
		t.Fatalf("_meta and header: vend got %q, request id %q", got.CashuToken, got.RequestID)
	}
	if msgs, resp := r.post(call(`9`, "gratis", ``), HeaderCashu, "cashuBfree"); resp.StatusCode != 200 || !strings.Contains(msgsText(msgs), "bought") {
		t.Fatalf("free tool with X-Cashu: %d %s", resp.StatusCode, msgs)
	}
}

// TestXCashuRefusals: every token vend refuses for what it is gets HTTP
// 400 with the reason (NUT-24), before anything ran; a mint that could
// not be reached is not the token's fault (the status the error has).
func TestXCashuRefusals(t *testing.T) {
	cases := map[string]string{"cashuBnone": "No payment method in common", "cashuBdown": ""}
	for tok, want := range tokenRefusals {
		cases[tok] = want.reason
	}
	for tok, reason := range cases {
		t.Run(tok, func(t *testing.T) {
			for _, modern := range []bool{false, true} {
				r, v := newTokenServer(t, Config{CashuMints: testMints})
				var resp *http.Response
				var body string
				if modern {
					resp, body = modernRaw(t, r.url, "buy", `{}`, ``, HeaderCashu, tok)
				} else {
					var msgs []json.RawMessage
					msgs, resp = r.post(call(`1`, "buy", ``), HeaderCashu, tok)
					body = msgsText(msgs)
				}
				want := http.StatusBadRequest
				if reason == "" {
					want = http.StatusOK
				}
				if resp.StatusCode != want || !strings.Contains(body, reason) || !strings.Contains(body, `"error"`) {
					t.Fatalf("modern %v: %d %s; want %d with %q", modern, resp.StatusCode, body, want, reason)
				}
				if v.runs != 0 {
					t.Fatalf("a refused token ran the call")
				}
			}
		})
	}
}

// modernRaw posts one protocol 2026-07-28 tools/call of tool (no
// session) from a client with the capabilities caps, with params (",..."
// members after the name and _meta) and the headers h (name, value, ...),
// and returns the response and its body.
func modernRaw(t *testing.T, url, tool, caps, params string, h ...string) (*http.Response, string) {
	t.Helper()
	meta := `"_meta":{"` + mcp.MetaKeyProtocolVersion + `":"` + mcp.LATEST_PROTOCOL_VERSION + `","` +
		mcp.MetaKeyClientCapabilities + `":` + caps + `,"` + mcp.MetaKeyClientInfo + `":{"name":"raw","version":"1"}}`
	body := `{"jsonrpc":"2.0","id":"r1","method":"tools/call","params":{"name":"` + tool + `",` + meta + params + `}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", mcp.LATEST_PROTOCOL_VERSION)
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	for i := 0; i+1 < len(h); i += 2 {
		req.Header.Set(h[i], h[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func msgsText(msgs []json.RawMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		b.Write(m)
		b.WriteByte('\n')
	}
	return b.String()
}
