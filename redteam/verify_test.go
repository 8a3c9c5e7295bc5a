package redteam

import (
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Issue 11, "the other verify blind spots: a paid call whose payment was
// canceled is not covered; results get a no-delete trigger; ledger verify
// --full runs integrity_check."

// copyLedger copies the (stopped) shop's ledger to a file the test may
// tamper with.
func copyLedger(t *testing.T, sh *shop) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "tampered.db")
	in, err := os.Open(sh.db)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestLedgerVerifyBlindSpots(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{})
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	for i, tool := range []string{"sha256", "always_fails"} {
		st, err := c.postRaw(sess, request(i+1, "tools/call", callParams(tool, map[string]any{"text": "verify"}, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		var paid <-chan error
		untilResponse(t, st, func(b string) { paid = payAsync(sh.s, b) })
		st.close()
		<-paid // always_fails: the hold invoice is canceled, the payment fails
	}
	sh.stop()
	calls, _ := readLedger(t, sh.db)
	var delivered, refunded int64
	for _, c := range calls {
		switch c.state {
		case "delivered":
			delivered = c.id
		case "refunded":
			refunded = c.id
		}
	}
	if delivered == 0 || refunded == 0 {
		t.Fatalf("want a delivered and a refunded call: %+v", calls)
	}

	t.Run("results cannot be deleted", func(t *testing.T) {
		db, err := sql.Open("sqlite3", copyLedger(t, sh))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(`DELETE FROM results WHERE call_id = ?`, delivered); err == nil {
			t.Fatal("a stored result could be deleted: the answer a paid client is owed on replay is gone")
		}
	})
	t.Run("a paid call whose payment was canceled fails verify", func(t *testing.T) {
		path := copyLedger(t, sh)
		db, err := sql.Open("sqlite3", path)
		if err != nil {
			t.Fatal(err)
		}
		var trigger string
		if err := db.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'calls_state_machine'`).Scan(&trigger); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{`DROP TRIGGER calls_state_machine`,
			`UPDATE calls SET state = 'paid' WHERE id = ` + strconv.FormatInt(refunded, 10), trigger} {
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		db.Close()
		out, code := runCapvend(t, "ledger", "verify", "--db", path)
		if code != 1 {
			t.Fatalf("ledger verify of a call paid by a canceled hold invoice: exit %d, want 1\n%s", code, out)
		}
	})
	t.Run("verify --full", func(t *testing.T) {
		out, code := runCapvend(t, "ledger", "verify", "--full", "--db", sh.db)
		if code != 0 || !strings.Contains(strings.ToLower(out), "integrity") {
			t.Fatalf("capvend ledger verify --full: exit %d\n%s", code, out)
		}
	})
}
