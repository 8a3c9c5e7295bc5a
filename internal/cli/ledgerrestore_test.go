package cli

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/replica"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// caughtUp waits until doctor's replica check finds no lag.
func caughtUp(t testing.TB, cfg *Config) outcome {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		o := checkReplica(context.Background(), cfg, time.Now())
		if o.status == "ok" && strings.HasPrefix(o.detail, "lag 0s") {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not catch up: %+v", o)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestLedgerRestoreFromFileReplica runs Litestream beside a ledger in use
// with the configuration `capvend ledger litestream-config` writes, to a
// file:// replica: doctor sees the replica catch up and then lag when
// replication stops; `capvend ledger restore` brings back the newest state
// and a point in time, verified, settles the unfinished call, refuses to
// overwrite a file or to restore beside an old ledger's -wal; and after a
// restore into ledger.path, Litestream replicates the restored ledger on.
func TestLedgerRestoreFromFileReplica(t *testing.T) {
	bin := capvendtest.Litestream(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	yaml := fmt.Sprintf("ledger:\n  path: capvend.db\n  replica: file://%s\n  litestream: %s\nserver:\n  name: t\n",
		filepath.Join(dir, "replica"), bin)
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(filepath.Join(dir, "capvend.yaml"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := ledger.Open(ctx, db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	capvendtest.BookCalls(t, l, 0, 6, true) // 4 delivered, 1 refunded, 1 awaiting payment

	capvendIn(t, dir, nil, "ledger", "litestream-config", "--out", "litestream.yml")
	ly, _ := os.ReadFile(filepath.Join(dir, "litestream.yml"))
	if !strings.Contains(string(ly), db) || !strings.Contains(string(ly), "file://"+filepath.Join(dir, "replica")) {
		t.Fatalf("litestream.yml:\n%s", ly)
	}
	stop := capvendtest.Replicating(t, bin, filepath.Join(dir, "litestream.yml"))
	o := caughtUp(t, cfg)
	t.Logf("doctor: %s: %s", o.name, o.detail)

	// A point in time between two batches (LTX files are listed to the
	// second; Litestream restores the last change at or before it).
	time.Sleep(1100 * time.Millisecond)
	point := time.Now()
	time.Sleep(1100 * time.Millisecond)
	capvendtest.BookCalls(t, l, 100, 3, false)
	caughtUp(t, cfg)

	out := capvendIn(t, dir, nil, "ledger", "restore", "--to", "restored/latest.db")
	if !strings.Contains(out, "1 canceled, 0 refunded, 0 failed") || !strings.Contains(out, "checks passed") {
		t.Fatalf("restore:\n%s", out)
	}
	latest := filepath.Join(dir, "restored", "latest.db")
	if st, err := os.Stat(latest); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("restored file: %v %v", st, err)
	}
	if n := capvendtest.CountCalls(t, latest); n != 9 {
		t.Fatalf("the newest state holds %d calls, want 9", n)
	}
	capvendIn(t, dir, nil, "ledger", "restore", "--to", "restored/then.db", "--at", point.UTC().Format(time.RFC3339Nano))
	if n := capvendtest.CountCalls(t, filepath.Join(dir, "restored", "then.db")); n != 6 {
		t.Fatalf("the state as of %s holds %d calls, want 6", point, n)
	}
	before, _ := os.ReadFile(latest)
	if out := capvendFails(t, dir, "ledger", "restore", "--to", "restored/latest.db"); !strings.Contains(out, "refusing to overwrite") {
		t.Fatalf("restore over a file:\n%s", out)
	}
	if after, _ := os.ReadFile(latest); !bytes.Equal(before, after) {
		t.Fatal("the refused restore changed the file")
	}
	if err := os.WriteFile(filepath.Join(dir, "restored", "x.db-wal"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := capvendFails(t, dir, "ledger", "restore", "--to", "restored/x.db"); !strings.Contains(out, "x.db-wal exists") {
		t.Fatalf("restore beside a stale -wal:\n%s", out)
	}

	// Replication stops; the books change: doctor reports the lag.
	stop()
	time.Sleep(replicaLagWarn + 1100*time.Millisecond)
	capvendtest.BookCalls(t, l, 200, 1, false)
	if o := checkReplica(ctx, cfg, time.Now()); o.status != "WARN" || !strings.Contains(o.detail, "lag ") {
		t.Fatalf("doctor after replication stopped: %+v", o)
	}

	// Disaster: the ledger is lost with its -wal, -shm and Litestream's
	// folder; restore it into ledger.path, and replication goes on.
	l.Close()
	for _, p := range []string{db, db + "-wal", db + "-shm", filepath.Join(dir, ".capvend.db-litestream")} {
		os.RemoveAll(p)
	}
	capvendIn(t, dir, nil, "ledger", "restore", "--to", "capvend.db")
	if n := capvendtest.CountCalls(t, db); n != 9 {
		t.Fatalf("the restored ledger holds %d calls, want 9 (the last one was never replicated)", n)
	}
	if l, err = ledger.Open(ctx, db, ledger.Options{MustExist: true}); err != nil {
		t.Fatal(err)
	}
	capvendtest.BookCalls(t, l, 300, 2, false)
	capvendtest.Replicating(t, bin, filepath.Join(dir, "litestream.yml"))
	caughtUp(t, cfg)
	capvendIn(t, dir, nil, "ledger", "restore", "--to", "restored/after.db")
	if n := capvendtest.CountCalls(t, filepath.Join(dir, "restored", "after.db")); n != 11 {
		t.Fatalf("after the restore, the replica holds %d calls, want 11", n)
	}
	if out := capvendIn(t, dir, nil, "ledger", "verify", "--db", "restored/after.db"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify:\n%s", out)
	}
}

// TestReplicaSettings: ledger.replica is checked when the configuration
// loads, and its credentials file is a secret like the others: serve
// refuses to start while others may read it, naming it, never its text.
func TestReplicaSettings(t *testing.T) {
	for _, tc := range []struct {
		name, ledger, err string
	}{
		{"file", "  replica: file:///var/backups/capvend\n", ""},
		{"s3 with credentials", "  replica: s3://bucket/capvend?endpoint=http://127.0.0.1:9000\n  replica_credentials_file: replica.env\n", ""},
		{"relative file", "  replica: file://backups\n", "ledger.replica: "},
		{"another scheme", "  replica: gs://bucket/capvend\n", "ledger.replica: "},
		{"credentials without a replica", "  replica_credentials_file: replica.env\n", "ledger.replica_credentials_file: set without ledger.replica"},
		{"credentials for a file replica", "  replica: file:///var/backups/capvend\n  replica_credentials_file: replica.env\n", "takes no credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "capvend.yaml")
			if err := os.WriteFile(path, []byte("ledger:\n  path: capvend.db\n"+tc.ledger+"server:\n  name: t\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := loadConfig(path, func(string) string { return "" })
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("loadConfig: %v, want %q", err, tc.err)
			}
		})
	}
	t.Run("credentials others can read", func(t *testing.T) {
		dir := t.TempDir()
		env := filepath.Join(dir, "replica.env")
		if err := os.WriteFile(env, []byte("AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY=s3cr3t\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, "capvend.yaml")
		body := "ledger:\n  path: capvend.db\n  replica: s3://bucket/capvend\n  replica_credentials_file: replica.env\nserver:\n  name: t\nhttp:\n  listen: 127.0.0.1:0\n"
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, errOut, code := run(t, nil, "serve", "--config", cfg)
		if code != 1 || !strings.Contains(errOut, "ledger.replica_credentials_file:") || !strings.Contains(errOut, "chmod 600 "+env) ||
			strings.Contains(errOut, "s3cr3t") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut)
		}
		_, errOut, code = run(t, nil, "ledger", "restore", "--config", cfg, "--to", filepath.Join(dir, "r.db"))
		if code == 0 || !strings.Contains(errOut, "chmod 600 "+env) {
			t.Fatalf("restore: exit %d, stderr:\n%s", code, errOut)
		}
	})
}

// drillBatch writes batch b's money to l the way serve does: two calls
// paid by invoice and delivered, one paid, failed and refunded (owed
// back), a top-up of 100 sats to a credit account and two calls drawn
// from it and delivered. Every call ends final, so the replicated state
// is what a restore must give back row for row.
func drillBatch(t *testing.T, l *ledger.Ledger, b int) {
	t.Helper()
	ctx := context.Background()
	call := func(i int, server, tool string, price vend.Msat) vend.NewCall {
		return vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: fmt.Sprintf("b%d-%d", b, i),
			Server: server, Name: tool, ArgsHash: fmt.Sprintf("%032x%032x", b, i), Price: price, Idempotent: true}
	}
	ok := vend.Result{Body: []byte(fmt.Sprintf(`{"content":[{"type":"text","text":"batch %d"}]}`, b))}
	paid := func(nc vend.NewCall, ref int) vend.Call {
		c, _, err := l.RecordCall(ctx, nc)
		if err != nil {
			t.Fatal(err)
		}
		if nc.Server == vend.CreditServer {
			if err := l.BindTopUp(ctx, c.ID, drillAccount); err != nil {
				t.Fatal(err)
			}
		}
		p, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
			Ref: fmt.Sprintf("%064x", 100*b+ref), Bolt11: "lnbcrt1test", Amount: nc.Price, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	for i := range 2 {
		if err := l.Deliver(ctx, paid(call(i, "demo", "echo", 21_000), i).ID, ok); err != nil {
			t.Fatal(err)
		}
	}
	failed := paid(call(2, "demo", "echo", 21_000), 2)
	if err := l.Fail(ctx, failed.ID, vend.Result{IsError: true, Body: []byte(`{"content":[],"isError":true}`)}, "upstream failed"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, failed.ID, "upstream failed"); err != nil {
		t.Fatal(err)
	}
	if err := l.Deliver(ctx, paid(call(3, vend.CreditServer, "topup", 100_000), 3).ID, ok); err != nil {
		t.Fatal(err)
	}
	for i := 4; i < 6; i++ {
		nc := call(i, "demo", "echo", 21_000)
		c, _, _, err := l.RecordCreditCall(ctx, nc, drillAccount, nc.Binding(), nc.Released(vend.SchemeCreditToken))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Deliver(ctx, c.ID, ok); err != nil {
			t.Fatal(err)
		}
	}
}

const drillAccount = "t0123456789abcdef01234567"

// moneyTables are the tables of the money records the drill compares:
// calls and their history, payments and theirs, the journal (entries,
// postings, accounts), executions, refunds, credit, stored answers.
var moneyTables = []string{"calls", "call_transitions", "payments", "payment_transitions", "entries", "postings",
	"accounts", "executions", "refunds", "credit_accounts", "credit_topups", "credit_moves", "results"}

// moneyRecords reads every row of the money tables of the SQLite ledger
// at path, opened read-only (immutable: a restored file nothing else
// opens), as sorted text, one line per row.
func moneyRecords(t *testing.T, path string, immutable bool) string {
	t.Helper()
	dsn := "file:" + path + "?mode=ro"
	if immutable {
		dsn += "&immutable=1"
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out strings.Builder
	for _, table := range moneyTables {
		rows, err := db.Query("SELECT * FROM " + table)
		if err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		cols, _ := rows.Columns()
		var lines []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, fmt.Sprintf("%s %q", table, fmt.Sprint(vals...)))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(lines)
		fmt.Fprintf(&out, "%s: %d rows\n", table, len(lines))
		for _, l := range lines {
			out.WriteString(l + "\n")
		}
	}
	return out.String()
}

// replicated waits until the replica holds exactly the money records
// the live ledger at db holds (a restore of its newest state equals
// them), and returns them: the last replicated point.
func replicated(t *testing.T, ls replica.Litestream, db string) string {
	t.Helper()
	want := moneyRecords(t, db, false)
	deadline := time.Now().Add(60 * time.Second)
	for {
		probe := filepath.Join(t.TempDir(), "probe.db")
		err := ls.Restore(context.Background(), probe, time.Time{})
		if err == nil && moneyRecords(t, probe, true) == want {
			return want
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not catch up with the ledger in 60 s (last restore: %v)", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestLedgerRestoreDrill is the restore drill on real parts. A ledger
// takes paid calls, a refund, credit top-ups and draws while Litestream
// (the release capvend documents, run as its own process with the
// configuration `capvend ledger litestream-config` writes) replicates it
// to a file:// replica. Replication stops and one more batch is written;
// the ledger file is deleted with its -wal, -shm and Litestream's folder.
// `capvend ledger restore --to` (ledger.path) brings it back,
// `capvend ledger verify` passes on it, and its money records (calls and
// their transitions, payments, journal, executions, refunds, credit,
// stored answers) equal, row for row, what the ledger held at the last
// replicated point: the batch written after it is lost, nothing else.
// `restore --at` a time between the first two batches gives the state
// after the first, verified as well.
func TestLedgerRestoreDrill(t *testing.T) {
	bin := capvendtest.Litestream(t)
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	yaml := fmt.Sprintf("ledger:\n  path: capvend.db\n  replica: file://%s\n  litestream: %s\nserver:\n  name: t\n",
		filepath.Join(dir, "replica"), bin)
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(filepath.Join(dir, "capvend.yaml"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ls, err := cfg.Ledger.litestream("")
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(ctx, db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	capvendIn(t, dir, nil, "ledger", "litestream-config", "--out", "litestream.yml")
	stop := capvendtest.Replicating(t, bin, filepath.Join(dir, "litestream.yml"))

	drillBatch(t, l, 1)
	first := replicated(t, ls, db)
	// Litestream restores a point in time to the second of its files:
	// a point a second clear of both batches.
	time.Sleep(1100 * time.Millisecond)
	point := time.Now()
	time.Sleep(1100 * time.Millisecond)
	drillBatch(t, l, 2)
	last := replicated(t, ls, db)
	o := caughtUp(t, cfg)
	t.Logf("doctor: %s: %s", o.name, o.detail)

	// Replication stops; a third batch is never replicated.
	stop()
	drillBatch(t, l, 3)
	lost := moneyRecords(t, db, false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{db, db + "-wal", db + "-shm", filepath.Join(dir, ".capvend.db-litestream")} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}

	out := capvendIn(t, dir, nil, "ledger", "restore", "--to", "capvend.db")
	if !strings.Contains(out, "0 canceled, 0 refunded, 0 failed (serve refunds them), 0 with a locked-in hold invoice") {
		t.Fatalf("restore:\n%s", out)
	}
	if out := capvendIn(t, dir, nil, "ledger", "verify"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify of the restored ledger:\n%s", out)
	}
	got := moneyRecords(t, db, false)
	if got != last {
		t.Fatalf("the restored money records differ from the last replicated point:\n%s", capvendtest.LineDiff(last, got))
	}
	if got == lost || got == first {
		t.Fatal("the drill's batches wrote nothing the restore could tell apart")
	}
	var counts []string // the "table: n rows" lines
	for _, line := range strings.Split(got, "\n") {
		if strings.HasSuffix(line, " rows") {
			counts = append(counts, line)
		}
	}
	t.Logf("restored the last replicated point: %s", strings.Join(counts, ", "))

	capvendIn(t, dir, nil, "ledger", "restore", "--to", "then.db", "--at", point.UTC().Format(time.RFC3339Nano))
	if out := capvendIn(t, dir, nil, "ledger", "verify", "--db", "then.db"); !strings.Contains(out, "checks passed") {
		t.Fatalf("verify of the point-in-time restore:\n%s", out)
	}
	if then := moneyRecords(t, filepath.Join(dir, "then.db"), false); then != first {
		t.Fatalf("the state as of %s differs from the first batch's:\n%s", point.UTC().Format(time.RFC3339Nano), capvendtest.LineDiff(first, then))
	}
	r, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if bal, err := r.CreditBalance(ctx, drillAccount); err != nil || bal != 2*(100_000-2*21_000) {
		t.Fatalf("the restored credit balance is %d msat (%v), want %d", bal, err, 2*(100_000-2*21_000))
	}
	if b, err := r.Balance(ctx); err != nil || b.Pending.RefundsOwed != 2*21_000 {
		t.Fatalf("the restored refunds owed: %+v %v, want %d msat", b.Pending, err, 2*21_000)
	}
}

// TestRestoreHelpSaysWhyLitestreamRunsBeside: the choice of running
// Litestream beside serve rather than linking it is stated, with its
// reason, where an operator meets it: `ledger restore --help` and the
// backups section of docs/OPERATING.md (the README's map points there).
func TestRestoreHelpSaysWhyLitestreamRunsBeside(t *testing.T) {
	help, _, code := run(t, nil, "ledger", "restore", "--help")
	doc, err := os.ReadFile("../../docs/OPERATING.md")
	if code != 0 || err != nil {
		t.Fatalf("help exit %d, docs/OPERATING.md: %v", code, err)
	}
	_, section, _ := strings.Cut(string(doc), "\n### Continuous backup\n")
	section, _, _ = strings.Cut(section, "\n### ")
	for name, text := range map[string]string{"ledger restore --help": help, "docs/OPERATING.md, Continuous backup": section} {
		for _, want := range []string{"beside", "modernc.org/sqlite", "mattn/go-sqlite3", "POSIX locks", "howtocorrupt.html"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s does not say %q", name, want)
			}
		}
	}
}
