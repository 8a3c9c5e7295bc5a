package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// capvend refuses to start while a secret file (the Nostr key, the LND
// macaroon, the Cashu wallet, the HTTP bearer token) is accessible by group
// or others, and says which file and how to fix it, like ssh, never what
// it holds.
func TestServeRefusesSecretsOthersCanRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string // %s is the directory
		secret string // the file (or dir) whose mode is tested, relative to the directory
		isDir  bool
		mode   os.FileMode
		field  string
	}{
		{name: "nsec world-readable", config: "nostr:\n  relays: [ws://127.0.0.1:9]\n  nsec_file: server.nsec\n",
			secret: "server.nsec", mode: 0o644, field: "nostr.nsec_file"},
		{name: "nsec group-readable", config: "nostr:\n  relays: [ws://127.0.0.1:9]\n  nsec_file: server.nsec\n",
			secret: "server.nsec", mode: 0o640, field: "nostr.nsec_file"},
		{name: "macaroon as lnd writes invoice.macaroon", config: "lnd:\n  host: 127.0.0.1:9\n  tls_cert_file: tls.cert\n  macaroon_file: invoice.macaroon\n",
			secret: "invoice.macaroon", mode: 0o644, field: "lnd.macaroon_file"},
		{name: "wallet dir listable", config: "cashu:\n  mints: [http://127.0.0.1:9]\n  wallet_dir: wallet\n",
			secret: "wallet", isDir: true, mode: 0o755, field: "cashu.wallet_dir"},
		{name: "wallet file readable", config: "cashu:\n  mints: [http://127.0.0.1:9]\n  wallet_dir: wallet\n",
			secret: "wallet/wallet.db", mode: 0o604, field: "cashu.wallet_dir"},
		{name: "HTTP bearer token", config: "  auth_token_file: http.token\n", // in the http section
			secret: "http.token", mode: 0o644, field: "http.auth_token_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "tls.cert"), []byte("cert"), 0o644)
			os.Mkdir(filepath.Join(dir, "wallet"), 0o700)
			secret := filepath.Join(dir, tc.secret)
			if !tc.isDir {
				if err := os.WriteFile(secret, []byte("0000000000000000000000000000000000000000000000000000000000000001\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(secret, tc.mode); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "capvend.yaml")
			body := "ledger:\n  path: capvend.db\nserver:\n  name: t\nhttp:\n  listen: 127.0.0.1:0\n" + tc.config
			if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, errOut, code := run(t, nil, "serve", "--config", cfg)
			if code != 1 || !strings.Contains(errOut, tc.field+":") || !strings.Contains(errOut, secret) ||
				!strings.Contains(errOut, "too open") || !strings.Contains(errOut, "chmod ") || strings.Contains(errOut, "00000000000000000") {
				t.Fatalf("exit %d, stderr:\n%s", code, errOut)
			}
			if _, err := os.Stat(filepath.Join(dir, "capvend.db")); err == nil {
				t.Fatal("the ledger was created: capvend started before refusing")
			}
			// Fixed as told, the same file passes the check.
			fix := os.FileMode(0o600)
			if tc.isDir {
				fix = 0o700
			}
			os.Chmod(secret, fix)
			if err := checkSecretFile(tc.field, secret); err != nil {
				t.Fatal(err)
			}
		})
	}
}
