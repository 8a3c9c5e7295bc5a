package capvendtest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// BookCalls books n calls of 21 sat on l, paid by LND invoice and
// delivered with a 2 KB answer, their request ids from r<from>. With
// refunds, the last one awaits its payment instead and the one before
// was paid but its tool failed and it was refunded (a refund owed).
func BookCalls(t testing.TB, l *ledger.Ledger, from, n int, refunds bool) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < from+n; i++ {
		c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: fmt.Sprint("r", i),
			Server: "demo", Name: "echo", ArgsHash: fmt.Sprintf("%064x", i), Price: 21_000, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
			Ref: fmt.Sprintf("%064x", 1000+i), Bolt11: "lnbcrt210n1test", Amount: 21_000, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if refunds && i == from+n-1 {
			continue // awaiting payment
		}
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			t.Fatal(err)
		}
		if refunds && i == from+n-2 {
			if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{"content":[],"isError":true}`)}, "upstream failed"); err != nil {
				t.Fatal(err)
			}
			if err := l.Refund(ctx, c.ID, "upstream failed"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		body := fmt.Sprintf(`{"content":[{"type":"text","text":"%s"}]}`, strings.Repeat("a", 2000))
		if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
}

// CountCalls is how many calls the ledger file at path holds.
func CountCalls(t testing.TB, path string) int {
	t.Helper()
	l, err := ledger.Open(context.Background(), path, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	calls, err := l.CallsIn(context.Background(), vend.CallStates()...)
	if err != nil {
		t.Fatal(err)
	}
	return len(calls)
}

// PaidRuns verifies the ledger at db and checks that every call that ran
// ran once, delivered, for one settled payment covering its price; it
// returns how many ran.
func PaidRuns(t testing.TB, db string) int {
	t.Helper()
	ctx := context.Background()
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ledgerkit.Verify(t, l)
	calls, err := l.CallsIn(ctx, vend.CallStates()...)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range calls {
		if c.Executions == 0 {
			continue
		}
		ran++
		ps, _ := l.CallPayments(ctx, c.ID)
		if c.State != vend.CallDelivered || c.Executions != 1 || len(ps) != 1 || ps[0].State != vend.PaymentSettled || ps[0].Settled < c.Price {
			t.Errorf("call %d: %s, %d executions, payments %+v", c.ID, c.State, c.Executions, ps)
		}
	}
	return ran
}

// ReleasedBy is the scheme the ledger recorded as releasing call id's
// execution.
func ReleasedBy(t testing.TB, db string, id vend.CallID) string {
	t.Helper()
	d, err := sql.Open("sqlite3", db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var by sql.NullString
	if err := d.QueryRow(`SELECT released_by FROM executions WHERE call_id = ?`, int64(id)).Scan(&by); err != nil {
		t.Fatal(err)
	}
	return by.String
}

// OwedRefund books a call paid by a plain invoice whose tool failed: a
// refund owed to client, to invoice if given.
func OwedRefund(t testing.TB, l *ledger.Ledger, i int, client, invoice string) vend.Refund {
	t.Helper()
	ctx := context.Background()
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: client, RequestID: fmt.Sprint(i), Server: "tools",
		Name: "always_fails", ArgsHash: strings.Repeat(fmt.Sprintf("%02x", i), 32), Price: 5_000, RefundInvoice: invoice})
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.Repeat(fmt.Sprintf("%02x", 100+i), 32)
	if _, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref,
		Amount: 5_000, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := l.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: 5_000}); return err },
		func() error {
			_, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
			return err
		},
		func() error {
			return l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte("{}")}, "the tool failed")
		},
		func() error { return l.Refund(ctx, c.ID, "the tool failed") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := l.CallRefund(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// WaitCall waits until the ledger's only call is in state want.
func WaitCall(t testing.TB, l *ledger.Ledger, want vend.CallState) vend.Call {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := l.Call(context.Background(), 1)
		if err == nil && c.State == want {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("call is %s (%v), want %s", c.State, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitLeaseHolder waits until the work lease is held by an instance of
// process pid (want true) or by one of another process (want false), and
// returns the holder.
func WaitLeaseHolder(t testing.TB, l *ledger.Ledger, pid int, want bool, guard time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(guard) // a deadlock guard
	for {
		h, err := l.LeaseHolder(context.Background(), vend.LeaseWork)
		if err == nil && h != "" && strings.Contains(h, fmt.Sprintf("/%d/", pid)) == want {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("work lease held by %q (%v); want pid %d: %v", h, err, pid, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
