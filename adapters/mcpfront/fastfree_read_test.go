package mcpfront

import (
	"encoding/json"
	"mime"
	"net/http"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/jsonobj"
)

// FuzzFastRead: the fast path's shortcuts read a request as the decoding
// they skip (and jsonobj.Plain strings encode as themselves quoted): echoID as json.Unmarshal then json.Marshal of the RequestId,
// decodeString as json.Unmarshal into a string, standardHeadersMatch as
// mcp.ValidateStandardHeaders on the params, clientMeta (first call and
// kept answer) as decoding clientCapabilities and clientInfo.
func FuzzFastRead(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a<b"`, `"a\"b"`, `"\u00e9"`, "\"\xff\"", `"é"`, `12`, `012`, `0`, `-1`, `1.5`,
		`123456789012345`, `1234567890123456`, `9007199254740993`, `1e3`, `"`, `""`, `null`, `{}`, `{"elicitation":{}}`,
		`{"experimental":{"payments":{}}}`, `{"experimental":[]}`, `[]`, `{"name":"x","version":"1"}`, `{"name":1}`, "\"a\tb\""} {
		f.Add(s, "tools/call", "x", "2026-07-28")
	}
	f.Add(`"x"`, "tools/call", "=?base64?eA==?=", "2026-07-28")
	f.Add(`"x"`, "tools/list", "x", "2025-06-18")
	f.Add(`"x"`, "", "", "2026-07-28")
	f.Add(`"2026-07-28"`, "tools/call", "x", "2026-07-28")
	f.Add(`"a\u0062"`, "tools/call", "x", "a\u0062")
	f.Fuzz(func(t *testing.T, raw, method, nameHeader, version string) {
		if jsonobj.Plain(raw) {
			if m, _ := json.Marshal(raw); string(m) != `"`+raw+`"` {
				t.Fatalf("jsonobj.Plain(%q), but json.Marshal gives %s", raw, m)
			}
		}
		b := json.RawMessage(raw)
		if !json.Valid(b) {
			return // the fast path reads valid JSON only
		}
		// echoID, for the ids it takes (strings and numbers).
		if raw[0] == '"' || raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9' {
			got, ok := echoID(b)
			var v any
			want, err := json.Unmarshal(b, &v), error(nil)
			var enc []byte
			if want == nil {
				enc, err = json.Marshal(mcp.NewRequestId(v))
			}
			if ok != (want == nil && err == nil) || ok && string(got) != string(enc) {
				t.Fatalf("echoID(%s) = %s %v, decoded and encoded: %s %v %v", raw, got, ok, enc, want, err)
			}
		}
		got, ok := decodeString(b)
		var want string
		if err := json.Unmarshal(b, &want); ok != (err == nil) || got != want {
			t.Fatalf("decodeString(%s) = %q %v, json.Unmarshal: %q %v", raw, got, ok, want, err)
		}
		if quotes(b, version) && (!ok || got != version) {
			t.Fatalf("quotes(%s, %q), but it decodes to %q %v", raw, version, got, ok)
		}
		if ok {
			h := http.Header{}
			if method != "" {
				h.Set(mcp.HeaderMethod, method)
			}
			if nameHeader != "" {
				h.Set(mcp.HeaderName, nameHeader)
			}
			params, _ := json.Marshal(map[string]string{"name": got})
			valid := mcp.ValidateStandardHeaders(h.Get, version, mcp.MethodToolsCall, params) == nil
			if m := standardHeadersMatch(h, version, got); m != valid {
				t.Fatalf("standardHeadersMatch(%v, %q, %q) = %v, ValidateStandardHeaders: %v", h, version, got, m, valid)
			}
		}
		s := &Server{}
		for _, info := range []json.RawMessage{nil, b, json.RawMessage(`{"name":"c","version":"1"}`)} {
			var caps *mcp.ClientCapabilities
			wantOK := json.Unmarshal(b, &caps) == nil && caps != nil && caps.Elicitation == nil
			if info != nil {
				var impl *mcp.Implementation
				wantOK = wantOK && json.Unmarshal(info, &impl) == nil
			}
			for range 2 { // the answer worked out, then the one kept
				facts, ok := s.clientMeta(b, info)
				if ok != wantOK || ok && facts.payments != hasPayments(caps.Experimental) {
					t.Fatalf("clientMeta(%s, %s) = %+v %v, want ok %v", raw, info, facts, ok, wantOK)
				}
			}
		}
	})
}

// FuzzBareMediaType: a part of an Accept header bareMediaType takes is
// what mime.ParseMediaType reads it as, with no parameters.
func FuzzBareMediaType(f *testing.F) {
	for _, s := range []string{"application/json", " text/event-stream", "application/cashu", "Application/JSON", "a/b;q=1",
		"a/", "/b", "a", "a/b/c", "application/vnd.l402+json", "*/*", "text/*", " a/b ", "a\t/b", "é/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, part string) {
		mt, ok := bareMediaType(part)
		if !ok {
			return
		}
		want, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || want != mt || len(params) != 0 {
			t.Fatalf("bareMediaType(%q) = %q, mime.ParseMediaType: %q %v %v", part, mt, want, params, err)
		}
	})
}
