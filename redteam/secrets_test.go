package redteam

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/testnet"
)

// Issue 11, "Secrets: refuse to start when the nsec, macaroon or wallet
// files are group- or world-readable (say which and how to fix, like
// ssh); upstream stdio children get only the environment configured for
// them (plus PATH/HOME)".

// expectRefusal starts sh's capvend and requires it to exit non-zero,
// before serving, with output naming path and saying to chmod it.
func expectRefusal(t *testing.T, sh *shop, path string) {
	t.Helper()
	sh.opts.noWait = true
	sh.start()
	deadline := time.After(time.Minute) // a hang guard
	for {
		select {
		case <-sh.exited:
			out, err := sh.waitExit(time.Second)
			if err == nil {
				t.Fatalf("capvend exited 0 with %s readable by others:\n%s", path, out)
			}
			if !strings.Contains(out, path) || !strings.Contains(out, "chmod") {
				t.Fatalf("capvend refused to start, but its message does not name %s and say to chmod it:\n%s", path, out)
			}
			return
		case <-deadline:
			t.Fatalf("capvend still runs a minute after start with %s readable by others", path)
		case <-time.After(100 * time.Millisecond):
			if strings.Contains(sh.logs.String(), "capvend: serving") {
				sh.stop()
				t.Fatalf("capvend serves with %s readable by others (mode %v):\n%s", path, modeOf(path), tail(sh.logs.String(), 4000))
			}
		}
	}
}

func modeOf(path string) os.FileMode {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Mode().Perm()
}

func TestSecretFilePermissions(t *testing.T) {
	t.Parallel()
	t.Run("nsec", func(t *testing.T) {
		t.Parallel()
		sh := newShop(t, shopOpts{nostr: true, nsecMode: 0o644})
		t.Cleanup(sh.finish)
		expectRefusal(t, sh, sh.nsecFile)
	})
	t.Run("macaroon", func(t *testing.T) {
		t.Parallel()
		sh := newShop(t, shopOpts{lnd: noLND, cashu: true})
		vendor, _ := sh.s.Node(testnet.Vendor)
		mac, err := os.ReadFile(vendor.InvoiceMacaroon)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(sh.dir, "invoice.macaroon")
		if err := os.WriteFile(path, mac, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, 0o644) // whatever the umask
		sh.opts.top = "lnd:\n  host: " + vendor.RPCHost + "\n  tls_cert_file: " + vendor.TLSCert + "\n  macaroon_file: " + path + "\n"
		sh.writeConfig(*sh.opts.prices)
		t.Cleanup(sh.finish)
		expectRefusal(t, sh, path)
	})
	t.Run("cashu wallet", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{lnd: noLND, cashu: true})
		sh.stop()
		wallet := filepath.Join(sh.dir, "cashu-wallet")
		var opened []string
		filepath.Walk(wallet, func(p string, info os.FileInfo, err error) error {
			if err != nil {
				return nil
			}
			if info.IsDir() {
				os.Chmod(p, 0o755)
			} else {
				os.Chmod(p, 0o644)
				opened = append(opened, p)
			}
			return nil
		})
		if len(opened) == 0 {
			t.Fatalf("no wallet files in %s", wallet)
		}
		expectRefusal(t, sh, wallet)
	})
}

// TestUpstreamEnvironment runs capvend with a secret in its environment
// and an upstream with env {ALLOWED_VAR: yes}: the child (example-tools
// records its environment at start) gets ALLOWED_VAR, PATH and HOME, and
// nothing else of capvend's.
func TestUpstreamEnvironment(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{
		env:      []string{"REDTEAM_CANARY=do-not-leak", "AWS_SECRET_ACCESS_KEY=redteam"},
		upstream: "    env: {ALLOWED_VAR: \"yes\"}\n",
	})
	_, starts := readExecutions(t, sh)
	if len(starts) == 0 {
		t.Fatal("example-tools recorded no start")
	}
	env := map[string]string{}
	for _, kv := range starts[0].Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if env["ALLOWED_VAR"] != "yes" {
		t.Errorf("the configured ALLOWED_VAR did not reach the upstream: %v", starts[0].Env)
	}
	if env["PATH"] == "" {
		t.Errorf("PATH did not reach the upstream")
	}
	var extra []string
	for k := range env {
		switch k {
		case "ALLOWED_VAR", "PATH", "HOME":
		default:
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		t.Errorf("the upstream child got capvend's environment beyond its own env, PATH and HOME: %v", extra)
	}
}
