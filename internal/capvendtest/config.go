package capvendtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/testnet"
)

// EditConfig replaces the first old in the configuration file at path
// with new (the file must hold old), or appends new if old is "".
func EditConfig(t testing.TB, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(b), old, new, 1)
	if old == "" {
		body = string(b) + new
	}
	if body == string(b) {
		t.Fatalf("the configuration %s has no %q to replace", path, old)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// OnPostgres rewrites the serve configuration at path to keep its ledger
// in the PostgreSQL database of dsn.
func OnPostgres(t testing.TB, path, dsn string) {
	t.Helper()
	EditConfig(t, path, "ledger:\n  path: capvend.db\n", "ledger:\n  driver: postgres\n  dsn_file: ledger.dsn\n")
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "ledger.dsn"), []byte(dsn), 0o600); err != nil {
		t.Fatal(err)
	}
}

// AdminConfig adds an admin section to the configuration at path and
// returns the admin listener's address.
func AdminConfig(t testing.TB, path, extra string) string {
	t.Helper()
	addr := FreeAddr(t)
	EditConfig(t, path, "", fmt.Sprintf("admin:\n  listen: %s\n%s", addr, extra))
	return addr
}

// FreeToolsConfig writes a configuration selling example-tools (as a stdio
// child with prefix) with no payment backend: free tools only.
func FreeToolsConfig(t testing.TB, prefix string) (path, listen string) {
	t.Helper()
	dir := t.TempDir()
	listen = FreeAddr(t)
	path = filepath.Join(dir, "capvend.yaml")
	yaml := fmt.Sprintf("ledger:\n  path: capvend.db\nhttp:\n  listen: %s\nupstreams:\n  - name: tools\n    prefix: %q\n    command: %s\n",
		listen, prefix, ExampleTools(t))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, listen
}

// NostrToolsConfig writes a configuration selling example-tools (a stdio
// child with prefix) free, with no payment backend, on the MCP front and
// the Nostr front on relay with secret key sk.
func NostrToolsConfig(t testing.TB, relay, sk, prefix string) (path, listen string) {
	t.Helper()
	dir := t.TempDir()
	nsec := filepath.Join(dir, "server.nsec")
	if err := os.WriteFile(nsec, []byte(sk+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listen = FreeAddr(t)
	path = filepath.Join(dir, "capvend.yaml")
	yaml := fmt.Sprintf(`ledger:
  path: capvend.db
http:
  listen: %s
nostr:
  relays: [%s]
  nsec_file: %s
limits:
  requests_per_minute: 1000000 # benchmarks call in tight loops
upstreams:
  - name: tools
    prefix: %q
    command: %s
`, listen, relay, nsec, prefix, ExampleTools(t))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, listen
}

// ServerKey makes a fresh Nostr key for a server and writes it to an nsec
// file; it returns the pubkey and the file.
func ServerKey(t testing.TB) (pubkey, nsecFile string) {
	t.Helper()
	sk := nostr.GeneratePrivateKey()
	pubkey, _ = nostr.GetPublicKey(sk)
	nsecFile = filepath.Join(t.TempDir(), "server.nsec")
	if err := os.WriteFile(nsecFile, []byte(sk+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return pubkey, nsecFile
}

// URIFile writes a wallet connection's URI to a 0600 file.
func URIFile(t testing.TB, w *testnet.NWCInfo, conn string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), conn+".uri")
	if err := os.WriteFile(path, []byte(w.URIs[conn]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
