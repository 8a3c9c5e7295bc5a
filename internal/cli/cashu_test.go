package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elnosh/gonuts/wallet/storage"
	"github.com/tyler-smith/go-bip39"

	"github.com/capvend/capvend/ledger"
)

// The Cashu commands against a live mint (melt, balances after payments)
// are tested in billing/cashu on the regtest stack; here: wiring, usage and
// the offline balance.

func TestCashuUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"cashu", "frobnicate"},
		{"cashu", "balance", "extra"},
		{"cashu", "melt"},
		{"cashu", "melt", "--invoice", " "},
		{"cashu", "melt", "lnbc1"},
	} {
		_, errOut, code := run(t, nil, args...)
		if code != 2 || !strings.HasPrefix(errOut, "capvend: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

func TestCashuBalanceOffline(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	l, err := ledger.Open(context.Background(), db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	cfg := filepath.Join(dir, "capvend.yaml")
	// The mint is unreachable: balance reads the wallet file offline.
	os.WriteFile(cfg, []byte("ledger:\n  path: capvend.db\ncashu:\n  mints: [\"http://127.0.0.1:9/\"]\n  wallet_dir: wallet\n"), 0o600)
	out, errOut, code := run(t, nil, "cashu", "balance", "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "http://127.0.0.1:9") || !strings.Contains(out, "difference") || !strings.Contains(out, "0.000") {
		t.Fatalf("output:\n%s", out)
	}
	// A ledger that does not exist is not created.
	_, errOut, code = run(t, nil, "cashu", "balance", "--config", cfg, "--db", filepath.Join(dir, "nope.db"))
	if code != 1 || !strings.Contains(errOut, "no ledger") {
		t.Fatalf("missing ledger: exit %d, %s", code, errOut)
	}
	// Melt contacts the mint: unreachable is an error, nothing booked.
	_, errOut, code = run(t, nil, "cashu", "melt", "--config", cfg, "--invoice", "lnbcrt500n1pjunk")
	if code != 1 || !strings.Contains(errOut, "invalid invoice") {
		t.Fatalf("bad invoice: exit %d, %s", code, errOut)
	}
}

// TestCashuSeedExport: 'capvend cashu seed' writes the wallet's mnemonic
// to a new file of mode 0600, once; doctor's seed check warns until then.
func TestCashuSeedExport(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "capvend.db")
	l, err := ledger.Open(context.Background(), db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	wdir := filepath.Join(dir, "wallet")
	if o := checkCashuSeed(wdir); o.status != "ok" {
		t.Fatalf("no wallet yet: %+v", o)
	}
	if err := os.Mkdir(wdir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := storage.InitBolt(wdir) // a gonuts wallet file, as serve makes it
	if err != nil {
		t.Fatal(err)
	}
	entropy, _ := bip39.NewEntropy(128)
	mnemonic, _ := bip39.NewMnemonic(entropy)
	w.SaveMnemonicSeed(mnemonic, bip39.NewSeed(mnemonic, ""))
	w.Close()
	if o := checkCashuSeed(wdir); o.status != "WARN" || !strings.Contains(o.fix, "capvend cashu seed") {
		t.Fatalf("a seed never exported: %+v", o)
	}
	cfg := filepath.Join(dir, "capvend.yaml")
	os.WriteFile(cfg, []byte("ledger:\n  path: capvend.db\ncashu:\n  mints: [\"http://127.0.0.1:9/\"]\n  wallet_dir: wallet\n"), 0o600)
	to := filepath.Join(dir, "seed.txt")
	out, errOut, code := run(t, nil, "cashu", "seed", "--config", cfg, "--to", to)
	if code != 0 || strings.Contains(out+errOut, mnemonic) {
		t.Fatalf("exit %d, the mnemonic printed? %s %s", code, out, errOut)
	}
	b, err := os.ReadFile(to)
	if fi, _ := os.Stat(to); err != nil || strings.TrimSpace(string(b)) != mnemonic || fi.Mode().Perm() != 0o600 {
		t.Fatalf("seed file %q: %v", b, err)
	}
	if _, _, code := run(t, nil, "cashu", "seed", "--config", cfg, "--to", to+"2"); code != 1 {
		t.Fatalf("a second export: exit %d", code)
	}
	if o := checkCashuSeed(wdir); o.status != "ok" {
		t.Fatalf("after the export: %+v", o)
	}
}
