package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/testnet"
)

// doctorSetup is one deployment for doctor: a real upstream (example-tools
// as a stdio child) with a priced tool, a live in-process relay, an nsec
// only its owner reads; each test breaks one thing.
type doctorSetup struct {
	dir       string
	relays    []string
	tool      string // the priced tool
	nsecMode  os.FileMode
	mints     []string
	lnd       *testnet.NodeInfo
	macaroon  string
	priceSats int64
}

// newDoctorSetup has a stand-in mint (standInMint, input fee 100 ppk), so a tool can be priced without the
// regtest stack (TestDoctorLND and the reconcile tests use the real mint).
func newDoctorSetup(t *testing.T) *doctorSetup {
	return &doctorSetup{dir: t.TempDir(), relays: []string{testkit.Relay(t)}, tool: "word_count", nsecMode: 0o600, priceSats: 5,
		mints: []string{capvendtest.StandInMint(t, 100)}}
}

// write writes the configuration and returns its path.
func (s *doctorSetup) write(t *testing.T) string {
	t.Helper()
	nsec := filepath.Join(s.dir, "server.nsec")
	if err := os.WriteFile(nsec, []byte(nostr.GeneratePrivateKey()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(nsec, s.nsecMode); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ledger:\n  path: capvend.db\nnostr:\n  nsec_file: server.nsec\n  announce: false\n  relays: [%s]\n", strings.Join(s.relays, ", "))
	if len(s.mints) > 0 {
		fmt.Fprintf(&b, "cashu:\n  mints: [%s]\n  wallet_dir: wallet\n", strings.Join(s.mints, ", "))
		if err := os.MkdirAll(filepath.Join(s.dir, "wallet"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if s.lnd != nil {
		fmt.Fprintf(&b, "lnd:\n  host: %s\n  tls_cert_file: %s\n  macaroon_file: %s\n", s.lnd.RPCHost, s.lnd.TLSCert, s.macaroon)
	}
	fmt.Fprintf(&b, "upstreams:\n  - name: tools\n    command: %s\n    tools:\n      %s:\n        price_sats: %d\n", capvendtest.ExampleTools(t), s.tool, s.priceSats)
	path := filepath.Join(s.dir, "capvend.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// wantStatus returns the report's line for check name, failing if there
// is none or if its status is not status ("" takes any); a FAIL must say
// its fix.
func wantStatus(t *testing.T, report, name, status string) string {
	t.Helper()
	var l string
	for _, rl := range strings.Split(report, "\n") {
		if f := strings.Fields(rl); len(f) > 1 && strings.HasPrefix(strings.TrimSpace(rl[len(f[0]):]), name+":") {
			l = rl
			break
		}
	}
	if l == "" {
		t.Fatalf("no %q line in:\n%s", name, report)
	}
	if status != "" && !strings.HasPrefix(l, status+" ") {
		t.Fatalf("%s: want %s, got %q\n%s", name, status, l, report)
	}
	if status == "FAIL" && !strings.Contains(l, "-- fix: ") {
		t.Fatalf("%s fails without a fix: %q", name, l)
	}
	return l
}

// TestDoctor breaks one thing at a time; each time exactly that check
// fails (with its fix) and doctor exits 1; with nothing broken it exits 0.
func TestDoctor(t *testing.T) {
	t.Run("Healthy", func(t *testing.T) {
		rep, _, code := run(t, nil, "doctor", "--config", newDoctorSetup(t).write(t))
		if code != 0 || strings.Contains(rep, "FAIL") {
			t.Fatalf("exit %d:\n%s", code, rep)
		}
		wantStatus(t, rep, "config", "ok")
		wantStatus(t, rep, "ledger", "ok")
		wantStatus(t, rep, "upstream tools", "ok")
		wantStatus(t, rep, "secrets", "ok")
		wantStatus(t, rep, "clock", "ok")
		if l := wantStatus(t, rep, "mint http://127.0.0.1", ""); !strings.Contains(l, "00ad268c4d1f5826 (input fee 100 ppk)") {
			t.Fatalf("mint: %q", l)
		}
		if l := wantStatus(t, rep, "relay ws://127.0.0.1", ""); !strings.Contains(l, "read back") {
			t.Fatalf("relay: %q", l)
		}
	})
	for _, tc := range []struct {
		name, check string
		breakIt     func(s *doctorSetup)
	}{
		{"DeadRelay", "relay ws://127.0.0.1:1", func(s *doctorSetup) { s.relays = append(s.relays, "ws://127.0.0.1:1") }},
		{"UnreachableMint", "mint http://127.0.0.1:1", func(s *doctorSetup) { s.mints = append(s.mints, "http://127.0.0.1:1") }},
		{"MissingUpstreamTool", "upstream tools", func(s *doctorSetup) { s.tool = "word_cnt" }},
		{"WorldReadableNsec", "secrets", func(s *doctorSetup) { s.nsecMode = 0o644 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newDoctorSetup(t)
			tc.breakIt(s)
			rep, _, code := run(t, nil, "doctor", "--config", s.write(t))
			if code != 1 || strings.Count(rep, "FAIL") != 1 {
				t.Fatalf("exit %d, want 1 with one failure:\n%s", code, rep)
			}
			wantStatus(t, rep, tc.check, "FAIL")
		})
	}
}

// TestDoctorLND checks LND on the regtest stack: the vendor's invoice
// macaroon passes; the customer node's macaroon (wrong node) and the
// read-only one (lacks invoices:write) fail, each with the fix. With the
// admin macaroon the inbound liquidity is read and compared with the
// price; the invoice macaroon cannot read it (skipped, not failed).
func TestDoctorLND(t *testing.T) {
	stack := needStack(t)
	v, _ := stack.Node(testnet.Vendor)
	c, _ := stack.Node(testnet.Customer)
	for _, tc := range []struct {
		name, macaroon, status, liquidity string
		price                             int64
	}{
		{"InvoiceMacaroon", v.InvoiceMacaroon, "ok", "skip", 5},
		{"AdminMacaroon", v.AdminMacaroon, "ok", "ok", 5},
		{"PriceAboveInbound", v.AdminMacaroon, "ok", "FAIL", 100_000_000},
		{"WrongNodeMacaroon", c.AdminMacaroon, "FAIL", "", 5},
		{"ReadonlyMacaroon", v.ReadonlyMacaroon, "FAIL", "", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newDoctorSetup(t)
			s.lnd, s.macaroon, s.priceSats = &v, tc.macaroon, tc.price
			rep, _, code := run(t, nil, "doctor", "--config", s.write(t))
			wantStatus(t, rep, "lnd", tc.status)
			if tc.liquidity != "" {
				wantStatus(t, rep, "liquidity", tc.liquidity)
			}
			if want := 0; tc.status == "FAIL" || tc.liquidity == "FAIL" {
				if code != 1 {
					t.Fatalf("exit %d, want 1:\n%s", code, rep)
				}
			} else if code != want {
				t.Fatalf("exit %d, want 0:\n%s", code, rep)
			}
		})
	}
}

// Doctor checks every price against what its upstream lists, prompts and
// resources too, and shows what an item without a price is.
func TestDoctorItemPricesAndUnpriced(t *testing.T) {
	s := newDoctorSetup(t)
	path := s.write(t)
	capvendtest.EditConfig(t, path, "", "    prompts:\n      summarize: {price_sats: 2}\n    resources:\n      \"example://readm\": {price_sats: 1}\n      \"example://{name}\": {price_sats: 1}\n")
	rep, _, code := run(t, nil, "doctor", "--config", path)
	if code != 1 || strings.Count(rep, "FAIL") != 1 {
		t.Fatalf("exit %d, want 1 with one failure:\n%s", code, rep)
	}
	if l := wantStatus(t, rep, "upstream tools", "FAIL"); !strings.Contains(l, "resources.example://readm") || strings.Contains(l, "summarize") || strings.Contains(l, "{name}") {
		t.Fatalf("the upstream's line does not name just the resource price naming nothing: %q", l)
	}
	if l := wantStatus(t, rep, "unpriced", "ok"); !strings.Contains(l, "free") {
		t.Fatalf("unpriced: %q", l)
	}
}
