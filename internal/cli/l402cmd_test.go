package cli

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/macaroon.v2"

	"github.com/capvend/capvend/ledger"
)

// TestL402RevokeAndList: `capvend l402 revoke` takes a token by its
// macaroon (base64), its credential ("L402 mac:preimage") or its id, and
// records it once with the reason; `capvend l402 list` shows every
// revoked token with the call it names; the ledger then refuses it
// (L402Revoked). A TOKEN that is none is a usage error.
func TestL402RevokeAndList(t *testing.T) {
	db := filepath.Join(t.TempDir(), "capvend.db")
	l, err := ledger.Open(context.Background(), db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	ident := binary.BigEndian.AppendUint16(nil, 0)
	ident = append(ident, make([]byte, 32)...)      // payment hash
	ident = binary.BigEndian.AppendUint64(ident, 7) // call 7
	ident = append(ident, []byte("0123456789abcdef01234567")...)
	m, err := macaroon.New(make([]byte, 32), ident, "capvend", macaroon.V2)
	if err != nil {
		t.Fatal(err)
	}
	bin, _ := m.MarshalBinary()
	mac := base64.StdEncoding.EncodeToString(bin)
	id := hex.EncodeToString(ident[34:])
	other := strings.Repeat("0", 15) + "9" + strings.Repeat("ab", 24)

	mustRun := func(want string, args ...string) string {
		t.Helper()
		out, errOut, code := run(t, nil, append(args, "--db", db)...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("capvend %s: exit %d, want %q in\n%s%s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out
	}
	mustRun("0 L402 token(s) revoked", "l402", "list")
	mustRun("L402 token "+id+" (call 7) revoked", "l402", "revoke", mac, "--reason", "leaked in a log")
	mustRun("L402 token "+id+" (call 7) revoked", "l402", "revoke", "L402 "+mac+":"+strings.Repeat("1", 64)) // again: no change
	mustRun("L402 token "+other+" (call 9) revoked", "l402", "revoke", other)
	out := mustRun("2 L402 token(s) revoked", "l402", "list")
	for _, want := range []string{id + "  7  ", "leaked in a log", other + "  9  ", "revoked by the operator"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}

	l, err = ledger.Open(context.Background(), db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tok := range []string{id, other} {
		if revoked, err := l.L402Revoked(context.Background(), tok); err != nil || !revoked {
			t.Fatalf("token %s: revoked=%v err=%v", tok, revoked, err)
		}
	}

	if _, errOut, code := run(t, nil, "l402", "revoke", "not-a-token", "--db", db); code != 2 || !strings.Contains(errOut, "no L402 token") {
		t.Fatalf("a bad TOKEN: exit %d\n%s", code, errOut)
	}
	if out, _, code := run(t, nil, "l402", "revoke", "--help"); code != 0 || !strings.Contains(out, "TOKEN is") {
		t.Fatalf("revoke --help: exit %d\n%s", code, out)
	}
}
