package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// rawTools is fakeTools with the raw ability: CallToolRaw runs the same
// fake (counted apart), asks for the full client (ErrNotRaw) for the text
// "needinput", and fails for "down".
type rawTools struct {
	*fakeTools
	raw   atomic.Int32
	noRaw bool // CanCallRaw says no
}

func (r *rawTools) CanCallRaw(t vend.Item) bool { return !r.noRaw }

func (r *rawTools) CallToolRaw(ctx context.Context, t vend.Item, args json.RawMessage, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	r.raw.Add(1)
	switch {
	case strings.Contains(string(args), "needinput"):
		return nil, vend.ErrNotRaw
	case strings.Contains(string(args), "down"):
		return nil, errors.New("connection refused")
	}
	return r.fakeTools.CallTool(ctx, t, args, tok, progress)
}

// CallTool of the fake fails for "down" too, so both paths see the same
// upstream.
func (r *rawTools) CallTool(ctx context.Context, t vend.Item, args json.RawMessage, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	if strings.Contains(string(args), "down") {
		return nil, errors.New("connection refused")
	}
	return r.fakeTools.CallTool(ctx, t, args, tok, progress)
}

func newRawHarness(t *testing.T, mod func(*vend.Config)) (*harness, *rawTools) {
	t.Helper()
	var rt *rawTools
	h := newHarness(t, false, func(c *vend.Config) {
		rt = &rawTools{fakeTools: c.Tools.(*fakeTools)}
		c.Tools = rt
		c.Prices = newBook(t, map[string]pricing.Rule{
			"echo": {Price: 21_000}, "fail": {Price: 10_000, FreePerDay: 5},
		})
		if mod != nil {
			mod(c)
		}
	})
	return h, rt
}

// TestCallFreeAnswersAsCallTool: CallFree takes exactly the calls that
// are free outright and answers them as CallTool does; every other call
// (priced, a free quota, arguments refused, a Cashu token, an upstream it
// cannot reach raw) it leaves untouched for CallTool.
func TestCallFreeAnswersAsCallTool(t *testing.T) {
	for _, tc := range []struct {
		name, tool, args string
		mod              func(*vend.CallRequest)
		noRaw            bool
		taken            bool
	}{
		{name: "free", tool: "demo_free", args: `{"text":"hi"}`, taken: true},
		{name: "free, no arguments field", tool: "demo_free", args: ``, taken: false}, // {} fails the schema
		{name: "progress", tool: "demo_free", args: `{"text":"p"}`, mod: func(r *vend.CallRequest) { r.ProgressToken = json.RawMessage(`"tok"`) }, taken: true},
		{name: "payment argument taken out", tool: "demo_free", args: `{"text":"hi","capvend_payment":"tok"}`, taken: true},
		{name: "payment argument null", tool: "demo_free", args: `{"text":"hi","capvend_payment":null}`, taken: true},
		{name: "payment argument not a string", tool: "demo_free", args: `{"text":"hi","capvend_payment":5}`},
		{name: "upstream down", tool: "demo_free", args: `{"text":"down"}`, taken: true},
		{name: "asks for input: full client", tool: "demo_free", args: `{"text":"needinput"}`, taken: true},
		{name: "priced", tool: "demo_echo", args: `{"text":"hi"}`},
		{name: "free quota", tool: "demo_fail", args: `{"text":"hi"}`},
		{name: "unknown tool", tool: "demo_nope", args: `{}`},
		{name: "schema", tool: "demo_free", args: `{"text":5}`},
		{name: "duplicate key", tool: "demo_free", args: `{"text":"a","text":"b"}`},
		{name: "case variant key", tool: "demo_free", args: `{"text":"a","Text":"b"}`},
		{name: "not an object", tool: "demo_free", args: `[1]`},
		{name: "cashu token", tool: "demo_free", args: `{"text":"hi"}`, mod: func(r *vend.CallRequest) { r.CashuToken = "cashuAabc" }},
		{name: "refund invoice", tool: "demo_free", args: `{"text":"hi"}`, mod: func(r *vend.CallRequest) { r.RefundInvoice = "lnbcrt1x" }},
		{name: "proof of work", tool: "demo_free", args: `{"text":"hi"}`, mod: func(r *vend.CallRequest) { r.WorkRequired = 8 }},
		{name: "prompt", tool: "demo_free", args: `{"text":"hi"}`, mod: func(r *vend.CallRequest) { r.Kind = vend.ItemPrompt }},
		{name: "not raw", tool: "demo_free", args: `{"text":"hi"}`, noRaw: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, rt := newRawHarness(t, nil)
			rt.noRaw = tc.noRaw
			r := req("1", tc.tool, tc.args, nil)
			if tc.mod != nil {
				tc.mod(&r)
			}
			var fastNotes, slowNotes []string
			fr, sr := r, r
			fr.Notify = func(m string, p any) { b, _ := json.Marshal(p); fastNotes = append(fastNotes, m+" "+string(b)) }
			sr.Notify = func(m string, p any) { b, _ := json.Marshal(p); slowNotes = append(slowNotes, m+" "+string(b)) }
			res, ok, err := h.v.CallFree(context.Background(), fr)
			if ok != tc.taken {
				t.Fatalf("taken %v, want %v (%v)", ok, tc.taken, err)
			}
			if !ok {
				if res.Body != nil || err != nil || rt.raw.Load() != 0 || len(rt.sentArgs()) != 0 {
					t.Fatalf("a call not taken did something: %s %v, %d raw calls, sent %v", res.Body, err, rt.raw.Load(), rt.sentArgs())
				}
				return
			}
			want, werr := h.v.CallItem(context.Background(), sr)
			if string(res.Body) != string(want.Body) || res.IsError != want.IsError || (err == nil) != (werr == nil) ||
				err != nil && err.Error() != werr.Error() || errors.Is(err, vend.ErrUpstream) != errors.Is(werr, vend.ErrUpstream) {
				t.Errorf("CallFree: %s %v %v\nCallTool: %s %v %v", res.Body, res.IsError, err, want.Body, want.IsError, werr)
			}
			if strings.Join(fastNotes, "\n") != strings.Join(slowNotes, "\n") {
				t.Errorf("notifications: %q, want %q", fastNotes, slowNotes)
			}
			if sent := rt.sentArgs(); tc.name != "upstream down" && (len(sent) != 2 || sent[0] != sent[1]) {
				t.Errorf("sent upstream: %q", sent)
			}
			if tc.name == "progress" && len(fastNotes) != 1 {
				t.Errorf("progress not forwarded: %q", fastNotes)
			}
		})
	}
}

// TestCallFreeCountsTheRateLimitOnce: a call CallFree serves counts once
// against the rate limit, as through CallTool; one it does not take is not
// counted (CallTool counts it).
func TestCallFreeCountsTheRateLimitOnce(t *testing.T) {
	h, _ := newRawHarness(t, func(c *vend.Config) { c.RequestsPerMinute = 2 })
	ctx := context.Background()
	for i := 0; i < 3; i++ { // refused by the schema: not taken, not counted
		if _, ok, _ := h.v.CallFree(ctx, req("x", "demo_free", `{"text":5}`, nil)); ok {
			t.Fatal("invalid arguments taken")
		}
	}
	for i := 0; i < 2; i++ {
		if _, ok, err := h.v.CallFree(ctx, req("x", "demo_free", `{"text":"hi"}`, nil)); !ok || err != nil {
			t.Fatalf("call %d: %v %v", i, ok, err)
		}
	}
	_, ok, err := h.v.CallFree(ctx, req("x", "demo_free", `{"text":"hi"}`, nil))
	if !ok || !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("third call: taken %v, %v; want ErrLimit", ok, err)
	}
	if _, err := h.v.CallItem(ctx, req("x", "demo_free", `{"text":5}`, nil)); !errors.Is(err, vend.ErrLimit) {
		t.Fatalf("CallTool after the limit: %v, want ErrLimit", err)
	}
}
