package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(c *command, path []string)
	walk = func(c *command, path []string) {
		t.Run(strings.Join(path, "_"), func(t *testing.T) {
			out, _, code := run(t, nil, append(path[1:], "--help")...)
			if code != 0 || !strings.HasPrefix(out, "Usage: "+strings.Join(path, " ")) {
				t.Fatalf("exit %d, output:\n%s", code, out)
			}
			if c.Summary == "" {
				t.Fatal("no summary")
			}
		})
		for _, s := range c.Subs {
			walk(s, append(append([]string{}, path...), s.Name))
		}
	}
	walk(rootCommand(), []string{"capvend"})
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"},
		{"ledger", "frobnicate"},
		{"credit", "frobnicate"},
		{"l402", "frobnicate"},
		{"refunds", "frobnicate"},
		{"ledger", "export", "--format", "xlsx", "--db", "x.db"},
		{"ledger", "export", "--since", "yesterday", "--db", "x.db"},
		{"ledger", "export", "--since", "2026-11-02", "--until", "2026-11-01", "--db", "x.db"},
		{"init", "extra"},
		{"version", "--nope"},
	} {
		_, errOut, code := run(t, nil, args...)
		if code != 2 || !strings.HasPrefix(errOut, "capvend: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// TestFlagsAfterTheArgument: the commands taking one argument read flags
// that follow it (parseAfterArg), and refuse a second argument or an
// unknown flag there with a usage error (exit 2) that says which.
func TestFlagsAfterTheArgument(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"l402", "revoke", "tok", "--reason", "x", "more"}, `revoke takes one TOKEN, got "more" too`},
		{[]string{"l402", "revoke", "tok", "--nope"}, "flag provided but not defined: -nope (see 'capvend l402 revoke --help')"},
		{[]string{"credit", "refund", "t0", "--cashu", "more"}, `credit refund takes one argument, got "more" too`},
		{[]string{"credit", "refund", "t0", "--nope"}, "flag provided but not defined: -nope (see 'capvend credit refund --help')"},
		{[]string{"refunds", "pay", "3", "--cashu", "more"}, `refunds pay takes one argument, got "more" too`},
		{[]string{"refunds", "pay", "3", "--mint"}, "flag needs an argument: -mint (see 'capvend refunds pay --help')"},
		{[]string{"refunds", "pay", "--nwc", "coinos", "3"},
			`refunds pay takes one argument, got "3" too (--nwc names a connection only with '=': --nwc=NAME)`},
		{[]string{"credit", "refund", "t0", "--nwc", "coinos"},
			`credit refund takes one argument, got "coinos" too (--nwc names a connection only with '=': --nwc=NAME)`},
	} {
		_, errOut, code := run(t, nil, tc.args...)
		if want := "capvend: " + tc.want + "\n"; code != 2 || errOut != want {
			t.Errorf("%v: exit %d, stderr %q; want exit 2, %q", tc.args, code, errOut, want)
		}
	}
}

func TestVersion(t *testing.T) {
	out, _, code := run(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "capvend ") || !strings.Contains(out, "sqlite 3.") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

func TestInitWritesAValidConfigOnce(t *testing.T) {
	dir := t.TempDir()
	capvendtest.Chdir(t, dir)
	out, errOut, code := run(t, nil, "init")
	if code != 0 || !strings.Contains(out, "wrote capvend.yaml") {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	st, err := os.Stat("capvend.yaml")
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v %v", st, err)
	}
	cfg, err := loadConfig("", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Ledger.Path != filepath.Join(dir, "capvend.db") || len(cfg.Upstreams) != 1 ||
		cfg.Upstreams[0].Tools["forecast"].Msat() != 21_000 || cfg.Upstreams[0].Tools["alert_subscribe"].Msat() != 50_500 {
		t.Fatalf("config %+v", cfg)
	}
	os.WriteFile("capvend.yaml", []byte("# mine\n"), 0o600)
	if _, errOut, code := run(t, nil, "init"); code != 1 || !strings.Contains(errOut, "exists; use --force") {
		t.Fatalf("second init: exit %d %s", code, errOut)
	}
	if b, _ := os.ReadFile("capvend.yaml"); string(b) != "# mine\n" {
		t.Fatal("init overwrote the file")
	}
	if _, _, code := run(t, nil, "init", "--force"); code != 0 {
		t.Fatal("init --force failed")
	}
	if b, _ := os.ReadFile("capvend.yaml"); !bytes.Equal(b, exampleConfig) {
		t.Fatal("init --force did not write the example")
	}
}

func TestConfigEnvExpansion(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "capvend.yaml")
	env := map[string]string{"LEDGER": "/var/lib/capvend/books.db", "MAC": "/secrets/invoice.macaroon"}
	getenv := func(k string) string { return env[k] }
	cfg, err := parseConfig(path, []byte(`
ledger:
  path: ${LEDGER}
lnd:
  host: 127.0.0.1:10009
  tls_cert_file: tls.cert
  macaroon_file: $MAC
server:
  name: "costs $$5"
# a comment may name $UNSET_VARIABLE
`), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Ledger.Path != env["LEDGER"] || cfg.LND.MacaroonFile != env["MAC"] ||
		cfg.LND.TLSCertFile != filepath.Join(dir, "tls.cert") || cfg.Server.Name != "costs $5" {
		t.Fatalf("%+v", cfg)
	}
	if cfg.Payments.TTL != 10*time.Minute || !cfg.LND.HoldInvoices {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "lnd:\n  hostname: x\n", []string{`line 2`, `unknown field "hostname" in lnd`, "macaroon_file"}},
		{"unset variable", "ledger:\n  path: $NOPE\n", []string{"line 2", "$NOPE is not set"}},
		{"bad relay", "nostr:\n  relays: [http://relay]\n  nsec_file: k\n", []string{"nostr.relays[0]", "ws:// or wss://"}},
		{"bad nostr window", "nostr:\n  window: 1s\n", []string{"nostr.window", "10s .. 1h"}},
		{"bad nostr shutdown grace", "nostr:\n  shutdown_grace: 0s\n", []string{"nostr.shutdown_grace", "1s .. 10m"}},
		{"bad http shutdown grace", "http:\n  shutdown_grace: 11m\n", []string{"http.shutdown_grace", "1s .. 10m"}},
		{"no sessions per source", "http:\n  max_sessions_per_source: 0\n", []string{"http.max_sessions_per_source", "1 .. 1000000"}},
		{"inline nsec", "nostr:\n  nsec_file: nsec1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq\n", []string{"nostr.nsec_file", "not the key itself"}},
		{"inline macaroon", "lnd:\n  host: h:1\n  tls_cert_file: c\n  macaroon_file: " + strings.Repeat("0201", 40) + "\n", []string{"lnd.macaroon_file", "not the macaroon itself"}},
		{"lnd without macaroon", "lnd:\n  host: 127.0.0.1:10009\n  tls_cert_file: c\n", []string{"lnd.macaroon_file", "invoice.macaroon"}},
		{"bad ttl", "payments:\n  ttl: 5s\n", []string{"payments.ttl", "30s .. 24h"}},
		{"bad duration", "payments:\n  ttl: soon\n", []string{"line 2", "soon"}},
		{"command and url", "upstreams:\n  - name: a\n    command: x\n    url: http://h/mcp\n", []string{"upstreams[0]", "not both"}},
		{"neither", "upstreams:\n  - name: a\n", []string{"upstreams[0]", "set command"}},
		{"bad name", "upstreams:\n  - name: My Server\n    command: x\n", []string{"upstreams[0].name", "a-z 0-9"}},
		{"duplicate name", "upstreams:\n  - name: a\n    command: x\n  - name: a\n    command: y\n", []string{"upstreams[1].name", "used by another"}},
		{"negative price", "cashu:\n  mints: [http://m]\nupstreams:\n  - name: a\n    command: x\n    tools:\n      t: {price_sats: -1}\n", []string{"upstreams[0].tools.t", "negative"}},
		{"two prices", "cashu:\n  mints: [http://m]\nupstreams:\n  - name: a\n    command: x\n    tools:\n      t: {price_sats: 1, price_msat: 1000}\n", []string{"not both"}},
		{"price without backend", "upstreams:\n  - name: a\n    command: x\n    tools:\n      t: {price_sats: 1}\n", []string{"no payment backend"}},
		{"bad mint", "cashu:\n  mints: [mint.example.com]\n", []string{"cashu.mints[0]", "http(s) mint URL"}},
		{"not yaml", "ledger: [unclosed\n", []string{"capvend.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig("capvend.yaml", []byte(tc.yaml), func(string) string { return "" })
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestExplicitConfigMustExist(t *testing.T) {
	capvendtest.Chdir(t, t.TempDir())
	_, errOut, code := run(t, map[string]string{"CAPVEND_CONFIG": "missing.yaml"}, "ledger", "balance")
	if code != 1 || !strings.Contains(errOut, "missing.yaml") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// bookSomething puts a settled, delivered call into a ledger at path.
func bookSomething(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	l, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := sha256.Sum256([]byte("args"))
	c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "mcp-http", Client: "c", RequestID: "1", Server: "weather",
		Name: "forecast", ArgsHash: hex.EncodeToString(h[:]), Price: 21_000, Idempotent: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.RecordPayment(ctx, c.ID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice,
		Ref: strings.Repeat("ab", 32), Bolt11: "lnbcrt1", Amount: 21_000, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 21_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
}

func TestLedgerCommands(t *testing.T) {
	dir := t.TempDir()
	capvendtest.Chdir(t, dir)
	if _, _, code := run(t, nil, "init"); code != 0 {
		t.Fatal("init")
	}
	// No ledger yet: a clear error, and no file is created.
	if _, errOut, code := run(t, nil, "ledger", "verify"); code != 1 || !strings.Contains(errOut, "no ledger file") {
		t.Fatalf("verify without a ledger: exit %d %s", code, errOut)
	}
	if _, err := os.Stat("capvend.db"); !os.IsNotExist(err) {
		t.Fatal("a read command created the ledger")
	}
	bookSomething(t, filepath.Join(dir, "capvend.db"))

	out, _, code := run(t, nil, "ledger", "verify")
	if code != 0 || !strings.Contains(out, "checks passed") || !strings.Contains(out, "(quick_check)") {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	out, _, code = run(t, nil, "ledger", "verify", "--full")
	if code != 0 || !strings.Contains(out, "checks passed") || !strings.Contains(out, "(integrity_check)") {
		t.Fatalf("verify --full: exit %d\n%s", code, out)
	}
	out, _, code = run(t, nil, "ledger", "balance")
	if code != 0 || !strings.Contains(out, "income:tools:weather:forecast") || !strings.Contains(out, "21.000") {
		t.Fatalf("balance: exit %d\n%s", code, out)
	}
	for _, format := range ledger.Formats {
		file := "books." + format
		if _, errOut, code := run(t, nil, "ledger", "export", "--format", format, "--out", file); code != 0 {
			t.Fatalf("export %s: %s", format, errOut)
		}
		b, err := os.ReadFile(file)
		if err != nil || !bytes.Contains(b, []byte("forecast")) {
			t.Fatalf("export %s: %v\n%s", format, err, b)
		}
		if st, _ := os.Stat(file); st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %o", file, st.Mode().Perm())
		}
	}
	out, _, _ = run(t, nil, "ledger", "export", "--db", "capvend.db", "--since", "2000-01-01", "--until", "2001-01-01")
	if out != "entry,time,kind,account,amount_msat,call,payment,description\n" {
		t.Fatalf("empty range: %q", out)
	}

	// Tampering makes verify fail with a readable report and exit 1.
	db, _ := sql.Open("sqlite3", "capvend.db")
	db.Exec("DROP TRIGGER postings_no_update")
	db.Exec("UPDATE postings SET amount_msat = 1 WHERE id = 1")
	db.Close()
	out, errOut, code := run(t, nil, "ledger", "verify")
	if code != 1 || !strings.Contains(out, "FAIL  every entry balances") || !strings.Contains(errOut, "failed verification") {
		t.Fatalf("verify of a tampered ledger: exit %d\n%s\n%s", code, out, errOut)
	}
}

func TestLedgerCommandRefusesForeignFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "photos.db")
	db, _ := sql.Open("sqlite3", path)
	db.Exec("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
	db.Close()
	_, errOut, code := run(t, nil, "ledger", "balance", "--db", path)
	if code != 1 || !strings.Contains(errOut, "another application") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// TestBinaryBuildsAndRuns builds the real binary once and runs it: what a
// user types, exit codes included.
func TestBinaryBuildsAndRuns(t *testing.T) {
	t.Parallel()
	skip.Short(t, "builds the binary")
	bin := filepath.Join(t.TempDir(), "capvend")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/capvend/capvend/cmd/capvend").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "init", "--out", filepath.Join(dir, "capvend.yaml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("init: %v %s", err, out)
	}
	bookSomething(t, filepath.Join(dir, "capvend.db"))
	cmd = exec.Command(bin, "ledger", "verify", "--config", filepath.Join(dir, "capvend.yaml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("verify: %v %s", err, out)
	}
	cmd = exec.Command(bin, "ledger", "nope")
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("unknown command: %v", err)
	}
}

// TestReadmeConfigValidates keeps the README's configuration example (its
// first yaml block) true.
func TestReadmeConfigValidates(t *testing.T) {
	blocks := docBlocks(t, "README.md", "yaml")
	if len(blocks) == 0 {
		t.Fatal("README has no yaml block")
	}
	cfg, err := parseConfig(filepath.Join(t.TempDir(), "capvend.yaml"), []byte(blocks[0]), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstreams[0].Tools["forecast"].Msat() != 21_000 {
		t.Fatalf("%+v", cfg.Upstreams[0])
	}
}

// TestReleaseHasNoFailpoints: the crash tests' SIGKILL hook is only in
// builds with the capvend_failpoints tag; this test binary, like a
// release, is built without it and ignores CAPVEND_FAILPOINT.
func TestReleaseHasNoFailpoints(t *testing.T) {
	if failpoints(func(string) string { return "after_quote" }) != nil {
		t.Fatal("a build without the capvend_failpoints tag has the SIGKILL failpoint hook")
	}
}
