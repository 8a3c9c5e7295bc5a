package ledger_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestGrantTokensAreSchemaRules: a token names one explicit-gating call;
// its hash is unique, hex, and never changed or deleted; an unknown hash
// is ErrNotFound; the call comes back as it is now.
func TestGrantTokensAreSchemaRules(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	expires := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	plain, _ := quote(t, l, 1) // notifications flow: no token may name it
	if err := l.AddGrantToken(ctx, plain.ID, hash("t1"), expires); err == nil {
		t.Fatal("a token for a call without explicit gating was recorded")
	}
	nc := newCall(2)
	nc.ExposedName, nc.Arguments, nc.Explicit = "demo_echo", []byte(`{}`), true
	c, _, err := l.RecordCall(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.RecordPayment(ctx, c.ID, newPayment(2)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "abc", strings.ToUpper(hash("t2")), hash("t2")[:63] + "g"} {
		if err := l.AddGrantToken(ctx, c.ID, bad, expires); err == nil {
			t.Errorf("token hash %q recorded", bad)
		}
	}
	if err := l.AddGrantToken(ctx, c.ID, hash("t2"), expires); err != nil {
		t.Fatal(err)
	}
	if err := l.AddGrantToken(ctx, c.ID, hash("t2"), expires); err == nil {
		t.Fatal("a token hash recorded twice")
	}
	if err := l.AddGrantToken(ctx, c.ID, hash("t3"), expires); err != nil {
		t.Fatalf("a second token of the call (a quoted replay asks again): %v", err)
	}
	got, exp, err := l.GrantByToken(ctx, hash("t2"))
	if err != nil || got.ID != c.ID || got.State != vend.CallAwaitingPayment || !exp.Equal(expires) || got.Binding() != c.Binding() {
		t.Fatalf("GrantByToken: %+v %v %v", got, exp, err)
	}
	if _, _, err := l.GrantByToken(ctx, hash("nope")); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("unknown token: %v", err)
	}
	l.Close()
	db, err := ledger.OpenRawForTest(t, l.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		"UPDATE grant_tokens SET call_id = 1",
		"UPDATE grant_tokens SET expires_at = expires_at + 1",
		"DELETE FROM grant_tokens",
	} {
		if _, err := db.Exec(q); err == nil {
			t.Errorf("%s: allowed", q)
		}
	}
}
