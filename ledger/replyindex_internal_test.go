package ledger

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// TestReplyIndex: with SoleReplyWriter, Reply finds every reply stored
// before the ledger opened and since, and answers a key without one from
// memory: a row written behind the ledger's back (what the option rules
// out) is not seen, while a ledger without the option reads it.
// PruneReplies makes the index forget what it deleted; a pruned body is
// still ErrResultExpired.
func TestReplyIndex(t *testing.T) {
	if OnPostgres() {
		t.Skip("the reply index is SQLite's (one serve per ledger file); PostgreSQL's instances share replies")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	l, err := Open(ctx, path, Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.RememberReply(ctx, "nostr:before", []byte(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	l.Close()

	l, err = Open(ctx, path, Options{Now: clock, SoleReplyWriter: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, ok, err := l.Reply(ctx, "nostr:before"); err != nil || !ok || string(got) != `{"n":1}` {
		t.Fatalf("reply stored before the open: %s %v %v", got, ok, err)
	}
	now = now.Add(time.Minute)
	if _, err := l.RememberReply(ctx, "nostr:since", []byte(`{"n":2}`)); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := l.Reply(ctx, "nostr:since"); err != nil || !ok || string(got) != `{"n":2}` {
		t.Fatalf("reply stored since the open: %s %v %v", got, ok, err)
	}

	// Another writer: the index does not know its row.
	db, err := sql.Open(sqliteDriver, path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "INSERT INTO request_replies (request_key, reply, created_at) VALUES ('nostr:behind', '{}', ?)", ms(now)); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Reply(ctx, "nostr:behind"); err != nil || ok {
		t.Fatalf("the index read a row it does not know: %v %v", ok, err)
	}
	other, err := Open(ctx, path, Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, ok, err := other.Reply(ctx, "nostr:behind"); err != nil || !ok {
		t.Fatalf("without the index: %v %v", ok, err)
	}

	// A pruned body is still found, as expired.
	if _, err := l.PruneBatch(ctx, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Reply(ctx, "nostr:since"); !errors.Is(err, vend.ErrResultExpired) {
		t.Fatalf("pruned body: %v, want ErrResultExpired", err)
	}

	// PruneReplies deletes the first and the index forgets it; the
	// second stays known.
	if n, err := l.PruneReplies(ctx, now.Add(-time.Second)); err != nil || n != 1 {
		t.Fatalf("PruneReplies: %d %v", n, err)
	}
	if l.replyIdx.mayHave("nostr:before") {
		t.Fatal("the index still holds a deleted reply")
	}
	if !l.replyIdx.mayHave("nostr:since") {
		t.Fatal("the index forgot a reply still stored")
	}
}

// TestReplyIndexOverflow: past its limit the index says "maybe" for
// every key, until PruneReplies deleted every row it left out.
func TestReplyIndexOverflow(t *testing.T) {
	x := newReplyIndex()
	x.limit = 2
	x.add("a", 10)
	x.add("b", 20)
	if x.mayHave("c") {
		t.Fatal("unknown key while under the limit")
	}
	x.add("c", 30) // left out
	x.add("d", 40) // left out
	if !x.mayHave("c") || !x.mayHave("zzz") {
		t.Fatal("over the limit, a key left out must be read")
	}
	x.prune(35)
	if !x.mayHave("zzz") {
		t.Fatal("d (40) is still left out")
	}
	x.prune(41)
	if x.mayHave("zzz") || x.mayHave("d") {
		t.Fatal("every row left out is deleted: the index knows again")
	}
	x.add("e", 50)
	if !x.mayHave("e") {
		t.Fatal("added after the overflow cleared")
	}
}

// TestStoringAReplyWritesOneIndex: request_replies has the two partial
// indexes of schema 30, a reply being stored writes only the first, and
// PruneReplies' deletes each search one of them (no scan of the table).
func TestStoringAReplyWritesOneIndex(t *testing.T) {
	if OnPostgres() {
		t.Skip("SQLite's query plans")
	}
	ctx := context.Background()
	l, err := Open(ctx, filepath.Join(t.TempDir(), "capvend.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rows, err := l.rdb.QueryContext(ctx, "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'request_replies' AND sql IS NOT NULL ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var name, sql string
		if err := rows.Scan(&name, &sql); err != nil {
			t.Fatal(err)
		}
		got = append(got, name+": "+sql)
	}
	rows.Close()
	want := []string{
		"request_replies_pruned: CREATE INDEX request_replies_pruned ON request_replies (created_at) WHERE pruned_at IS NOT NULL",
		"request_replies_unpruned: CREATE INDEX request_replies_unpruned ON request_replies (created_at) WHERE pruned_at IS NULL",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("indexes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for q, index := range map[string]string{
		"DELETE FROM request_replies WHERE pruned_at IS NULL AND created_at < ?":     "request_replies_unpruned",
		"DELETE FROM request_replies WHERE pruned_at IS NOT NULL AND created_at < ?": "request_replies_pruned",
	} {
		var plan strings.Builder
		rows, err := l.rdb.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, 0)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(detail + "; ")
		}
		rows.Close()
		if !strings.Contains(plan.String(), "USING INDEX "+index) {
			t.Errorf("%s: plan %q, want a search of %s", q, plan.String(), index)
		}
	}
}
