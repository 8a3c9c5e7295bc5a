package ledger

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRebind(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"SELECT 1", "SELECT 1"},
		{"SELECT ? , ?", "SELECT $1 , $2"},
		{"INSERT INTO t (a, b) VALUES (?, ?) ON CONFLICT DO NOTHING", "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT DO NOTHING"},
		{"SELECT '?', ? -- what?\n, \"a?b\", ?", "SELECT '?', $1 -- what?\n, \"a?b\", $2"},
		{"SELECT 'it''s ?', ?", "SELECT 'it''s ?', $1"},
		{"SELECT /* ? */ ?", "SELECT /* ? */ $1"},
		{"DO $$ BEGIN RAISE '?'; END $$; SELECT ?", "DO $$ BEGIN RAISE '?'; END $$; SELECT $1"},
		{"SELECT $tag$ ? $tag$, ?", "SELECT $tag$ ? $tag$, $1"},
		{"SELECT $1, ?", "SELECT $1, $1"},                                              // '$1' is not a dollar quote: the ledger never mixes both
		{"SELECT '?", "SELECT '?"},                                                     // unterminated: left alone
		{"WHERE a > ?1 OR b = ?1 OR c IN (?2)", "WHERE a > $1 OR b = $1 OR c IN ($2)"}, // numbered, as SQLite's ?NNN
		{"SELECT ?12", "SELECT $12"},
	} {
		if got := rebind(tc.in); got != tc.want {
			t.Errorf("rebind(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestPGFragmentsAreInUse: each SQLite-only fragment that pgQuery
// translates still occurs in the ledger's source, so a query edited away
// from its fragment (and then sent untranslated to PostgreSQL) fails here
// and not only on PostgreSQL, and no stale entry stays behind.
func TestPGFragmentsAreInUse(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "pgsql.go" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for _, f := range pgFragments {
		if !strings.Contains(src.String(), f.sqlite) {
			t.Errorf("fragment %q occurs in no query of the ledger", f.sqlite)
		}
	}
}
