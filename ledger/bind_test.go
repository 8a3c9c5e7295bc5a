package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/capvend/capvend/vend"
)

// TestRecordCallRefusesAReusedRequestKey: a request key (transport,
// client, request id) names one call; the same key with another kind,
// server, tool or argument hash is refused and changes nothing, so it can
// never attach to (and be paid, run, replayed as) the recorded call.
func TestRecordCallRefusesAReusedRequestKey(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	orig := newCall(7)
	orig.ToolName, orig.Arguments = "demo_echo", []byte(`{"n":1}`)
	c, created, err := l.RecordCall(ctx, orig)
	if err != nil || !created {
		t.Fatal(created, err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*vend.NewCall)
	}{
		{"another tool", func(nc *vend.NewCall) { nc.Tool = "sha256" }},
		{"another server", func(nc *vend.NewCall) { nc.Server = "other" }},
		{"another kind", func(nc *vend.NewCall) { nc.Kind = vend.KindPrompt }},
		{"other arguments", func(nc *vend.NewCall) { nc.ArgsHash = hash("EXPENSIVE") }},
		{"everything else", func(nc *vend.NewCall) {
			nc.Tool, nc.ArgsHash, nc.Price, nc.ToolName, nc.Arguments = "sha256", hash("EXPENSIVE"), 1_000, "demo_sha256", []byte(`{"text":"EXPENSIVE"}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := orig
			tc.mod(&nc)
			got, created, err := l.RecordCall(ctx, nc)
			if !errors.Is(err, vend.ErrRequestReused) || created || got.ID != 0 {
				t.Fatalf("created=%v call=%+v err=%v, want ErrRequestReused", created, got, err)
			}
		})
	}
	// Nothing changed: the recorded call, its arguments.
	got, err := l.Call(ctx, c.ID)
	if err != nil || got.Binding() != orig.Binding() || got.Price != orig.Price {
		t.Fatalf("call now %+v %v", got, err)
	}
	if name, args, _, err := l.CallArguments(ctx, c.ID); err != nil || name != "demo_echo" || string(args) != `{"n":1}` {
		t.Fatalf("arguments now %s %s %v", name, args, err)
	}
	// The same request again (a price reload in between changes nothing)
	// is a replay of the call.
	again := orig
	again.Price = 42_000
	if got, created, err := l.RecordCall(ctx, again); err != nil || created || got.ID != c.ID {
		t.Fatalf("replay: created=%v call=%+v err=%v", created, got, err)
	}
	mustVerify(t, l)
}

// TestFreeUseIsBoundToItsArguments: a free use is free again only for the
// same tool and arguments; the same request id with anything else is
// refused (not free, not priced under that id), and so is a legacy use
// recorded without an argument hash.
func TestFreeUseIsBoundToItsArguments(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	u := use("c", "7")
	u.ArgsHash = hash("one")
	if !claim(t, l, u) {
		t.Fatal("first use not free")
	}
	if !claim(t, l, u) {
		t.Fatal("the same request again is not free")
	}
	for _, tc := range []struct {
		name string
		mod  func(*vend.FreeUse)
	}{
		{"other arguments", func(u *vend.FreeUse) { u.ArgsHash = hash("two") }},
		{"another tool", func(u *vend.FreeUse) { u.Tool = "reverse" }},
		{"another server", func(u *vend.FreeUse) { u.Server = "other" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := u
			tc.mod(&v)
			free, err := l.ClaimFreeUse(ctx, v)
			if !errors.Is(err, vend.ErrRequestReused) || free {
				t.Fatalf("free=%v err=%v, want ErrRequestReused", free, err)
			}
		})
	}
	// The refused reuses counted nothing: two more uses are free.
	for _, id := range []string{"8", "9"} {
		v := u
		v.RequestID, v.ArgsHash = id, hash(id)
		if !claim(t, l, v) {
			t.Fatalf("request %s not free", id)
		}
	}
	// A priced call under a request id that holds a free use with other
	// parameters is refused too.
	nc := newCall(1)
	nc.Client, nc.RequestID, nc.ArgsHash = "c", "7", hash("EXPENSIVE")
	if _, _, err := l.RecordCall(ctx, nc); !errors.Is(err, vend.ErrRequestReused) {
		t.Fatalf("priced call over a free use: %v", err)
	}
}

// TestLegacyFreeUseNeverMatches: a free use recorded before argument
// hashes were (args_hash NULL) is never a replay of anything.
func TestLegacyFreeUseNeverMatches(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	if err := l.ExecForTest(ctx, `INSERT INTO free_uses (transport, client, request_id, server, tool, day, created_at)
		VALUES ('mcp-http', 'c', 'old', 'demo', 'echo', '2026-11-20', 0)`); err != nil {
		t.Fatal(err)
	}
	u := use("c", "old")
	u.ArgsHash = hash("any")
	if free, err := l.ClaimFreeUse(ctx, u); !errors.Is(err, vend.ErrRequestReused) || free {
		t.Fatalf("free=%v err=%v, want ErrRequestReused", free, err)
	}
}

// TestFindGrantMatchesTheWholeBinding: a grant is found only for exactly
// what it sold.
func TestFindGrantMatchesTheWholeBinding(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, _ := quote(t, l, 1)
	b := c.Binding()
	if got, err := l.FindGrant(ctx, "client-1", b); err != nil || got.ID != c.ID {
		t.Fatalf("grant %+v %v", got, err)
	}
	for _, mod := range []func(*vend.Binding){
		func(b *vend.Binding) { b.Kind = vend.KindPrompt },
		func(b *vend.Binding) { b.Server = "other" },
		func(b *vend.Binding) { b.Tool = "sha256" },
		func(b *vend.Binding) { b.ArgsHash = hash("other") },
	} {
		o := b
		mod(&o)
		if got, err := l.FindGrant(ctx, "client-1", o); !errors.Is(err, vend.ErrNotFound) {
			t.Errorf("%+v found %+v %v", o, got, err)
		}
	}
	if _, err := l.FindGrant(ctx, "client-2", b); !errors.Is(err, vend.ErrNotFound) {
		t.Errorf("another client's grant found: %v", err)
	}
}
