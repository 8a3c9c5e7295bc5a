package ledger

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// With every shared read connection taken (a flood's lookups), a read
// for money in motion (vend.Urgent) is served at once on its own, and a
// plain one waits.
func TestUrgentReadsDoNotWaitForTheSharedPool(t *testing.T) {
	ctx := context.Background()
	l := openTemp(t)
	if _, err := l.RememberReply(ctx, "k", []byte(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	busy := l.rdb.Stats().MaxOpenConnections
	for range busy {
		tx, err := l.rdb.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
	}

	plain, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, _, err := l.Reply(plain, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a plain read with the %d shared connections taken: %v, want it to wait (deadline exceeded)", busy, err)
	}
	urgent, cancel := context.WithTimeout(vend.Urgent(ctx), time.Minute) // a hang guard
	defer cancel()
	reply, ok, err := l.Reply(urgent, "k")
	if err != nil || !ok || string(reply) != `{"ok":true}` {
		t.Fatalf("an urgent read: %s, %v", reply, err)
	}
}

// TestReadersKeepTheirConnections: reads as many at once as a pool has
// connections give them all back to the pool: none is closed for want of
// an idle slot (database/sql keeps 2 by default; a new SQLite connection
// parses the schema again).
func TestReadersKeepTheirConnections(t *testing.T) {
	ctx := context.Background()
	l := openTemp(t)
	for _, tc := range []struct {
		name string
		db   *sql.DB
	}{{"shared", l.rdb}, {"urgent", l.udb}} {
		n := tc.db.Stats().MaxOpenConnections
		for range 3 {
			conns := make([]*sql.Conn, n)
			for i := range conns {
				c, err := tc.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var v int
				if err := c.QueryRowContext(ctx, "SELECT count(*) FROM request_replies").Scan(&v); err != nil {
					t.Fatal(err)
				}
				conns[i] = c
			}
			for _, c := range conns {
				c.Close()
			}
		}
		if st := tc.db.Stats(); st.MaxIdleClosed != 0 || st.OpenConnections != n || st.Idle != n {
			t.Errorf("%s readers: %+v", tc.name, st)
		}
	}
}
