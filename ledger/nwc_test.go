package ledger_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// TestNWCPayments: an NWC connection's payments are recorded under its
// name, land in its own asset account, and a wallet's plain invoice that
// capvend canceled but the wallet still took is booked and owed back.
func TestNWCPayments(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	for _, tc := range []struct {
		name    string
		backend vend.Backend
		kind    vend.PaymentKind
		ok      bool
	}{
		{"default connection, plain", vend.NWCBackend(""), vend.KindWalletInvoice, true},
		{"named connection, hold", vend.NWCBackend("alby-hub_2"), vend.KindHoldInvoice, true},
		{"nwc cannot issue an LND invoice", vend.BackendNWC, vend.KindInvoice, false},
		{"lnd cannot issue a wallet invoice", vend.BackendLND, vend.KindWalletInvoice, false},
		{"bad name", vend.Backend("nwc:Alby Hub"), vend.KindWalletInvoice, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := len(tc.name)*100 + int(tc.name[0])
			c, _, err := l.RecordCall(ctx, newCall(i))
			if err != nil {
				t.Fatal(err)
			}
			np := newPayment(i)
			np.Backend, np.Kind = tc.backend, tc.kind
			if tc.kind == vend.KindHoldInvoice {
				np.HoldPreimage = make([]byte, 32)
			}
			_, err = l.RecordPayment(ctx, c.ID, np)
			if (err == nil) != tc.ok {
				t.Fatalf("record %s %s: %v", tc.backend, tc.kind, err)
			}
			if err := l.CancelQuote(ctx, c.ID, "test"); err != nil && !errors.Is(err, vend.ErrIllegalTransition) {
				t.Fatal(err)
			}
		})
	}
	ps, err := l.UnsettledPayments(ctx, vend.NWCBackend("alby-hub_2"))
	if err != nil || len(ps) != 1 || ps[0].Kind != vend.KindHoldInvoice {
		t.Fatalf("the named connection's unsettled payments: %+v %v", ps, err)
	}

	// Paid after capvend canceled it: booked into the wallet's account,
	// owed back, and the call never runs.
	c, _, _ := l.RecordCall(ctx, newCall(1))
	np := newPayment(1)
	np.Backend, np.Kind = vend.BackendNWC, vend.KindWalletInvoice
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EndPayment(ctx, p.Ref, vend.PaymentCanceled, "client gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatalf("late settlement of a wallet invoice: %v", err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); !errors.Is(err, vend.ErrAlreadySettled) {
		t.Fatalf("second late settlement: %v", err)
	}
	if s := callState(t, l, c.ID); s != vend.CallCanceled {
		t.Fatalf("call is %s, want canceled", s)
	}
	b, _ := l.Balance(ctx)
	if b.Pending.RefundsOwed != p.Amount {
		t.Fatalf("refunds owed %d, want %d", b.Pending.RefundsOwed, p.Amount)
	}
	acc, _ := l.AccountBalances(ctx, "assets:lightning:")
	if acc[ledger.NWCAccount(vend.BackendNWC)] != p.Amount || acc[ledger.AccountLND] != 0 {
		t.Fatalf("asset accounts %v", acc)
	}
	mustVerify(t, l)
}

// TestMigrationToNWCKeepsPayments: schema 26 rebuilds payments to widen
// its CHECKs; a ledger of schema 24 keeps every payment under its id, and
// the rows that reference them stay valid.
func TestMigrationToNWCKeepsPayments(t *testing.T) {
	ledger.SkipOnPostgres(t, "it writes a schema-24 SQLite file by hand; a PostgreSQL ledger is created at the newest schema")
	path := filepath.Join(t.TempDir(), "capvend.db")
	db := legacyLedger(t, path, 24)
	for _, q := range []string{
		`INSERT INTO calls (id, transport, client, request_id, server, tool, args_hash, price_msat, state, executions, created_at, updated_at, kind)
			VALUES (1, 't', 'c', '1', 'demo', 'echo', '` + hash("a") + `', 1000, 'paid', 0, 10, 20, 'tool'),
			(2, 't', 'c', '2', 'demo', 'echo', '` + hash("b") + `', 1000, 'quoted', 0, 10, 20, 'tool')`,
		`INSERT INTO payments (id, backend, kind, ref, call_id, amount_msat, state, expires_at, created_at, updated_at, settled_at, settled_msat)
			VALUES (7, 'lnd', 'invoice', '` + hash("p1") + `', 1, 1000, 'settled', 99, 10, 15, 15, 1000)`,
		`INSERT INTO payment_claims (payment_id, call_id, claimed_at) VALUES (7, 1, 17)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	l, err := ledger.OpenForTest(t, context.Background(), path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := l.Payment(context.Background(), hash("p1"))
	if err != nil || p.ID != 7 || p.State != vend.PaymentSettled || p.CallID != 1 {
		t.Fatalf("payment after the migration: %+v %v", p, err)
	}
	// The rebuilt table keeps its rules: payments are never deleted.
	if err := l.ExecForTest(context.Background(), `DELETE FROM payments WHERE id = 7`); err == nil {
		t.Fatal("a payment was deleted after the migration")
	}
	if err := l.ExecForTest(context.Background(), `INSERT INTO payment_claims (payment_id, call_id, claimed_at) VALUES (99, 2, 1)`); err == nil {
		t.Fatal("a claim of a payment that does not exist was inserted: foreign keys are off")
	}
}
