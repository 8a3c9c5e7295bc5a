package ledger_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/migrations"
	"github.com/capvend/capvend/vend"
)

// clock is a test clock that advances one second per call, so every
// transaction has a distinct, deterministic time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 20, 23, 59, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func openLedger(t testing.TB, path string) *ledger.Ledger {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "capvend.db")
	}
	l, err := ledger.OpenForTest(t, context.Background(), path, ledger.Options{Now: newClock().Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func newCall(i int) vend.NewCall {
	return vend.NewCall{
		Transport: "mcp-http", Client: "client-1", RequestID: fmt.Sprint("req-", i),
		Server: "demo", Name: "echo", ArgsHash: hash(fmt.Sprint("args", i)),
		Price: 21_000, Idempotent: true,
	}
}

func newPayment(i int) vend.NewPayment {
	return vend.NewPayment{
		Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: hash(fmt.Sprint("preimage", i)),
		Bolt11: "lnbcrt210n1test", Amount: 21_000, ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
	}
}

// quote records a call and its payment request: the call awaits payment.
func quote(t testing.TB, l *ledger.Ledger, i int) (vend.Call, vend.Payment) {
	t.Helper()
	ctx := context.Background()
	c, created, err := l.RecordCall(ctx, newCall(i))
	if err != nil || !created {
		t.Fatalf("record call %d: created=%v err=%v", i, created, err)
	}
	p, err := l.RecordPayment(ctx, c.ID, newPayment(i))
	if err != nil {
		t.Fatalf("record payment %d: %v", i, err)
	}
	return c, p
}

// deliverPaid runs a call through the whole paid path.
func deliverPaid(t testing.TB, l *ledger.Ledger, i int) vend.Call {
	t.Helper()
	ctx := context.Background()
	c, p := quote(t, l, i)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount, AddIndex: uint64(i + 1), SettleIndex: uint64(i + 1)}); err != nil {
		t.Fatalf("settle %d: %v", i, err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatalf("start %d: %v", i, err)
	}
	if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[{"type":"text","text":"ok"}]}`)}); err != nil {
		t.Fatalf("deliver %d: %v", i, err)
	}
	return c
}

func mustVerify(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	r, err := l.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		var b strings.Builder
		r.WriteTo(&b)
		t.Fatalf("verify failed:\n%s", b.String())
	}
}

func callState(t *testing.T, l *ledger.Ledger, id vend.CallID) vend.CallState {
	t.Helper()
	c, err := l.Call(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c.State
}

func TestOpenCreatesPrivateFileAndMigratesOnce(t *testing.T) {
	ledger.SkipOnPostgres(t, "the ledger file's mode and pragmas (TestOpenPostgresRefusesWhatIsNotALedger covers PostgreSQL)")
	path := filepath.Join(t.TempDir(), "sub", "capvend.db")
	l := openLedger(t, path)
	deliverPaid(t, l, 1)
	for _, p := range []string{path, path + "-wal"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if mode := st.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %o, want 600", filepath.Base(p), mode)
		}
	}
	l.Close()

	// Re-open: nothing to apply, data intact.
	l2 := openLedger(t, path)
	l2.Close()
	db, err := ledger.OpenRawForTest(t, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n, appID int
	var mode, sync string
	db.QueryRow("SELECT count(*) FROM schema_migrations").Scan(&n)
	db.QueryRow("PRAGMA application_id").Scan(&appID)
	db.QueryRow("PRAGMA journal_mode").Scan(&mode)
	files, _ := fs.Glob(migrations.FS, "*.sql")
	if n != len(files) || appID != ledger.ApplicationID || mode != "wal" {
		t.Fatalf("migrations=%d (want %d) application_id=%#x journal_mode=%s", n, len(files), appID, mode)
	}
	_ = sync
	var calls int
	db.QueryRow("SELECT count(*) FROM calls WHERE state = 'delivered'").Scan(&calls)
	if calls != 1 {
		t.Fatalf("delivered calls after reopen = %d, want 1", calls)
	}
}

func TestOpenRefusesWhatIsNotALedger(t *testing.T) {
	ledger.SkipOnPostgres(t, "files that are not ledgers (TestOpenPostgresRefusesWhatIsNotALedger covers PostgreSQL)")
	dir := t.TempDir()
	ctx := context.Background()

	text := filepath.Join(dir, "notes.txt")
	os.WriteFile(text, []byte("these are my notes, not a database\n"), 0o600)

	foreign := filepath.Join(dir, "other.db")
	db, _ := ledger.OpenRawForTest(t, foreign)
	if _, err := db.Exec("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT)"); err != nil {
		t.Fatal(err)
	}
	db.Close()

	// A real ledger whose pages after the header are overwritten.
	corrupt := filepath.Join(dir, "corrupt.db")
	l := openLedger(t, corrupt)
	deliverPaid(t, l, 1)
	l.Close()
	raw, _ := os.ReadFile(corrupt)
	for i := 100; i < len(raw); i++ {
		raw[i] = 0xA5
	}
	os.WriteFile(corrupt, raw, 0o600)
	os.Remove(corrupt + "-wal")
	os.Remove(corrupt + "-shm")

	newer := filepath.Join(dir, "newer.db")
	l = openLedger(t, newer)
	l.Close()
	db, _ = ledger.OpenRawForTest(t, newer)
	db.Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, '9999_future.sql', 0)")
	db.Close()

	for _, tc := range []struct {
		name      string
		path      string
		mustExist bool
		want      error
		msg       string
	}{
		{"missing", filepath.Join(dir, "nope.db"), true, ledger.ErrNoLedger, "no ledger file"},
		{"text file", text, false, ledger.ErrNotLedger, "not an SQLite database"},
		{"foreign sqlite", foreign, false, ledger.ErrNotLedger, "another application"},
		{"corrupt", corrupt, false, nil, "corrupt"},
		{"newer schema", newer, false, ledger.ErrNewerSchema, "newer capvend"},
		{"directory", dir, false, nil, "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(tc.path)
			l, err := ledger.OpenForTest(t, ctx, tc.path, ledger.Options{MustExist: tc.mustExist})
			if err == nil {
				l.Close()
				t.Fatal("opened")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("error %q should name the path and say %q", err, tc.msg)
			}
			after, _ := os.ReadFile(tc.path)
			if string(before) != string(after) {
				t.Fatal("the file was modified")
			}
		})
	}
}

func TestPaidCallPathBooksIncomeOnce(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c := deliverPaid(t, l, 1)
	got, err := l.Call(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != vend.CallDelivered || got.Executions != 1 {
		t.Fatalf("call %+v", got)
	}
	r, err := l.Result(ctx, c.ID)
	if err != nil || !strings.Contains(string(r.Body), `"ok"`) {
		t.Fatalf("result %q %v", r.Body, err)
	}
	// A replayed request finds the same row.
	again, created, err := l.RecordCall(ctx, newCall(1))
	if err != nil || created || again.ID != c.ID || again.State != vend.CallDelivered {
		t.Fatalf("replay: created=%v call=%+v err=%v", created, again, err)
	}
	b, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Tools) != 1 || b.Tools[0].Revenue != 21_000 || b.Tools[0].Calls != 1 || b.Tools[0].Account != "income:tools:demo:echo" {
		t.Fatalf("tools %+v", b.Tools)
	}
	mustVerify(t, l)
}

func TestSettleIsExactlyOnceUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, p := quote(t, l, 1)
	var wins, already atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount})
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, vend.ErrAlreadySettled):
				already.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || already.Load() != 49 {
		t.Fatalf("wins=%d already=%d, want 1 and 49", wins.Load(), already.Load())
	}
	if s := callState(t, l, c.ID); s != vend.CallPaid {
		t.Fatalf("call is %s", s)
	}
	b, _ := l.Balance(ctx)
	if b.Tools[0].Revenue != 21_000 {
		t.Fatalf("revenue %d, want 21000 (booked once)", b.Tools[0].Revenue)
	}
	mustVerify(t, l)
}

func TestExecutionClaimIsExactlyOnceUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, p := quote(t, l, 1)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	var wins, refused atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, vend.ErrIllegalTransition), errors.Is(err, vend.ErrAlreadyClaimed):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || refused.Load() != 49 {
		t.Fatalf("wins=%d refused=%d", wins.Load(), refused.Load())
	}
	got, _ := l.Call(ctx, c.ID)
	if got.Executions != 1 {
		t.Fatalf("executions = %d", got.Executions)
	}
}

func TestClaimProofsOnceAndAllOrNothing(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, _, _ := l.RecordCall(ctx, newCall(1))
	np := newPayment(1)
	np.Backend, np.Kind, np.Ref, np.MintURL = vend.BackendCashu, vend.KindToken, hash("token-1"), "http://127.0.0.1:3338"
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	proof := func(s string, amt int64) vend.Proof {
		return vend.Proof{SecretHash: hash(s), AmountSat: amt, KeysetID: "00ad268c4d1f5826", MintURL: np.MintURL}
	}
	if err := l.ClaimProofs(ctx, p.ID, []vend.Proof{proof("a", 16), proof("b", 4), proof("c", 1)}); err != nil {
		t.Fatal(err)
	}
	// A token that reuses one proof is refused whole: "d" is not recorded.
	err = l.ClaimProofs(ctx, p.ID, []vend.Proof{proof("d", 16), proof("b", 4)})
	if !errors.Is(err, vend.ErrProofSpent) {
		t.Fatalf("reused proof: %v", err)
	}
	if err := l.ClaimProofs(ctx, p.ID, []vend.Proof{proof("d", 16)}); err != nil {
		t.Fatalf("d was recorded by the refused claim: %v", err)
	}
	// 50 concurrent claims of the same new proof: one wins.
	var wins, spent atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.ClaimProofs(ctx, p.ID, []vend.Proof{proof("e", 8)})
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, vend.ErrProofSpent):
				spent.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || spent.Load() != 49 {
		t.Fatalf("wins=%d spent=%d", wins.Load(), spent.Load())
	}
}

func TestIllegalTransitionsChangeNothing(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	awaiting, awaitingPay := quote(t, l, 1)
	delivered := deliverPaid(t, l, 2)
	quoted, _, _ := l.RecordCall(ctx, newCall(3))
	expired, expiredPay := quote(t, l, 4)
	if _, err := l.EndPayment(ctx, expiredPay.Ref, vend.PaymentExpired, "invoice expired"); err != nil {
		t.Fatal(err)
	}
	if s := callState(t, l, expired.ID); s != vend.CallExpired {
		t.Fatalf("expired call is %s", s)
	}

	cases := []struct {
		name string
		id   vend.CallID
		op   func() error
		want error
	}{
		{"execute unpaid", awaiting.ID, func() error {
			_, err := l.StartExecution(ctx, awaiting.ID, awaiting.Binding(), awaiting.Released(vend.SchemeInvoice))
			return err
		}, vend.ErrIllegalTransition},
		{"deliver unpaid", awaiting.ID, func() error { return l.Deliver(ctx, awaiting.ID, vend.Result{Body: []byte("{}")}) }, vend.ErrIllegalTransition},
		{"refund unpaid", awaiting.ID, func() error { return l.Refund(ctx, awaiting.ID, "x") }, vend.ErrIllegalTransition},
		{"second payment request", awaiting.ID, func() error { _, err := l.RecordPayment(ctx, awaiting.ID, newPayment(99)); return err }, vend.ErrIllegalTransition},
		{"execute delivered", delivered.ID, func() error {
			_, err := l.StartExecution(ctx, delivered.ID, delivered.Binding(), delivered.Released(vend.SchemeInvoice))
			return err
		}, vend.ErrIllegalTransition},
		{"deliver twice", delivered.ID, func() error { return l.Deliver(ctx, delivered.ID, vend.Result{Body: []byte("{}")}) }, vend.ErrIllegalTransition},
		{"refund delivered", delivered.ID, func() error { return l.Refund(ctx, delivered.ID, "x") }, vend.ErrIllegalTransition},
		{"fail delivered", delivered.ID, func() error { return l.Fail(ctx, delivered.ID, vend.Result{Body: []byte("{}")}, "x") }, vend.ErrIllegalTransition},
		{"execute quoted", quoted.ID, func() error {
			_, err := l.StartExecution(ctx, quoted.ID, quoted.Binding(), quoted.Released(vend.SchemeInvoice))
			return err
		}, vend.ErrIllegalTransition},
		{"settle expired", expired.ID, func() error {
			_, err := l.SettlePayment(ctx, vend.Settlement{Ref: expiredPay.Ref, Amount: 21_000})
			return err
		}, vend.ErrIllegalTransition},
		{"underpaid settlement", awaiting.ID, func() error {
			_, err := l.SettlePayment(ctx, vend.Settlement{Ref: awaitingPay.Ref, Amount: 20_999})
			return err
		}, vend.ErrUnderpaid},
		{"hold invoice without preimage", quoted.ID, func() error {
			np := newPayment(50)
			np.Kind = vend.KindHoldInvoice
			_, err := l.RecordPayment(ctx, quoted.ID, np)
			if err == nil {
				return nil
			}
			return vend.ErrIllegalTransition // the only error this table expects for it
		}, vend.ErrIllegalTransition},
		{"duplicate payment ref", quoted.ID, func() error { _, err := l.RecordPayment(ctx, quoted.ID, newPayment(1)); return err }, vend.ErrDuplicatePayment},
		{"unknown call", 999, func() error {
			_, err := l.StartExecution(ctx, 999, vend.Binding{}, vend.Release{Scheme: vend.SchemeInvoice})
			return err
		}, vend.ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := l.Call(ctx, tc.id)
			b0, _ := l.Balance(ctx)
			err := tc.op()
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			after, _ := l.Call(ctx, tc.id)
			b1, _ := l.Balance(ctx)
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("call changed: %+v -> %+v", before, after)
			}
			if fmt.Sprint(b0) != fmt.Sprint(b1) {
				t.Fatalf("books changed: %+v -> %+v", b0, b1)
			}
		})
	}
	mustVerify(t, l)

	// The schema refuses an illegal edge even from raw SQL.
	db, _ := ledger.OpenRawForTest(t, l.Path())
	defer db.Close()
	if _, err := db.Exec("UPDATE calls SET state = 'delivered' WHERE id = ?", awaiting.ID); err == nil ||
		!strings.Contains(err.Error(), "illegal call state transition") {
		t.Fatalf("raw illegal transition: %v", err)
	}
	if _, err := db.Exec("UPDATE payments SET amount_msat = 1 WHERE id = ?", awaitingPay.ID); err == nil {
		t.Fatal("raw payment amount change was allowed")
	}
}

func TestTransitionTableMatchesSchema(t *testing.T) {
	l := openLedger(t, "")
	db, _ := ledger.OpenRawForTest(t, l.Path())
	defer db.Close()
	inDB := map[string]bool{}
	rows, err := db.Query("SELECT from_state, to_state FROM call_transitions")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var f, to string
		rows.Scan(&f, &to)
		inDB[f+">"+to] = true
	}
	rows.Close()
	n := 0
	for _, f := range vend.CallStates() {
		for _, to := range vend.CallStates() {
			if f.CanTransition(to) {
				n++
				if !inDB[string(f)+">"+string(to)] {
					t.Errorf("vend allows %s -> %s, the schema does not", f, to)
				}
			}
		}
	}
	if n != len(inDB) {
		t.Errorf("vend has %d edges, the schema %d", n, len(inDB))
	}
}

func TestJournalIsBalancedAndImmutable(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	deliverPaid(t, l, 1)

	err := l.Post(ctx, ledger.Entry{Kind: "adjustment", Description: "lopsided", Postings: []ledger.Posting{
		{Account: ledger.AccountLND, Amount: 1000}, {Account: "equity:opening", Amount: -999},
	}})
	if !errors.Is(err, ledger.ErrUnbalanced) {
		t.Fatalf("unbalanced post: %v", err)
	}
	if err := l.Post(ctx, ledger.Entry{Kind: "adjustment", Description: "opening balance", Postings: []ledger.Posting{
		{Account: ledger.AccountLND, Amount: 1000}, {Account: "equity:opening", Amount: -1000},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Post(ctx, ledger.Entry{Kind: "adjustment", Description: "bad name", Postings: []ledger.Posting{
		{Account: "cash", Amount: 1}, {Account: "equity:x", Amount: -1},
	}}); err == nil {
		t.Fatal("account outside the five types was accepted")
	}

	db, _ := ledger.OpenRawForTest(t, l.Path()+"?_foreign_keys=on")
	defer db.Close()
	for _, q := range []string{
		"UPDATE postings SET amount_msat = amount_msat + 1",
		"DELETE FROM postings",
		"DELETE FROM entries",
		"UPDATE entries SET description = 'rewritten'",
		"UPDATE entries SET sealed = 0",
	} {
		if _, err := db.Exec(q); err == nil {
			t.Errorf("%s: allowed", q)
		}
	}
	// An entry that does not balance cannot be sealed, even by hand.
	tx, _ := db.Begin()
	var id int64
	if err := tx.QueryRow("INSERT INTO entries (ts, kind, description) VALUES (0, 'adjustment', 'by hand') RETURNING id").Scan(&id); err != nil {
		t.Fatal(err)
	}
	tx.Exec("INSERT INTO postings (entry_id, account_id, amount_msat) VALUES (?, 1, 5), (?, 2, -4)", id, id)
	if _, err := tx.Exec("UPDATE entries SET sealed = 1 WHERE id = ?", id); err == nil ||
		!strings.Contains(err.Error(), "summing to zero") {
		t.Fatalf("sealing unbalanced entry: %v", err)
	}
	tx.Rollback()
	mustVerify(t, l)
}

func TestSettlementSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	c, p := quote(t, l, 1)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount, AddIndex: 7, SettleIndex: 3}); err != nil {
		t.Fatal(err)
	}
	l.Close()

	l = openLedger(t, path)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); !errors.Is(err, vend.ErrAlreadySettled) {
		t.Fatalf("settle after reopen: %v", err)
	}
	got, err := l.Payment(ctx, p.Ref)
	if err != nil || got.State != vend.PaymentSettled || got.AddIndex != 7 || got.SettleIndex != 3 || got.Settled != p.Amount {
		t.Fatalf("payment %+v %v", got, err)
	}
	if s := callState(t, l, c.ID); s != vend.CallPaid {
		t.Fatalf("call is %s", s)
	}
	mustVerify(t, l)
}

func TestHoldInvoiceSettlesAfterSuccessAndCancelsAfterFailure(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	hold := func(i int) (vend.Call, vend.Payment) {
		c, _, _ := l.RecordCall(ctx, newCall(i))
		np := newPayment(i)
		np.Kind = vend.KindHoldInvoice
		np.HoldPreimage = []byte(fmt.Sprintf("%032d", i))
		p, err := l.RecordPayment(ctx, c.ID, np)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.AcceptPayment(ctx, p.Ref); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AcceptPayment(ctx, p.Ref); err != nil {
			t.Fatalf("accept is not idempotent: %v", err)
		}
		if s := callState(t, l, c.ID); s != vend.CallPaid {
			t.Fatalf("accepted hold invoice: call is %s", s)
		}
		if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
			t.Fatal(err)
		}
		return c, p
	}

	ok, okPay := hold(1)
	if pre, err := l.HoldPreimage(ctx, okPay.Ref); err != nil || string(pre) != fmt.Sprintf("%032d", 1) {
		t.Fatalf("preimage %q %v", pre, err)
	}
	if open, err := l.UnsettledPayments(ctx, vend.BackendLND); err != nil || len(open) != 1 || open[0].State != vend.PaymentAccepted {
		t.Fatalf("unsettled %+v %v", open, err)
	}
	if err := l.Deliver(ctx, ok.ID, vend.Result{Body: []byte("{}")}); !errors.Is(err, vend.ErrUnpaid) {
		t.Fatalf("deliver before the hold invoice settled: %v", err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: okPay.Ref, Amount: okPay.Amount}); err != nil {
		t.Fatal(err)
	}
	if err := l.Deliver(ctx, ok.ID, vend.Result{Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}

	bad, badPay := hold(2)
	if err := l.Fail(ctx, bad.ID, vend.Result{IsError: true, Body: []byte(`{"isError":true}`)}, "upstream error"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, bad.ID, "tool failed"); err == nil {
		t.Fatal("refund marked while the hold invoice is still locked in")
	}
	if _, err := l.EndPayment(ctx, badPay.Ref, vend.PaymentCanceled, "tool failed"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, bad.ID, "hold invoice canceled"); err != nil {
		t.Fatal(err)
	}
	b, _ := l.Balance(ctx)
	if len(b.Tools) != 1 || b.Tools[0].Revenue != 21_000 || b.Pending.RefundsOwed != 0 || b.Pending.HeldPayments != 0 {
		t.Fatalf("balance %+v", b)
	}
	mustVerify(t, l)
}

func TestRefundOfSettledPaymentBooksALiability(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, p := quote(t, l, 1)
	l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount})
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte("{}")}, "crashed"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, c.ID, "upstream crashed"); err != nil {
		t.Fatal(err)
	}
	b, _ := l.Balance(ctx)
	if b.Tools[0].Revenue != 0 || b.Pending.RefundsOwed != 21_000 {
		t.Fatalf("balance %+v", b)
	}
	mustVerify(t, l)
}

func TestVerifyReportsTampering(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	deliverPaid(t, l, 1)
	c, p := quote(t, l, 2)
	unpaid, _, _ := l.RecordCall(ctx, newCall(3))
	db, _ := ledger.OpenRawForTest(t, l.Path())
	defer db.Close()
	for _, q := range []string{
		ledger.DropTriggerSQL("postings_no_update"),
		"UPDATE postings SET amount_msat = amount_msat + 5 WHERE id = 1",
		ledger.DropTriggerSQL("calls_state_machine"),
		fmt.Sprintf("UPDATE calls SET state = 'delivered' WHERE id IN (%d, %d)", c.ID, unpaid.ID),
		ledger.DropTriggerSQL("payments_state_machine"),
		fmt.Sprintf("UPDATE payments SET state = 'settled', settled_at = 1, settled_msat = 21000 WHERE ref = '%s'", p.Ref),
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r, err := l.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.OK() {
		t.Fatal("tampered ledger verified OK")
	}
	var b strings.Builder
	r.WriteTo(&b)
	out := b.String()
	for _, want := range []string{
		"FAIL  every entry balances",
		"entry 1: sum 5 msat over 2 postings",
		"FAIL  each settled payment has exactly one income entry",
		"FAIL  no delivered priced call without a settled payment",
		fmt.Sprintf("call %d (demo/echo, 21000 msat) was delivered without a settled payment", unpaid.ID),
		"FAIL  no call executed without payment",
		"FAIL  the schema's money rules are in place",
		"trigger postings_no_update is missing",
		"ok    no Cashu proof received twice",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestLNDCursorOnlyMovesForward(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	if a, s, err := l.LNDCursor(ctx, "vendor"); err != nil || a != 0 || s != 0 {
		t.Fatalf("fresh cursor %d %d %v", a, s, err)
	}
	l.SaveLNDCursor(ctx, "vendor", 10, 4)
	l.SaveLNDCursor(ctx, "vendor", 8, 6)
	if a, s, _ := l.LNDCursor(ctx, "vendor"); a != 10 || s != 6 {
		t.Fatalf("cursor %d %d, want 10 6", a, s)
	}
}

func TestLateMintQuotePaymentIsOwedBack(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	c, _, _ := l.RecordCall(ctx, newCall(1))
	np := newPayment(1)
	np.Backend, np.Kind, np.Ref, np.MintURL = vend.BackendCashu, vend.KindMintQuote, "quote-1", "http://127.0.0.1:3338"
	p, err := l.RecordPayment(ctx, c.ID, np)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.EndPayment(ctx, p.Ref, vend.PaymentExpired, "no payment in time"); err != nil {
		t.Fatal(err)
	}
	// The quote's invoice was paid at the mint after all.
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); !errors.Is(err, vend.ErrAlreadySettled) {
		t.Fatalf("second late settlement: %v", err)
	}
	if s := callState(t, l, c.ID); s != vend.CallExpired {
		t.Fatalf("call is %s, want expired (it never runs)", s)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); !errors.Is(err, vend.ErrIllegalTransition) {
		t.Fatalf("late-paid call started: %v", err)
	}
	b, _ := l.Balance(ctx)
	if b.Pending.RefundsOwed != p.Amount || b.Tools[0].Revenue != 0 {
		t.Fatalf("balance %+v", b)
	}
	mustVerify(t, l)

	// A Lightning invoice canceled by capvend is withdrawn at LND: it can
	// never settle late.
	c2, p2 := quote(t, l, 2)
	l.EndPayment(ctx, p2.Ref, vend.PaymentCanceled, "client gone")
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p2.Ref, Amount: p2.Amount}); !errors.Is(err, vend.ErrIllegalTransition) {
		t.Fatalf("late invoice settlement: %v", err)
	}
	if s := callState(t, l, c2.ID); s != vend.CallCanceled {
		t.Fatalf("call %s", s)
	}
}

func TestCallArgumentsAndRecovery(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	nc := newCall(1)
	nc.ExposedName, nc.Arguments = "demo_echo", []byte(`{"text":"hi"}`)
	c, _, err := l.RecordCall(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	tool, args, explicit, err := l.CallArguments(ctx, c.ID)
	if err != nil || tool != "demo_echo" || string(args) != `{"text":"hi"}` || explicit {
		t.Fatalf("%q %q %v", tool, args, err)
	}
	// A replay does not record the arguments twice.
	if _, created, err := l.RecordCall(ctx, nc); err != nil || created {
		t.Fatal(created, err)
	}
	p, err := l.RecordPayment(ctx, c.ID, newPayment(1))
	if err != nil {
		t.Fatal(err)
	}
	l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount})
	if _, err := l.ResumeExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeRecover)); !errors.Is(err, vend.ErrIllegalTransition) {
		t.Fatalf("resume of a paid call: %v", err)
	}
	l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
	got, err := l.CallsIn(ctx, vend.CallExecuting, vend.CallPaid)
	if err != nil || len(got) != 1 || got[0].ID != c.ID {
		t.Fatalf("calls in %+v %v", got, err)
	}
	r, err := l.ResumeExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeRecover))
	if err != nil || r.Executions != 2 {
		t.Fatalf("resume: %+v %v", r, err)
	}
	mustVerify(t, l) // an idempotent call may run twice

	nc2 := newCall(2)
	nc2.Idempotent = false
	c2, _, _ := l.RecordCall(ctx, nc2)
	p2, _ := l.RecordPayment(ctx, c2.ID, newPayment(2))
	l.SettlePayment(ctx, vend.Settlement{Ref: p2.Ref, Amount: p2.Amount})
	l.StartExecution(ctx, c2.ID, c2.Binding(), c2.Released(vend.SchemeInvoice))
	if _, err := l.ResumeExecution(ctx, c2.ID, c2.Binding(), c2.Released(vend.SchemeRecover)); !errors.Is(err, vend.ErrIllegalTransition) {
		t.Fatalf("resume of a non-idempotent call: %v", err)
	}
}

// PaymentsByRef reads the payments of many refs at once (more than one
// query's worth), leaving out the refs the ledger does not hold, and
// those in the state it is told to skip.
func TestPaymentsByRef(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	const n = 1203 // three queries of 500
	var refs []string
	for i := 0; i < n; i++ {
		_, p := quote(t, l, i)
		refs = append(refs, p.Ref, hash(fmt.Sprint("not capvend's ", i)))
	}
	got, err := l.PaymentsByRef(ctx, refs, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d payments, want %d", len(got), n)
	}
	for i := 0; i < n; i++ {
		if p, ok := got[refs[2*i]]; !ok || p.Ref != refs[2*i] || p.State != vend.PaymentOpen || p.Amount != 21_000 {
			t.Fatalf("payment %d: %+v %v", i, p, ok)
		}
	}
	if got, err := l.PaymentsByRef(ctx, nil, ""); err != nil || len(got) != 0 {
		t.Fatalf("no refs: %v %v", got, err)
	}
	// Skipping a state leaves out the payments in it.
	for i := 0; i < 3; i++ {
		if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: refs[2*i], Amount: 21_000}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := l.PaymentsByRef(ctx, refs, vend.PaymentSettled); err != nil || len(got) != n-3 {
		t.Fatalf("skipping the settled: %d payments, want %d (%v)", len(got), n-3, err)
	} else if _, ok := got[refs[0]]; ok {
		t.Fatalf("settled payment %s returned", refs[0])
	}
	if got, err := l.PaymentsByRef(ctx, refs[:6], vend.PaymentOpen); err != nil || len(got) != 3 || got[refs[2]].State != vend.PaymentSettled {
		t.Fatalf("skipping the open: %v %v", got, err)
	}
}
