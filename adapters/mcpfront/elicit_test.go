package mcpfront

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// elicitVendor's tool "confirm" asks the client twice (a name, then a
// confirmation) through r.Elicit and returns both answers; calls counts
// the Vendor calls, answers receives every answer Elicit got.
type elicitVendor struct {
	calls   atomic.Int32
	answers chan string
}

func (v *elicitVendor) Tools() []vend.Item {
	return []vend.Item{{Name: "confirm", Price: 21000}, {Name: "confirm2", Price: 21000}}
}

func (v *elicitVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	v.calls.Add(1)
	if r.Elicit == nil {
		return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"no elicit"}]}`)}, nil
	}
	var got []string
	for _, msg := range []string{"your name?", "sure?"} {
		params, _ := json.Marshal(map[string]any{"message": msg, "requestedSchema": map[string]any{"type": "object",
			"properties": map[string]any{"answer": map[string]any{"type": "string"}}}})
		ans, err := r.Elicit(ctx, params)
		if err != nil {
			return vend.CallResult{}, err
		}
		v.answers <- string(ans)
		got = append(got, string(ans))
		if !strings.Contains(string(ans), `"accept"`) {
			break
		}
	}
	txt, _ := json.Marshal(strings.Join(got, " "))
	return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":` + string(txt) + `}]}`)}, nil
}

// answerer is an mcp-go ElicitationHandler answering with the message it
// was asked, so the test sees each question reached the client.
type answerer struct {
	mu   sync.Mutex
	seen []string
}

func (a *answerer) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	a.mu.Lock()
	a.seen = append(a.seen, req.Params.Message)
	a.mu.Unlock()
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
		Action: mcp.ElicitationResponseActionAccept, Content: map[string]any{"answer": "re:" + req.Params.Message}}}, nil
}

func newElicitServer(t *testing.T, cfg Config) (*Server, *elicitVendor) {
	t.Helper()
	v := &elicitVendor{answers: make(chan string, 100)}
	cfg.Vendor = v
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

const bothAccepted = `{"action":"accept","content":{"answer":"re:your name?"}} {"action":"accept","content":{"answer":"re:sure?"}}`

func TestElicitationWithMCPGoClients(t *testing.T) {
	for _, tc := range []struct {
		name    string
		modern  bool
		connect func(t *testing.T, s *Server, opts ...client.ClientOption) *client.Client
	}{
		{"http", true, func(t *testing.T, s *Server, opts ...client.ClientOption) *client.Client {
			tr, err := transport.NewStreamableHTTP(startHTTP(t, s))
			if err != nil {
				t.Fatal(err)
			}
			c := client.NewClient(tr, opts...)
			if err := c.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"http legacy", false, func(t *testing.T, s *Server, opts ...client.ClientOption) *client.Client {
			tr, err := transport.NewStreamableHTTP(startHTTP(t, s))
			if err != nil {
				t.Fatal(err)
			}
			c := client.NewClient(tr, append(opts, client.WithProtocolVersion(mcp.ProtocolVersion20251125))...)
			if err := c.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"stdio", true, func(t *testing.T, s *Server, opts ...client.ClientOption) *client.Client {
			c, stop := startStdio(t, s, opts...)
			t.Cleanup(stop)
			return c
		}},
		{"stdio legacy", false, func(t *testing.T, s *Server, opts ...client.ClientOption) *client.Client {
			//lint:ignore SA1019 the test speaks the legacy protocol (sessions, the standalone GET stream) on purpose
			c, stop := startStdio(t, s, append(opts, client.WithLegacyProtocolOnly())...)
			t.Cleanup(stop)
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, v := newElicitServer(t, Config{})
			a := &answerer{}
			c := tc.connect(t, s, client.WithElicitationHandler(a))
			defer c.Close()
			ctx := context.Background()
			if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
				t.Fatal(err)
			}
			if mcp.IsModernProtocol(c.ProtocolVersion()) != tc.modern {
				t.Fatalf("protocol %s", c.ProtocolVersion())
			}
			req := mcp.CallToolRequest{}
			req.Params.Name = "confirm"
			res, err := c.CallTool(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if got := callText(t, res); got != bothAccepted {
				t.Errorf("result %q", got)
			}
			if n := v.calls.Load(); n != 1 {
				t.Errorf("%d Vendor calls, want 1", n)
			}
			a.mu.Lock()
			if strings.Join(a.seen, "|") != "your name?|sure?" {
				t.Errorf("client asked %q", a.seen)
			}
			a.mu.Unlock()
			s.elicitMu.Lock()
			if n := len(s.elicits); n != 0 {
				t.Errorf("%d elicitations left pending", n)
			}
			s.elicitMu.Unlock()
		})
	}
}

// A client that did not declare elicitation gets no question: the upstream
// gets "decline".
func TestElicitationClientWithoutCapability(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		s, v := newElicitServer(t, Config{})
		var opts []client.ClientOption
		if legacy {
			//lint:ignore SA1019 the test speaks the legacy protocol (sessions, the standalone GET stream) on purpose
			opts = append(opts, client.WithLegacyProtocolOnly())
		}
		c, stop := startStdio(t, s, opts...)
		if _, err := c.Initialize(context.Background(), mcp.InitializeRequest{}); err != nil {
			t.Fatal(err)
		}
		req := mcp.CallToolRequest{}
		req.Params.Name = "confirm"
		res, err := c.CallTool(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got := callText(t, res); got != `{"action":"decline"}` {
			t.Errorf("legacy %v: result %q", legacy, got)
		}
		if n := v.calls.Load(); n != 1 {
			t.Errorf("%d Vendor calls, want 1", n)
		}
		stop()
	}
}

// modernPost sends one protocol 2026-07-28 tools/call of "confirm" as the
// client named by X-Client, with params merged in, and returns the
// JSON-RPC response.
func modernPost(t *testing.T, url, clientName, params string) map[string]any {
	t.Helper()
	return modernPostTool(t, url, clientName, "confirm", params)
}

// modernPostTool is modernPost for another tool.
func modernPostTool(t *testing.T, url, clientName, tool, params string, header ...string) map[string]any {
	t.Helper()
	_, body := modernRaw(t, url, tool, `{"elicitation":{}}`, params, append([]string{"X-Client", clientName}, header...)...)
	b := []byte(body)
	if i := strings.Index(string(b), "data: "); i >= 0 { // SSE: the last event
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		b = []byte(strings.TrimPrefix(lines[len(lines)-1], "data: "))
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
	return out
}

func errCode(m map[string]any) (float64, string) {
	e, _ := m["error"].(map[string]any)
	code, _ := e["code"].(float64)
	msg, _ := e["message"].(string)
	return code, msg
}

// state returns the requestState of an input_required result.
func state(t *testing.T, m map[string]any) string {
	t.Helper()
	res, _ := m["result"].(map[string]any)
	if res["resultType"] != string(mcp.ResultTypeInputRequired) {
		t.Fatalf("not input_required: %v", m)
	}
	st, _ := res["requestState"].(string)
	if len(st) < 40 {
		t.Fatalf("requestState %q", st)
	}
	return st
}

func answerParams(state, answer string) string {
	return `,"requestState":"` + state + `","inputResponses":{"` + elicitKey + `":{"action":"accept","content":{"answer":"` + answer + `"}}}`
}

func TestElicitationRequestState(t *testing.T) {
	s, v := newElicitServer(t, Config{ClientID: func(r *http.Request) string { return r.Header.Get("X-Client") }})
	url := startHTTP(t, s)

	if code, msg := errCode(modernPost(t, url, "alice", answerParams("bogus", "x"))); code != rpcerr.CodeInvalidParams || msg != "Unknown or expired request state" {
		t.Errorf("unknown state: %v %q", code, msg)
	}
	if n := v.calls.Load(); n != 0 {
		t.Errorf("%d Vendor calls for an unknown state", n)
	}

	st := state(t, modernPost(t, url, "alice", ""))
	// Another client cannot use alice's token, nor can it be used
	// without the answer; the call stays pending for alice.
	if code, msg := errCode(modernPost(t, url, "mallory", answerParams(st, "x"))); code != rpcerr.CodeInvalidParams || msg != "Unknown or expired request state" {
		t.Errorf("other client: %v %q", code, msg)
	}
	if code, _ := errCode(modernPost(t, url, "alice", `,"requestState":"`+st+`"`)); code != rpcerr.CodeInvalidParams {
		t.Errorf("no answer: code %v", code)
	}
	st2 := state(t, modernPost(t, url, "alice", answerParams(st, "ada")))
	if st2 == st {
		t.Error("token reused for the second question")
	}
	// A token is good once.
	if code, _ := errCode(modernPost(t, url, "alice", answerParams(st, "ada"))); code != rpcerr.CodeInvalidParams {
		t.Errorf("replayed token: code %v", code)
	}
	final := modernPost(t, url, "alice", answerParams(st2, "yes"))
	res, _ := final["result"].(map[string]any)
	content, _ := res["content"].([]any)
	if len(content) != 1 || !strings.Contains(content[0].(map[string]any)["text"].(string), `"answer":"yes"`) {
		t.Errorf("final %v", final)
	}
	if n := v.calls.Load(); n != 1 {
		t.Errorf("%d Vendor calls, want 1", n)
	}
}

func TestElicitationExpires(t *testing.T) {
	s, v := newElicitServer(t, Config{ElicitTimeout: time.Millisecond})
	url := startHTTP(t, s)
	st := state(t, modernPost(t, url, "", ""))
	select {
	case got := <-v.answers: // the upstream was told
		if got != `{"action":"cancel"}` {
			t.Errorf("answer on expiry %s", got)
		}
	case <-time.After(waitLimit):
		t.Fatal("expired elicitation not cancelled")
	}
	if code, msg := errCode(modernPost(t, url, "", answerParams(st, "late"))); code != rpcerr.CodeInvalidParams || msg != "Unknown or expired request state" {
		t.Errorf("expired state: %v %q", code, msg)
	}
	if n := v.calls.Load(); n != 1 {
		t.Errorf("%d Vendor calls, want 1", n)
	}
}

// A requestState continues only the call it was issued for: a retry with
// another tool or other arguments is refused (-32600) and the call stays
// pending for the right retry; key order and _meta do not matter.
func TestElicitationStateBoundToTheCall(t *testing.T) {
	s, v := newElicitServer(t, Config{})
	url := startHTTP(t, s)
	st := state(t, modernPost(t, url, "", `,"arguments":{"a":1,"b":"x"}`))
	for _, tc := range []struct{ name, tool, params string }{
		{"other arguments", "confirm", `,"arguments":{"a":2,"b":"x"}` + answerParams(st, "x")},
		{"no arguments", "confirm", answerParams(st, "x")},
		{"other tool", "confirm2", `,"arguments":{"a":1,"b":"x"}` + answerParams(st, "x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := errCode(modernPostTool(t, url, "", tc.tool, tc.params))
			if code != rpcerr.CodeInvalidRequest || msg != "Invalid Request: request id reused with different parameters" {
				t.Errorf("%v %q", code, msg)
			}
		})
	}
	select {
	case a := <-v.answers:
		t.Fatalf("the call got an answer from a mismatched retry: %s", a)
	default:
	}
	st2 := state(t, modernPost(t, url, "", `,"arguments":{"b":"x","a":1.0}`+answerParams(st, "ada")))
	final := modernPost(t, url, "", `,"arguments":{"a":1,"b":"x"}`+answerParams(st2, "yes"))
	res, _ := final["result"].(map[string]any)
	if content, _ := res["content"].([]any); len(content) != 1 {
		t.Errorf("final %v", final)
	}
	if n := v.calls.Load(); n != 1 {
		t.Errorf("%d Vendor calls, want 1", n)
	}
}

// Parked elicitations are bounded per source and in total; beyond, the
// upstream gets "cancel" at once (the call goes on to its outcome, which
// the client gets: a paid call's result is never withheld).
func TestElicitationsBounded(t *testing.T) {
	s, v := newElicitServer(t, Config{MaxElicitsPerClient: 2, MaxElicits: 3,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	url := startHTTP(t, s)
	t.Cleanup(func() { expireParked(s) })
	from := func(ip string) []string { return []string{"X-Forwarded-For", ip} }
	for i := 0; i < 2; i++ {
		state(t, modernPostTool(t, url, "", "confirm", "", from("198.51.100.1")...))
	}
	refused := func(ip string) {
		t.Helper()
		m := modernPostTool(t, url, "", "confirm", "", from(ip)...)
		res, _ := m["result"].(map[string]any)
		if res["resultType"] == string(mcp.ResultTypeInputRequired) {
			t.Fatalf("%s: elicitation parked beyond the bound", ip)
		}
		if got := <-v.answers; got != string(answerCancel) {
			t.Errorf("%s: upstream got %s, want cancel", ip, got)
		}
		if content, _ := res["content"].([]any); len(content) != 1 || !strings.Contains(content[0].(map[string]any)["text"].(string), "cancel") {
			t.Errorf("%s: outcome %v", ip, m)
		}
	}
	refused("198.51.100.1") // its third
	state(t, modernPostTool(t, url, "", "confirm", "", from("198.51.100.2")...))
	refused("198.51.100.3") // the fourth in total
	s.elicitMu.Lock()
	n, by := len(s.elicits), len(s.elicitBy)
	s.elicitMu.Unlock()
	if n != 3 || by != 2 {
		t.Errorf("%d parked for %d sources", n, by)
	}
}

// expireParked answers every parked elicitation "cancel" at once, as its
// timeout (Config.ElicitTimeout, 10 minutes by default) would, so that the
// Vendor calls waiting on them end with the test (goleak).
func expireParked(s *Server) {
	s.elicitMu.Lock()
	var toks []string
	for tok := range s.elicits {
		toks = append(toks, tok)
	}
	s.elicitMu.Unlock()
	for _, tok := range toks {
		if p := s.take(tok); p != nil {
			p.ask.answer <- answerCancel
			p.c.abandon()
		}
	}
}
