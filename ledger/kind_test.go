package ledger_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestCallKind: a call records what it sold, reads it back (a call
// recorded without a kind is a tool call), survives a reopen, refuses an
// unknown kind, and books its income to the kind's account.
func TestCallKind(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	for i, k := range []vend.ItemKind{"", vend.ItemTool, vend.ItemPrompt, vend.ItemResource} {
		nc := newCall(i + 1)
		nc.Kind = k
		c, _, err := l.RecordCall(ctx, nc)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := c.Kind, k.Or(); got != want {
			t.Errorf("call %d: kind %q, want %q", i+1, got, want)
		}
	}
	bad := newCall(9)
	bad.Kind = "song"
	if _, _, err := l.RecordCall(ctx, bad); err == nil {
		t.Error("a call of kind song was recorded")
	}
	// The prompt call is paid: its income goes to income:prompts.
	ps, err := l.RecordPayment(ctx, 3, newPayment(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: ps.Ref, Amount: ps.Amount}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openLedger(t, path)
	c, err := l.Call(ctx, 4)
	if err != nil || c.Kind != vend.ItemResource {
		t.Fatalf("after reopen: call 4 kind %q, %v", c.Kind, err)
	}
	b, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := ledger.ItemIncomeAccount(vend.ItemPrompt, newCall(3).Server, newCall(3).Name)
	if len(b.Tools) != 1 || b.Tools[0].Account != want || b.Tools[0].Revenue != ps.Amount {
		t.Fatalf("revenue %+v, want %s: %d", b.Tools, want, ps.Amount)
	}
}

func TestItemIncomeAccount(t *testing.T) {
	for _, c := range []struct {
		kind         vend.ItemKind
		server, name string
		want         string
	}{
		{"", "demo", "echo", "income:tools:demo:echo"},
		{vend.ItemTool, "demo", "echo", "income:tools:demo:echo"},
		{vend.ItemPrompt, "demo", "summarize", "income:prompts:demo:summarize"},
		{vend.ItemResource, "demo", "docs://guide", "income:resources:demo:docs---guide"},
	} {
		if got := ledger.ItemIncomeAccount(c.kind, c.server, c.name); got != c.want {
			t.Errorf("ItemIncomeAccount(%q, %q, %q) = %q, want %q", c.kind, c.server, c.name, got, c.want)
		}
	}
}
