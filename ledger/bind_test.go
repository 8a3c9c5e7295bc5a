package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/migrations"
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
	orig.ExposedName, orig.Arguments = "demo_echo", []byte(`{"n":1}`)
	c, created, err := l.RecordCall(ctx, orig)
	if err != nil || !created {
		t.Fatal(created, err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*vend.NewCall)
	}{
		{"another tool", func(nc *vend.NewCall) { nc.Name = "sha256" }},
		{"another server", func(nc *vend.NewCall) { nc.Server = "other" }},
		{"another kind", func(nc *vend.NewCall) { nc.Kind = vend.ItemPrompt }},
		{"other arguments", func(nc *vend.NewCall) { nc.ArgsHash = hash("EXPENSIVE") }},
		{"everything else", func(nc *vend.NewCall) {
			nc.Name, nc.ArgsHash, nc.Price, nc.ExposedName, nc.Arguments = "sha256", hash("EXPENSIVE"), 1_000, "demo_sha256", []byte(`{"text":"EXPENSIVE"}`)
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
		func(b *vend.Binding) { b.Kind = vend.ItemPrompt },
		func(b *vend.Binding) { b.Server = "other" },
		func(b *vend.Binding) { b.Name = "sha256" },
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

// executionRows returns the execution records of call id: "seq kind
// server tool hash backfilled".
func executionRows(t *testing.T, path string, id vend.CallID) []string {
	t.Helper()
	db, err := ledger.OpenRawForTest(t, path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT seq, kind, server, tool, args_hash, backfilled FROM executions WHERE call_id = ? ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var seq, backfilled int
		var kind, server, tool, h string
		if err := rows.Scan(&seq, &kind, &server, &tool, &h, &backfilled); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d %s %s %s %.8s %d", seq, kind, server, tool, h, backfilled))
	}
	return out
}

// TestExecutionRecordsWhatWasSent: StartExecution and ResumeExecution
// record, in the claim's transaction, what the execution sends upstream;
// one that would send anything but what the call sold is refused and
// changes nothing.
func TestExecutionRecordsWhatWasSent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	c, p := quote(t, l, 1)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	b := c.Binding()
	for _, mod := range []func(*vend.Binding){
		func(b *vend.Binding) { b.Kind = vend.ItemResource },
		func(b *vend.Binding) { b.Server = "other" },
		func(b *vend.Binding) { b.Name = "sha256" },
		func(b *vend.Binding) { b.ArgsHash = hash("EXPENSIVE") },
	} {
		o := b
		mod(&o)
		if _, err := l.StartExecution(ctx, c.ID, o, c.Released(vend.SchemeInvoice)); !errors.Is(err, vend.ErrExecutionMismatch) {
			t.Fatalf("start with %+v: %v, want ErrExecutionMismatch", o, err)
		}
		if got, _ := l.Call(ctx, c.ID); got.State != vend.CallPaid || got.Executions != 0 {
			t.Fatalf("after a refused start: %s, %d executions", got.State, got.Executions)
		}
	}
	if rows := executionRows(t, path, c.ID); len(rows) != 0 {
		t.Fatalf("a refused start recorded %q", rows)
	}
	if _, err := l.StartExecution(ctx, c.ID, b, c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	o := b
	o.ArgsHash = hash("EXPENSIVE")
	if _, err := l.ResumeExecution(ctx, c.ID, o, c.Released(vend.SchemeRecover)); !errors.Is(err, vend.ErrExecutionMismatch) {
		t.Fatalf("resume with other arguments: %v", err)
	}
	if got, err := l.ResumeExecution(ctx, c.ID, b, c.Released(vend.SchemeRecover)); err != nil || got.Executions != 2 {
		t.Fatalf("resume: %+v %v", got, err)
	}
	want := fmt.Sprintf("tool demo echo %.8s 0", b.ArgsHash)
	if rows := executionRows(t, path, c.ID); !slices.Equal(rows, []string{"1 " + want, "2 " + want}) {
		t.Fatalf("executions %q", rows)
	}
	mustVerify(t, l)
}

// legacyLedger makes a ledger file at schema version upTo, as an older
// capvend left it, and returns it open with plain SQL.
func legacyLedger(t *testing.T, path string, upTo int) *sql.DB {
	t.Helper()
	db, err := ledger.OpenRawForTest(t, path+"?_foreign_keys=on")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, q := range []string{fmt.Sprintf("PRAGMA application_id = %d", ledger.ApplicationID),
		"CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	names, _ := fs.Glob(migrations.FS, "*.sql")
	for _, name := range names {
		var v int
		fmt.Sscanf(name, "%d_", &v)
		if v > upTo {
			continue
		}
		body, _ := fs.ReadFile(migrations.FS, name)
		if _, err := db.Exec(string(body)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := db.Exec("INSERT INTO schema_migrations VALUES (?, ?, 0)", v, name); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// TestMigrationBackfillsExecutions: calls that ran before the executions
// record existed get one backfilled row per execution, and the ledger
// verifies.
func TestMigrationBackfillsExecutions(t *testing.T) {
	ledger.SkipOnPostgres(t, "it writes a schema-6 SQLite file by hand; a PostgreSQL ledger is created at the newest schema")
	path := filepath.Join(t.TempDir(), "capvend.db")
	db := legacyLedger(t, path, 6)
	for _, q := range []string{
		`INSERT INTO calls (id, transport, client, request_id, server, tool, args_hash, price_msat, state, executions, created_at, updated_at, kind)
			VALUES (1, 't', 'c', '1', 'demo', 'echo', '` + hash("a") + `', 1000, 'executing', 2, 10, 20, 'tool'),
			(2, 't', 'c', '2', 'demo', 'page', '` + hash("b") + `', 1000, 'paid', 0, 10, 20, 'resource')`,
		`INSERT INTO payments (id, backend, kind, ref, call_id, amount_msat, state, expires_at, created_at, updated_at, settled_at, settled_msat)
			VALUES (1, 'lnd', 'invoice', '` + hash("p1") + `', 1, 1000, 'settled', 99, 10, 15, 15, 1000),
			(2, 'lnd', 'invoice', '` + hash("p2") + `', 2, 1000, 'settled', 99, 10, 15, 15, 1000)`,
		`INSERT INTO payment_claims (payment_id, call_id, claimed_at) VALUES (1, 1, 17)`,
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
	want := fmt.Sprintf("tool demo echo %.8s 1", hash("a"))
	if rows := executionRows(t, path, 1); !slices.Equal(rows, []string{"1 " + want, "2 " + want}) {
		t.Fatalf("backfilled %q", rows)
	}
	if rows := executionRows(t, path, 2); len(rows) != 0 {
		t.Fatalf("a call that never ran got %q", rows)
	}
	// Only the migration writes backfilled rows.
	if err := l.ExecForTest(context.Background(), `INSERT INTO executions (call_id, seq, kind, server, tool, args_hash, started_at, backfilled)
		VALUES (1, 3, 'tool', 'demo', 'echo', ?, 0, 1)`, hash("a")); err == nil {
		t.Fatal("a backfilled row was inserted after the migration")
	}
}
