package vend_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// TestReusedRequestIDIsRefused is issue 11's first hole at the
// mechanism: request 7 is quoted for a 1-sat call, the client drops, and
// sends request 7 again as a 21-sat call (or the same tool with other
// arguments). The second request is refused with ErrRequestReused at once:
// it never attaches to the first call's invoice. Paying that invoice runs
// the first call with its own, stored arguments; nothing else runs.
func TestReusedRequestIDIsRefused(t *testing.T) {
	for _, tc := range []struct{ name, tool, args string }{
		{"another tool", "demo_echo", `{"text":"EXPENSIVE"}`},
		{"other arguments", "demo_free", `{"text":"EXPENSIVE"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"free": {Price: 1_000}, "echo": {Price: 21_000}}))
			ctx, cancel := context.WithCancel(context.Background())
			first := make(chan error, 1)
			go func() {
				_, err := h.v.CallItem(ctx, req("7", "demo_free", `{"text":"1"}`, nil))
				first <- err
			}()
			p := h.nextPayment(t)
			if p.Amount != 1_000 {
				t.Fatalf("quoted %d msat", p.Amount)
			}
			cancel() // the client drops the stream
			if err := <-first; !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			o := result(t, h.callAsync(req("7", tc.tool, tc.args, nil)))
			if !errors.Is(o.err, vend.ErrRequestReused) {
				t.Fatalf("reused request id: %s %v, want ErrRequestReused", o.res.Body, o.err)
			}
			select {
			case p := <-h.be.last:
				t.Fatalf("the reused id was quoted: %+v", p)
			default:
			}
			h.be.pay(p.Ref) // the first invoice is paid after all: the first call runs
			waitState(t, h.l, p.CallID, vend.CallDelivered)
			if got := h.tools.sentArgs(); !slices.Equal(got, []string{`free {"text":"1"}`}) {
				t.Fatalf("sent upstream: %q", got)
			}
			res, err := h.v.CallItem(context.Background(), req("7", "demo_free", `{"text":"1"}`, nil))
			if err != nil || string(res.Body) != `{"content":[{"type":"text","text":"echo:1"}]}` {
				t.Fatalf("replay of the first call: %s %v", res.Body, err)
			}
			verify(t, h.l)
		})
	}
}

// TestFreeQuotaIsNotReplayableWithOtherArguments is issue 11's third
// hole: with one free call a day, the same request id with other
// arguments is refused, not answered free again.
func TestFreeQuotaIsNotReplayableWithOtherArguments(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{"echo": {Price: 21_000, FreePerDay: 1}}))
	ctx := context.Background()
	if _, err := h.v.CallItem(ctx, req("f", "demo_echo", `{"text":"a"}`, nil)); err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"b", "c"} {
		res, err := h.v.CallItem(ctx, req("f", "demo_echo", `{"text":"`+text+`"}`, nil))
		if !errors.Is(err, vend.ErrRequestReused) {
			t.Fatalf("text %s: %s %v, want ErrRequestReused", text, res.Body, err)
		}
	}
	if got := h.tools.sentArgs(); !slices.Equal(got, []string{`echo {"text":"a"}`}) {
		t.Fatalf("sent upstream: %q", got)
	}
	select {
	case p := <-h.be.last:
		t.Fatalf("quoted: %+v", p)
	default:
	}
}

// remapTools serves the exposed name demo_echo from the upstream tool
// "fail" once moved is set: a reload that points a name elsewhere.
type remapTools struct {
	*fakeTools
	moved atomic.Bool
}

func (r *remapTools) Tools() []vend.Item {
	ts := r.fakeTools.Tools()
	if r.moved.Load() {
		ts[0].UpstreamName = "fail" // demo_echo
	}
	return ts
}

// TestGrantIsBoundToWhatWasPaidFor: an explicit-gating grant is released
// only to a repeat that asks for exactly what was paid for (kind, server,
// upstream tool, arguments), found by the client or by the preimage. The
// same exposed name and arguments now served by another upstream tool do
// not use it.
func TestGrantIsBoundToWhatWasPaidFor(t *testing.T) {
	for _, byPreimage := range []bool{false, true} {
		t.Run(map[bool]string{false: "by client", true: "by preimage"}[byPreimage], func(t *testing.T) {
			tools := &remapTools{fakeTools: &fakeTools{}}
			h := newHarness(t, false, func(c *vend.Config) { c.Tools = tools })
			r := req("1", "demo_echo", `{"text":"g"}`, nil)
			r.Explicit = true
			var pr *vend.PaymentRequiredError
			if _, err := h.v.CallItem(context.Background(), r); !errors.As(err, &pr) {
				t.Fatal(err)
			}
			p := h.nextPayment(t)
			h.be.pay(p.Ref)
			tools.moved.Store(true)
			r.RequestID = "2"
			if byPreimage {
				h.be.mu.Lock()
				r.PaymentProof = h.be.preimages[p.Ref]
				h.be.mu.Unlock()
			}
			res, err := h.v.CallItem(context.Background(), r)
			if !errors.As(err, &pr) || pr.Options[0].Amount != 10 {
				t.Fatalf("repeat for another upstream tool: %s %v, want a new 10-sat quote", res.Body, err)
			}
			if got := tools.sentArgs(); len(got) != 0 {
				t.Fatalf("ran %q on the grant", got)
			}
			if c, _ := h.l.Call(context.Background(), p.CallID); c.State != vend.CallPaid {
				t.Fatalf("the grant is %s, want paid (unused)", c.State)
			}
		})
	}
}

// TestArgumentsAreParsedOnceStrictly: an arguments object with a
// duplicate key, or keys that differ only in case, at any depth, is
// refused (-32602) before anything is quoted: a validator, a price rule
// and an upstream could each read a different one of them. What is
// forwarded upstream is the one re-encoding of the parsed arguments that
// was validated, priced and hashed.
func TestArgumentsAreParsedOnceStrictly(t *testing.T) {
	h := newHarness(t, false, withPrices(t, map[string]pricing.Rule{
		"free": {Price: 0},
		"echo": {Price: 1_000, Per: &pricing.Per{Arg: "text", Kind: pricing.PerKB, Price: 1_000_000}},
	}))
	ctx := context.Background()
	for _, args := range []string{
		`{"text":"a","text":"` + strings.Repeat("x", 90) + `"}`,
		`{"text":"a","Text":"b"}`,
		`{"text":"a","TEXT":"b"}`,
		`{"text":"a","o":{"k":1,"K":2}}`,
		`{"text":"a","o":{"k":1,"k":1}}`,
		`{"text":"a","l":[1,{"x":1,"x":2}]}`,
		`{"text":"a","ſ":1,"s":2}`, // U+017F folds to s
		`{"text":"a","K":1,"k":2}`, // U+212A KELVIN SIGN folds to k
		`{"text":"a"} {"text":"b"}`,
	} {
		for _, tool := range []string{"demo_echo", "demo_free"} {
			_, err := h.v.CallItem(ctx, req("x", tool, args, nil))
			var ip *vend.InvalidParamsError
			if !errors.As(err, &ip) {
				t.Errorf("%s %s: %v, want invalid params", tool, args, err)
			}
		}
	}
	if got := h.tools.sentArgs(); len(got) != 0 {
		t.Fatalf("sent upstream: %q", got)
	}
	select {
	case p := <-h.be.last:
		t.Fatalf("quoted: %+v", p)
	default:
	}
	// A well-formed object is re-encoded once (compact, keys sorted,
	// numbers and strings as sent) and that is what runs.
	res, err := h.v.CallItem(ctx, req("y", "demo_free", ` { "z" : 1.50, "text" : "a<b", "o" : { "b" : [ 1e3 ] , "a" : null } } `, nil))
	if err != nil {
		t.Fatalf("%s %v", res.Body, err)
	}
	if got := h.tools.sentArgs(); !slices.Equal(got, []string{`free {"o":{"a":null,"b":[1e3]},"text":"a<b","z":1.50}`}) {
		t.Fatalf("sent upstream: %q", got)
	}
}

// TestExecutionUsesTheStoredArguments: whatever path runs a recorded
// call (a replay that waited for the payment, an explicit-gating grant),
// it runs with the arguments recorded with the call, never the live
// request's (which may hash the same and still be other bytes).
func TestExecutionUsesTheStoredArguments(t *testing.T) {
	t.Run("replay", func(t *testing.T) {
		h := newHarness(t, false, nil)
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			_, err := h.v.CallItem(ctx, req("5", "demo_echo", `{"text":"a","n":2}`, nil))
			first <- err
		}()
		p := h.nextPayment(t)
		cancel()
		<-first
		ch := h.callAsync(req("5", "demo_echo", `{"n":2.0,"text":"a"}`, nil)) // the same call, spelled otherwise
		waitWaiting(t, h, p.Ref)
		h.be.pay(p.Ref)
		if o := result(t, ch); o.err != nil {
			t.Fatal(o.err)
		}
		if got := h.tools.sentArgs(); !slices.Equal(got, []string{`echo {"n":2,"text":"a"}`}) {
			t.Fatalf("sent upstream: %q", got)
		}
	})
	t.Run("grant", func(t *testing.T) {
		h := newHarness(t, false, nil)
		r := req("1", "demo_echo", `{"text":"g","n":2}`, nil)
		r.Explicit = true
		h.v.CallItem(context.Background(), r)
		h.be.pay(h.nextPayment(t).Ref)
		r.RequestID, r.Arguments = "2", json.RawMessage(`{"n":2e0,"text":"g"}`)
		if res, err := h.v.CallItem(context.Background(), r); err != nil {
			t.Fatalf("%s %v", res.Body, err)
		}
		if got := h.tools.sentArgs(); !slices.Equal(got, []string{`echo {"n":2,"text":"g"}`}) {
			t.Fatalf("sent upstream: %q", got)
		}
	})
}

// waitWaiting waits until a request waits for the payment ref (the
// Vendor registered it), so that paying reaches it rather than the
// orphan path.
func waitWaiting(t *testing.T, h *harness, ref string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !h.v.WaitingForTest(ref) {
		if time.Now().After(deadline) {
			t.Fatal("nobody waits for the payment")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestExecutionIsBoundToTheCall: what is sent upstream must be exactly
// what the call sold. A paid call whose exposed name now leads to another
// upstream tool is not run (neither tool runs on its payment): it is
// refunded.
func TestExecutionIsBoundToTheCall(t *testing.T) {
	tools := &remapTools{fakeTools: &fakeTools{}}
	h := newHarness(t, false, func(c *vend.Config) { c.Tools = tools })
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := h.v.CallItem(ctx, req("1", "demo_echo", `{"text":"x"}`, nil))
		first <- err
	}()
	p := h.nextPayment(t)
	cancel()
	<-first
	tools.moved.Store(true)
	h.be.pay(p.Ref) // nobody waits: the paid call is run from the ledger
	c := waitState(t, h.l, p.CallID, vend.CallRefunded)
	if got := tools.sentArgs(); len(got) != 0 || c.Executions != 0 {
		t.Fatalf("sent upstream: %q, executions %d", got, c.Executions)
	}
	b, _ := h.l.Balance(context.Background())
	if b.Pending.RefundsOwed != 21_000 {
		t.Fatalf("refunds owed %d msat, want 21000", b.Pending.RefundsOwed)
	}
	verify(t, h.l)
}
