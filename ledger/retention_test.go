package ledger_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// body is a realistic stored answer of about n bytes: an MCP tool result.
func body(n int, tag string) []byte {
	text := strings.Repeat("x", max(n-60, 1))
	return []byte(fmt.Sprintf(`{"content":[{"type":"text","text":"%s %s"}]}`, tag, text))
}

// deliverWith runs call i through the paid path and delivers res (or, with
// fail, fails it and refunds its payment).
func deliverWith(t testing.TB, l *ledger.Ledger, i int, res []byte, fail bool) vend.Call {
	t.Helper()
	ctx := context.Background()
	c, p := quote(t, l, i)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: p.Amount}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if fail {
		if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: res}, "upstream failed"); err != nil {
			t.Fatal(err)
		}
		if err := l.Refund(ctx, c.ID, "upstream failed"); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if err := l.Deliver(ctx, c.ID, vend.Result{Body: res}); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPruneReplacesOldAnswersByTheirRecord: answers stored before the
// cut-off are replaced by their record and a read of them is
// ErrResultExpired (with the error flag and time kept), never an empty
// answer; answers after it stay whole; money is untouched and the
// ledger verifies; pruning again changes nothing.
func TestPruneReplacesOldAnswersByTheirRecord(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	old := deliverWith(t, l, 1, body(10_000, "old"), false)
	if _, err := l.RememberReply(ctx, "nostr:old", []byte(`{"content":[],"isError":true}`)); err != nil {
		t.Fatal(err)
	}
	failed := deliverWith(t, l, 2, body(500, "failed"), true)
	cut, err := l.Result(ctx, failed.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Everything stored after the failed call's result is kept.
	keptBody := body(2_000, "kept")
	kept := deliverWith(t, l, 3, keptBody, false)
	if _, err := l.RememberReply(ctx, "nostr:kept", []byte(`{"content":[]}`)); err != nil {
		t.Fatal(err)
	}
	before, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, l)

	st, err := l.Prune(ctx, cut.StoredAt.Add(time.Millisecond), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if st.Results != 2 || st.Replies != 1 || st.Bytes < 10_000 {
		t.Fatalf("pruned %+v; want the 2 old results and the old reply", st)
	}
	for _, c := range []struct {
		id      vend.CallID
		isError bool
	}{{old.ID, false}, {failed.ID, true}} {
		r, err := l.Result(ctx, c.id)
		if !errors.Is(err, vend.ErrResultExpired) || r.Body != nil || r.IsError != c.isError || r.StoredAt.IsZero() {
			t.Fatalf("call %d: %+v %v; want ErrResultExpired with the error flag %v and no body", c.id, r, err, c.isError)
		}
	}
	if r, err := l.Result(ctx, kept.ID); err != nil || !bytes.Equal(r.Body, keptBody) {
		t.Fatalf("a result inside the retention period: %v", err)
	}
	if _, ok, err := l.Reply(ctx, "nostr:old"); ok || !errors.Is(err, vend.ErrResultExpired) {
		t.Fatalf("a pruned reply: ok %v, %v", ok, err)
	}
	if r, ok, err := l.Reply(ctx, "nostr:kept"); !ok || err != nil || string(r) != `{"content":[]}` {
		t.Fatalf("a reply inside the retention period: %q %v %v", r, ok, err)
	}
	after, err := l.Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(before.Tools, before.Accounts) != fmt.Sprint(after.Tools, after.Accounts) {
		t.Fatalf("money changed:\n%v\n%v", before, after)
	}
	h, err := l.CallHistory(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if h.Result == nil || h.Result.Pruned.IsZero() || h.Result.Bytes != len(body(10_000, "old")) {
		t.Fatalf("the dashboard's view of a pruned result: %+v", h.Result)
	}
	mustVerify(t, l)
	if st, err := l.Prune(ctx, time.Now().Add(24*time.Hour), 0); err != nil || st.Results != 1 || st.Replies != 1 {
		t.Fatalf("pruning everything left: %+v %v; want the kept result and reply", st, err)
	}
	if st, err := l.PruneBatch(ctx, time.Now().Add(24*time.Hour)); err != nil || !st.Zero() {
		t.Fatalf("pruning again: %+v %v", st, err)
	}
	mustVerify(t, l)
}

// TestPruneRecordIsTheBodysHash: the record kept is the SHA-256 of the
// body and its size, as stored in the row; an empty body keeps the empty
// body's hash; a reply's error flag is its MCP result's isError.
func TestPruneRecordIsTheBodysHash(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l := openLedger(t, path)
	b := body(3_000, "hashed")
	c := deliverWith(t, l, 1, b, false)
	e := deliverWith(t, l, 2, []byte{}, false)
	replies := map[string]struct {
		reply   string
		isError int
	}{"nostr:err": {`{"content":[],"isError":true}`, 1}, "nostr:ok": {`{"content":[]}`, 0}, "nostr:odd": {`1`, 0}}
	for k, r := range replies {
		if _, err := l.RememberReply(ctx, k, []byte(r.reply)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Prune(ctx, time.Now().Add(24*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	db, err := ledger.OpenRawForTest(t, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for id, want := range map[vend.CallID][]byte{c.ID: b, e.ID: {}} {
		var sum string
		var size int
		var left []byte
		if err := db.QueryRow("SELECT body_sha256, body_size, body FROM results WHERE call_id = ?", id).Scan(&sum, &size, &left); err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(want)
		if sum != hex.EncodeToString(h[:]) || size != len(want) || len(left) != 0 {
			t.Fatalf("call %d: record %s, %d bytes, %d left; want %x, %d", id, sum, size, len(left), h, len(want))
		}
	}
	for k, r := range replies {
		var sum string
		var size, isError int
		if err := db.QueryRow("SELECT reply_sha256, reply_size, is_error FROM request_replies WHERE request_key = ?", k).Scan(&sum, &size, &isError); err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256([]byte(r.reply))
		if sum != hex.EncodeToString(h[:]) || size != len(r.reply) || isError != r.isError {
			t.Fatalf("reply %s: record %s, %d bytes, error %d; want %x, %d, %d", k, sum, size, isError, h, len(r.reply), r.isError)
		}
	}
	mustVerify(t, l)
}

// TestPruneBatchesAreBounded: one batch prunes at most 256 answers and
// 4 MiB of bodies (at least one answer), results first, the oldest first.
func TestPruneBatchesAreBounded(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	big := body(1<<20+100, "big") // 3 fit in 4 MiB
	for i := range 4 {
		deliverWith(t, l, i, big, false)
	}
	for i := range 300 {
		if _, err := l.RememberReply(ctx, fmt.Sprint("nostr:", i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	end := time.Now().Add(24 * time.Hour)
	var got []ledger.PruneStats
	for {
		st, err := l.PruneBatch(ctx, end)
		if err != nil {
			t.Fatal(err)
		}
		if st.Zero() {
			break
		}
		got = append(got, st)
	}
	// The first batch: 3 big results (a 4th would pass 4 MiB) and 253
	// replies (256 rows); the second the rest.
	want := []ledger.PruneStats{{Results: 3, Replies: 253, Bytes: 3*int64(len(big)) + 253*2}, {Results: 1, Replies: 47, Bytes: int64(len(big)) + 47*2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
	mustVerify(t, l)
}

// TestPruningIsTheOnlyChangeToAStoredAnswer: the schema lets a stored
// answer change only from its body to that body's record; every other
// update (another body, a wrong hash or size, a changed error flag, a
// record without pruning, a second pruning, un-pruning) and any delete of
// a result is refused.
func TestPruningIsTheOnlyChangeToAStoredAnswer(t *testing.T) {
	ctx := context.Background()
	l := openLedger(t, "")
	b := body(1_000, "rule")
	c := deliverWith(t, l, 1, b, false)
	if _, err := l.RememberReply(ctx, "nostr:r", b); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	sum := hex.EncodeToString(h[:])
	other := sha256.Sum256([]byte("other"))
	id := int64(c.ID)
	for _, tc := range []struct {
		name, q string
		args    []any
	}{
		{"another body", "UPDATE results SET body = ? WHERE call_id = ?", []any{[]byte(`{"content":[]}`), id}},
		{"a wrong hash", "UPDATE results SET body = ?, body_sha256 = ?, body_size = ?, pruned_at = stored_at + 1 WHERE call_id = ?",
			[]any{[]byte{}, hex.EncodeToString(other[:]), len(b), id}},
		{"a wrong size", "UPDATE results SET body = ?, body_sha256 = ?, body_size = ?, pruned_at = stored_at + 1 WHERE call_id = ?",
			[]any{[]byte{}, sum, len(b) - 1, id}},
		{"the error flag changed", "UPDATE results SET body = ?, body_sha256 = ?, body_size = ?, is_error = 1, pruned_at = stored_at + 1 WHERE call_id = ?",
			[]any{[]byte{}, sum, len(b), id}},
		{"the body kept", "UPDATE results SET body_sha256 = ?, body_size = ?, pruned_at = stored_at + 1 WHERE call_id = ?",
			[]any{sum, len(b), id}},
		{"a record without pruning", "UPDATE results SET body = ?, body_sha256 = ?, body_size = ? WHERE call_id = ?",
			[]any{[]byte{}, sum, len(b), id}},
		{"a reply's wrong hash", "UPDATE request_replies SET reply = ?, reply_sha256 = ?, reply_size = ?, is_error = 0, pruned_at = created_at + 1 WHERE request_key = 'nostr:r'",
			[]any{[]byte{}, hex.EncodeToString(other[:]), len(b)}},
		{"a reply edited", "UPDATE request_replies SET reply = ? WHERE request_key = 'nostr:r'", []any{[]byte(`{}`)}},
		{"a result deleted", "DELETE FROM results WHERE call_id = ?", []any{id}},
	} {
		if err := l.ExecForTest(ctx, tc.q, tc.args...); err == nil {
			t.Errorf("%s: the schema allowed it", tc.name)
		}
	}
	// The one allowed change, by hand: it goes through once.
	prune := "UPDATE results SET body = ?, body_sha256 = ?, body_size = ?, pruned_at = stored_at + 1 WHERE call_id = ?"
	if err := l.ExecForTest(ctx, prune, []byte{}, sum, len(b), id); err != nil {
		t.Fatalf("pruning to the body's record: %v", err)
	}
	for _, q := range []string{prune, "UPDATE results SET body = ?, body_sha256 = NULL, body_size = NULL, pruned_at = NULL WHERE call_id = ?"} {
		args := []any{[]byte{}, sum, len(b), id}
		if !strings.Contains(q, "?, body_sha256 = ?") {
			args = []any{b, id}
		}
		if err := l.ExecForTest(ctx, q, args...); err == nil {
			t.Errorf("%s: changed a pruned result", q)
		}
	}
	mustVerify(t, l)
}

// TestRetentionCheckedByVerify: a pruned answer whose record is not the
// form pruning writes (slipped past the trigger, as by a hand edit) fails
// verify's retention check and only that one.
func TestRetentionCheckedByVerify(t *testing.T) {
	const check = "every pruned answer keeps a well-formed record of its body (SHA-256, size, error flag); no whole one claims to be pruned"
	ctx := context.Background()
	notEmpty := sha256.Sum256([]byte("x"))
	for _, tc := range []struct {
		name    string
		trigger string
		q       string
		args    []any
	}{
		{"a result of size 0 whose hash is not the empty body's", "results_immutable",
			"UPDATE results SET body = ?, body_sha256 = ?, body_size = 0, pruned_at = stored_at + 1 WHERE call_id = 1",
			[]any{[]byte{}, hex.EncodeToString(notEmpty[:])}},
		{"a result pruned before it was stored", "results_immutable",
			"UPDATE results SET body = ?, body_sha256 = ?, body_size = 5, pruned_at = stored_at - 1000 WHERE call_id = 1",
			[]any{[]byte{}, hex.EncodeToString(notEmpty[:])}},
		{"a reply whose size 0 has another hash", "request_replies_prune_only",
			"UPDATE request_replies SET reply = ?, reply_sha256 = ?, reply_size = 0, is_error = 0, pruned_at = created_at + 1",
			[]any{[]byte{}, hex.EncodeToString(notEmpty[:])}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(t, "")
			deliverWith(t, l, 1, body(100, "v"), false)
			if _, err := l.RememberReply(ctx, "nostr:v", []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			mustVerify(t, l)
			must(t, l.BypassForTest(ctx, []string{tc.trigger}, tc.q, tc.args...))
			r, err := l.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := failedChecks(r); len(got) != 1 || got[0] != check {
				var b strings.Builder
				r.WriteTo(&b)
				t.Fatalf("failed checks %q, want only the retention check\n%s", got, b.String())
			}
		})
	}
}

// TestPrunedLedgerCopiesToPostgres: CopyTo carries pruned records (and
// their rules hold there): the copy verifies and a replay still finds the
// answer expired.
func TestPrunedLedgerCopiesToPostgres(t *testing.T) {
	if !ledger.OnPostgres() {
		t.Skip("PostgreSQL only (TestPostgresConformance runs it)")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	src, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	c := deliverWith(t, src, 1, body(5_000, "copied"), false)
	kept := deliverWith(t, src, 2, body(100, "kept"), false)
	r, _ := src.Result(ctx, kept.ID)
	if _, err := src.Prune(ctx, r.StoredAt, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := src.RememberReply(ctx, "nostr:x", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Prune(ctx, time.Now().Add(24*time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	dst := openLedger(t, path)
	if _, err := src.CopyTo(ctx, dst); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, dst)
	for _, id := range []vend.CallID{c.ID, kept.ID} {
		if _, err := dst.Result(ctx, id); !errors.Is(err, vend.ErrResultExpired) {
			t.Fatalf("call %d in the copy: %v", id, err)
		}
	}
	if _, _, err := dst.Reply(ctx, "nostr:x"); !errors.Is(err, vend.ErrResultExpired) {
		t.Fatalf("reply in the copy: %v", err)
	}
}
