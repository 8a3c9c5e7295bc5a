package cli

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
)

// payDoc's HTTP walk-through runs from the line that sets url to the
// ledger check, in the order it is written, in one shell session as a
// user pastes it.
const (
	payDoc   = "docs/PAYING.md"
	payFirst = "url=http://127.0.0.1:8402/mcp"
	payServe = "capvend serve --config regtest.yaml"
	payLast  = "capvend ledger verify --config regtest.yaml"
)

// payElsewhere are commands inside the walk-through's range that
// TestREADME runs on their own (in the demo's folder).
var payElsewhere = []string{"capvend l402 list", "capvend credit"}

// payingFromHTTP runs payDoc's walk-through of L402, MPP, x402, X-Cashu
// and credit with curl against `capvend serve` on the shared regtest stack:
// each line runs in bash, literally (the README's port replaced by a free
// one), with capvend on PATH and the stack as its testnet; shell
// variables carry over from line to line as in a terminal. It checks what
// the document promises: the 402 with its challenges, the paid results,
// the credit balance, and `ledger verify`.
func payingFromHTTP(t *testing.T, run func(string, func(*testing.T))) {
	cmds, _ := docCommands(t, payDoc)
	first, last := slices.Index(cmds, payFirst), slices.Index(cmds, payLast)
	serveAt := slices.Index(cmds, payServe)
	if first < 0 || last < first || serveAt < 0 || serveAt > first {
		t.Errorf("%s's HTTP payment walk-through (%q, then %q ... %q) is not in order", payDoc, payServe, payFirst, payLast)
		return
	}
	for _, bin := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(bin); err != nil {
			for _, cmd := range append([]string{payServe}, cmds[first:last+1]...) {
				run(cmd, func(t *testing.T) { skip.Missing(t, bin+" is not installed", "apt-get install bash curl") })
			}
			return
		}
	}
	stack := needStack(t)
	dir := t.TempDir()
	listen := payConfig(t, stack, dir)
	startCapvend(t, filepath.Join(dir, "regtest.yaml")) // until the walk-through ends
	run(payServe, func(t *testing.T) { waitListed(t, "http://"+listen+"/.well-known/capvend.json") })
	if err := os.WriteFile(filepath.Join(dir, "vars.sh"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sh := &payShell{dir: dir, listen: listen, env: append(os.Environ(),
		"PATH="+filepath.Dir(builtCapvend(t))+string(os.PathListSeparator)+os.Getenv("PATH"),
		"CAPVEND_TESTNET_DIR="+stack.Info.Dir, "CAPVEND_CONFIG=")}
	for _, cmd := range cmds[first : last+1] {
		switch {
		case cmd == payServe || slices.Contains(payElsewhere, cmd):
		case t.Failed(): // the next lines need the failed one's variables
			run(cmd, func(t *testing.T) { t.Skip("not run: an earlier line of the walk-through failed") })
		default:
			run(cmd, func(t *testing.T) { payCheck(t, cmd, sh.run(t, cmd), sh) })
		}
	}
}

// payShell runs the walk-through's lines in bash in dir, carrying the lowercase shell
// variables from one line to the next in dir/vars.sh.
type payShell struct {
	dir, listen string
	env         []string
}

func (sh *payShell) run(t *testing.T, line string) string {
	t.Helper()
	line = strings.ReplaceAll(line, "127.0.0.1:8402", sh.listen)
	script := "set -eo pipefail\n. ./vars.sh\n" + line +
		"\nfor v in $(compgen -v); do case $v in [a-z]*) declare -p \"$v\";; esac; done > vars.sh\n"
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = sh.dir, sh.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", line, err, out, stderr.String())
	}
	return string(out)
}

// value is the shell variable name as the walk-through left it.
func (sh *payShell) value(t *testing.T, name string) string {
	t.Helper()
	return strings.TrimSpace(sh.run(t, `printf '%s\n' "$`+name+`"`))
}

// payCheck checks the output of one walk-through line against what
// payDoc says it shows.
func payCheck(t *testing.T, cmd, out string, sh *payShell) {
	hi := fmt.Sprintf("%x", sha256.Sum256([]byte("hi")))
	want := func(subs ...string) {
		t.Helper()
		for _, s := range subs {
			if !strings.Contains(out, s) {
				t.Errorf("%s: output lacks %q:\n%s", cmd, s, out)
			}
		}
	}
	t.Logf("output:\n%s", out)
	switch {
	case strings.Contains(cmd, "-w '%{http_code}\\n'"): // the used credential again
		if out != "401\n" {
			t.Errorf("%s: HTTP %q, want 401", cmd, out)
		}
	case strings.HasSuffix(cmd, "| tee 402.txt"):
		want("HTTP/1.1 402 Payment Required", `Authenticate: L402 macaroon="`, `invoice="lnbcrt`, `"code":402`)
	case strings.HasPrefix(cmd, "mac="):
		if v := sh.value(t, "mac"); len(v) < 40 || !strings.HasPrefix(v, "AgE") {
			t.Errorf("mac = %q, want a base64 macaroon", v)
		}
	case strings.HasPrefix(cmd, "inv="):
		if v := sh.value(t, "inv"); !strings.HasPrefix(v, "lnbcrt") {
			t.Errorf("inv = %q, want a regtest bolt11", v)
		}
	case strings.HasPrefix(cmd, "pre="):
		if v := sh.value(t, "pre"); len(v) != 64 {
			t.Errorf("pre = %q, want a hex preimage", v)
		}
	case strings.HasSuffix(cmd, "| grep -i '^x-cashu'"):
		want("creqA")
	case strings.HasPrefix(cmd, "tok="):
		if v := sh.value(t, "tok"); !strings.HasPrefix(v, "cashuB") {
			t.Errorf("tok = %q, want a cashuB token", v)
		}
	case strings.Contains(cmd, "X-Cashu: $tok"):
		want(`"method":"notifications/payment_accepted"`, `"pmi":"bitcoin-cashu-token"`, `"result"`, hi)
	case strings.Contains(cmd, "Authorization: L402") && strings.Contains(cmd, `"$topup"`):
		want(`"result"`, `"balance_msat":100000`)
	case strings.Contains(cmd, "Authorization: L402") && strings.Contains(cmd, `"$call"`):
		want(`"result"`, hi)
		if strings.Contains(sh.value(t, "topup"), "capvend_topup") { // after the top-up: paid from credit
			want(`"balance_msat":79000`)
		}
	case strings.HasSuffix(cmd, "| grep -i '^www-authenticate: payment'"): // MPP's challenge
		want(`Payment id="`, `realm="capvend"`, `method="lightning"`, `intent="charge"`, `request="`, `expires="`)
	case strings.HasPrefix(cmd, "challenge="):
		if v := sh.value(t, "challenge"); !strings.Contains(v, `"method":"lightning"`) || !strings.Contains(v, `"id":"`) {
			t.Errorf("challenge = %q, want the auth-params as JSON members", v)
		}
	case strings.Contains(cmd, "Authorization: Payment $cred"):
		want(`"result"`, hi)
	case strings.HasPrefix(cmd, "sid="):
		if v := sh.value(t, "sid"); v == "" {
			t.Error("no Mcp-Session-Id")
		}
	case strings.Contains(cmd, "notifications/initialized"): // 202, no body
		if out != "" {
			t.Errorf("%s printed %q", cmd, out)
		}
	case strings.HasSuffix(cmd, "| grep -i '^payment-required'"): // x402's challenge
		want("eyJ")
	case strings.HasPrefix(cmd, "req="):
		if v := sh.value(t, "req"); !strings.Contains(v, `"paymentMethod":"lightning"`) || !strings.Contains(v, `"scheme":"exact"`) {
			t.Errorf("req = %q, want x402 exact Lightning requirements", v)
		}
	case strings.Contains(cmd, "PAYMENT-SIGNATURE: $sig"):
		want(`"result"`, hi, `"x402/payment-response":{"success":true`)
	case cmd == "capvend credit --config regtest.yaml":
		want("1 account(s), 79.000 sat owed in credit")
	case cmd == payLast:
		want("checks passed")
	case strings.Contains(cmd, "="): // url, h, meta, call, topup: set only
		if out != "" {
			t.Errorf("%s printed %q", cmd, out)
		}
	default:
		t.Fatalf("no check for %s's %q: update payCheck", payDoc, cmd)
	}
}

// waitListed waits until the discovery document at url lists a tool (the
// upstream connects in the background).
func waitListed(t *testing.T, url string) {
	for i := 0; ; i++ {
		out, err := exec.Command("curl", "-s", url).Output()
		if err == nil && strings.Contains(string(out), `"price_sats"`) {
			return
		}
		if i == 1200 {
			t.Fatalf("%s lists no tool after a minute: %v %s", url, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// payConfig writes dir/regtest.yaml: payDoc's configuration for the
// walk-through, its placeholders replaced by the stack's vendor node (TLS
// certificate and a 0600 copy of the invoice macaroon in dir, as payDoc
// says), the stack's mint, example-tools and a free port, which it
// returns.
func payConfig(t *testing.T, s *testnet.Stack, dir string) string {
	var cfg string
	for _, b := range docBlocks(t, payDoc, "yaml") {
		if strings.Contains(b, "path: regtest.db") {
			cfg = b
		}
	}
	v, _ := s.Node(testnet.Vendor)
	for name, src := range map[string]string{"vendor-tls.cert": v.TLSCert, "vendor-invoice.macaroon": v.InvoiceMacaroon} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listen := capvendtest.FreeAddr(t)
	for _, r := range [][2]string{
		{"listen: 127.0.0.1:8402", "listen: " + listen},
		{"host: 127.0.0.1:10009", "host: " + v.RPCHost},
		{"[http://127.0.0.1:3338]", "[" + s.MintURL + "]"},
		{"command: bin/example-tools", "command: " + capvendtest.ExampleTools(t)},
		{"tls_cert_file: vendor-tls.cert", "tls_cert_file: vendor-tls.cert"},
		{"macaroon_file: vendor-invoice.macaroon", "macaroon_file: vendor-invoice.macaroon"},
	} {
		if !strings.Contains(cfg, r[0]) {
			t.Fatalf("%s's regtest.yaml lacks %q: update payConfig\n%s", payDoc, r[0], cfg)
		}
		cfg = strings.ReplaceAll(cfg, r[0], r[1])
	}
	if err := os.WriteFile(filepath.Join(dir, "regtest.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return listen
}
