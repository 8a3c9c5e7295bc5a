package mcpfront

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// bodyVendor is a fakeVendor whose tool "free" answers with the body
// given in its arguments as {"body": ...}.
type bodyVendor struct{ *fakeVendor }

func (b bodyVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	var a struct{ Body json.RawMessage }
	if r.Name == "free" && json.Unmarshal(r.Arguments, &a) == nil && a.Body != nil {
		b.fakeVendor.CallItem(ctx, r) // recorded
		return vend.CallResult{Body: a.Body}, nil
	}
	return b.fakeVendor.CallItem(ctx, r)
}

// freeVendor is a bodyVendor that is also a FreeCaller: CallFree serves
// every call through the fake's CallItem (so both paths see the same
// outcome) and counts the calls it took.
type freeVendor struct {
	bodyVendor
	taken atomic.Int64
}

func (f *freeVendor) CallFree(ctx context.Context, r vend.CallRequest) (vend.CallResult, bool, error) {
	f.taken.Add(1)
	res, err := f.CallItem(ctx, r)
	return res, true, err
}

// newPair returns the same fake Vendor served twice: by a Server with the
// fast path (a FreeCaller) and by one without.
func newPair(t *testing.T) (fast, slow string, fv *freeVendor, plain *fakeVendor) {
	t.Helper()
	fv = &freeVendor{bodyVendor: bodyVendor{&fakeVendor{}}}
	plain = &fakeVendor{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fs, err := New(Config{Vendor: fv, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ss, err := New(Config{Vendor: bodyVendor{plain}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return startHTTP(t, fs), startHTTP(t, ss), fv, plain
}

// modernCall is a tools/call of protocol 2026-07-28 as mcp-go's client
// sends it: _meta with the protocol version, capabilities and client
// info, and the standard headers.
type modernCall struct {
	id, tool, args, meta string // meta: extra _meta members, ",..."
	caps                 string // client capabilities; "" : {}
	extra                string // extra params members, ",..."
	header               func(h http.Header)
}

func (c modernCall) request(url string) *http.Request {
	caps := c.caps
	if caps == "" {
		caps = `{}`
	}
	params := `{"name":` + mustJSONString(c.tool)
	if c.args != "" {
		params += `,"arguments":` + c.args
	}
	params += `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":` + caps +
		`,"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}` + c.meta + `}` + c.extra + `}`
	body := `{"jsonrpc":"2.0","id":` + c.id + `,"method":"tools/call","params":` + params + `}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(mcp.HeaderProtocolVersion, mcp.ProtocolVersion20260728)
	for k, v := range mcp.StandardHeaders(mcp.ProtocolVersion20260728, mcp.MethodToolsCall, json.RawMessage(params)) {
		req.Header.Set(k, v)
	}
	if c.header != nil {
		c.header(req.Header)
	}
	return req
}

func mustJSONString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// answer is what a client sees of a response: status, the headers that
// matter, and the body's bytes.
type answer struct {
	Status                                   int
	ContentType, CacheControl, ContentLength string
	Body                                     string
}

func do(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"), resp.Header.Get("Content-Length"), string(b)}
}

// TestFastFreeSameBytes sends the same requests to a Server with the fast
// path and to one without, and wants the same answers, byte for byte, and
// the same CallRequest at the Vendor. fast says whether the fast path must
// have taken the request.
func TestFastFreeSameBytes(t *testing.T) {
	fastURL, slowURL, fv, plain := newPair(t)
	for _, tc := range []struct {
		name string
		call modernCall
		fast bool
	}{
		{"result", modernCall{id: `7`, tool: "free", args: `{"text":"hi","n":12345678901234567890}`}, true},
		{"result no arguments", modernCall{id: `"7"`, tool: "free"}, true},
		{"result null arguments", modernCall{id: `8`, tool: "free", args: `null`}, true},
		{"id as a float", modernCall{id: `1.0`, tool: "free", args: `{"text":"x"}`}, true},
		{"id with escapes", modernCall{id: `"\u00e9<&>"`, tool: "free", args: `{"text":"x"}`}, true},
		{"body with resultType and _meta", modernCall{id: `40`, tool: "free", args: `{"body":{"content":[],"resultType":"complete","_meta":{"a":1}}}`}, true},
		{"body with _meta", modernCall{id: `41`, tool: "free", args: `{"body":{"_meta":{"progressToken":1},"content":[]}}`}, true},
		{"body with resultType", modernCall{id: `42`, tool: "free", args: `{"body":{"content":[],"resultType":"other"}}`}, true},
		{"body naming _meta in a string", modernCall{id: `43`, tool: "free", args: `{"body":{"content":[{"type":"text","text":"\"_meta\""}]}}`}, true},
		{"empty body", modernCall{id: `44`, tool: "free", args: `{"body":{}}`}, true},
		{"is error", modernCall{id: `9`, tool: "iserror"}, true},
		{"upstream error", modernCall{id: `10`, tool: "upstream"}, true},
		{"limit", modernCall{id: `11`, tool: "limit"}, true},
		{"internal", modernCall{id: `12`, tool: "boom"}, true},
		{"invalid params is 400", modernCall{id: `13`, tool: "invalid"}, true},
		{"unknown tool", modernCall{id: `14`, tool: "unknown"}, true},
		{"notifications on the stream", modernCall{id: `15`, tool: "paid"}, true},
		{"progress token string", modernCall{id: `16`, tool: "free", args: `{"text":"p"}`, meta: `,"progressToken":"tok"`}, true},
		{"client handles payments", modernCall{id: `18`, tool: "free", args: `{"text":"c"}`, caps: `{"experimental":{"` + CapabilityPayments + `":{}}}`}, true},
		{"progress token number", modernCall{id: `17`, tool: "free", args: `{"text":"p"}`, meta: `,"progressToken":5.0`}, true},
		// Everything else goes mcp-go's way, with the same bytes.
		{"client can elicit", modernCall{id: `20`, tool: "free", caps: `{"elicitation":{}}`}, false},
		{"capvend meta", modernCall{id: `21`, tool: "free", meta: `,"capvend/cashu":"cashuAabc"`}, false},
		{"request state", modernCall{id: `22`, tool: "free", extra: `,"requestState":"x"`}, false},
		{"task", modernCall{id: `23`, tool: "free", extra: `,"task":{}`}, false},
		{"log level", modernCall{id: `24`, tool: "free", meta: `,"io.modelcontextprotocol/logLevel":"debug"`}, false},
		{"progress token object", modernCall{id: `25`, tool: "free", meta: `,"progressToken":{"a":1}`}, false},
		{"tool not listed", modernCall{id: `26`, tool: "nosuch"}, false},
		{"no Mcp-Name", modernCall{id: `27`, tool: "free", header: func(h http.Header) { h.Del(mcp.HeaderName) }}, false},
		{"Mcp-Name mismatch", modernCall{id: `28`, tool: "free", header: func(h http.Header) { h.Set(mcp.HeaderName, "paid") }}, false},
		{"version header mismatch", modernCall{id: `29`, tool: "free", header: func(h http.Header) { h.Set(mcp.HeaderProtocolVersion, "2025-11-25") }}, false},
		{"no version header", modernCall{id: `30`, tool: "free", header: func(h http.Header) { h.Del(mcp.HeaderProtocolVersion) }}, false},
		{"Last-Event-ID", modernCall{id: `31`, tool: "free", header: func(h http.Header) { h.Set(mcp.HeaderLastEventID, "1") }}, false},
		{"content type", modernCall{id: `32`, tool: "free", header: func(h http.Header) { h.Set("Content-Type", "text/plain") }}, false},
		{"case variant key", modernCall{id: `33`, tool: "free", extra: `,"Name":"paid"`}, false},
		{"id is an object", modernCall{id: `{}`, tool: "free"}, false},
		{"escaped name", modernCall{id: `35`, tool: "free", extra: `,"\u006eame":"free"`}, false},
		{"repeated name", modernCall{id: `36`, tool: "free", extra: `,"name":"free"`}, false},
		{"escaped _meta name", modernCall{id: `37`, tool: "free", meta: `,"progress\u0054oken":"t"`}, false},
		{"rebinding Host", modernCall{id: `34`, tool: "free", header: func(h http.Header) {}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := fv.taken.Load()
			fr, sr := tc.call.request(fastURL), tc.call.request(slowURL)
			if tc.name == "rebinding Host" {
				fr.Host, sr.Host = "evil.example", "evil.example"
			}
			got, want := do(t, fr), do(t, sr)
			if got != want {
				t.Errorf("fast path answered\n%+v\nslow path\n%+v", got, want)
			}
			if taken := fv.taken.Load() > before; taken != tc.fast {
				t.Errorf("fast path taken: %v, want %v (answer %s)", taken, tc.fast, got.Body)
			}
			if !tc.fast || want.Status != http.StatusOK && want.Status != http.StatusBadRequest {
				return
			}
			g, w := fv.last(), plain.last()
			g.Notify, w.Notify, g.Elicit, w.Elicit = nil, nil, nil, nil
			if g.Name != w.Name || g.RequestID != w.RequestID || g.Client != w.Client || g.Source != w.Source ||
				g.Transport != w.Transport || g.Anonymous != w.Anonymous || g.Explicit != w.Explicit || g.PaymentTokens != w.PaymentTokens ||
				string(g.Arguments) != string(w.Arguments) || string(g.ProgressToken) != string(w.ProgressToken) {
				t.Errorf("vendor got\n%+v\nslow path\n%+v", g, w)
			}
		})
	}
}

// TestFastFreeLegacySession: a session of a protocol before 2026-07-28
// is mcp-go's: the fast path leaves it alone.
func TestFastFreeLegacySession(t *testing.T) {
	fastURL, _, fv, _ := newPair(t)
	r := newRawSession(t, fastURL)
	msgs, _ := r.post(call(`1`, "free", `,"arguments":{"text":"hi"}`))
	if len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"result"`) {
		t.Fatalf("%s", msgs)
	}
	if fv.taken.Load() != 0 {
		t.Error("fast path took a legacy session's call")
	}
}

// TestFastFreeBodyNotAnObject: a Vendor result that is not a JSON object
// is answered -32603 on the fast path. (The slow path cannot put such a
// body back in place of its placeholder and sends the placeholder, nonce
// included: see the report of this change; the Vendor never returns one.)
func TestFastFreeBodyNotAnObject(t *testing.T) {
	fastURL, _, fv, _ := newPair(t)
	got := do(t, modernCall{id: `45`, tool: "free", args: `{"body":[1]}`}.request(fastURL))
	if fv.taken.Load() != 1 || got.Status != http.StatusOK || got.Body != `{"jsonrpc":"2.0","id":45,"error":{"code":-32603,"message":"Internal error"}}`+"\n" {
		t.Fatalf("%+v", got)
	}
}
