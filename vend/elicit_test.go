package vend_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
)

// An upstream's elicitation during a call reaches the request's Elicit, in
// free and paid calls alike; a paid call is paid and run once.
func TestElicitReachesTheToolSource(t *testing.T) {
	h := newHarness(t, false, nil)
	var asked atomic.Int32
	elicit := func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		asked.Add(1)
		if string(params) != `{"message":"sure?"}` {
			t.Errorf("params %s", params)
		}
		return json.RawMessage(`{"action":"accept"}`), nil
	}
	want := `echo:{\"action\":\"accept\"}`

	r := req("1", "demo_free", `{"text":"elicit"}`, nil)
	r.Elicit = elicit
	res, err := h.v.CallItem(context.Background(), r)
	if err != nil || !strings.Contains(string(res.Body), want) {
		t.Fatalf("free: %s %v", res.Body, err)
	}

	r = req("2", "demo_echo", `{"text":"elicit"}`, &notes{})
	r.Elicit = elicit
	ch := h.callAsync(r)
	h.be.pay(h.nextPayment(t).Ref)
	o := result(t, ch)
	if o.err != nil || !strings.Contains(string(o.res.Body), want) {
		t.Fatalf("paid: %s %v", o.res.Body, o.err)
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("Elicit called %d times, want 2", n)
	}
	if n := h.tools.count("echo"); n != 1 {
		t.Errorf("paid tool ran %d times", n)
	}
	verify(t, h.l)

	// Without Elicit the ToolSource finds none.
	res, err = h.v.CallItem(context.Background(), req("3", "demo_free", `{"text":"elicit"}`, nil))
	if err != nil || !strings.Contains(string(res.Body), "echo:no elicit") {
		t.Fatalf("no elicit: %s %v", res.Body, err)
	}
}
