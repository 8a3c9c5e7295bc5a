package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
)

// docFiles are the Markdown files whose commands TestREADME runs, as
// paths from the repository's root: README.md, then docs/*.md by name.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, "docs/"+filepath.Base(d))
	}
	return files
}

// docBlocks returns the fenced code blocks of a language in file (a path
// from the repository's root), one string per block. Only a fence that
// starts its line counts: a block indented under a list item is an
// illustration, not a command to run or a configuration to check.
func docBlocks(t *testing.T, file, lang string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("../..", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []string
	var cur *strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && line == "```"+lang:
			cur = &strings.Builder{}
		case cur != nil && line == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

// docCommands are the shell commands (the lines of `sh` blocks) of files,
// in order, and the file each comes from.
func docCommands(t *testing.T, files ...string) (cmds []string, from map[string]string) {
	t.Helper()
	from = map[string]string{}
	for _, file := range files {
		for _, b := range docBlocks(t, file, "sh") {
			for _, line := range strings.Split(b, "\n") {
				if line = strings.TrimSpace(line); line != "" {
					cmds = append(cmds, line)
					if from[line] == "" {
						from[line] = file
					}
				}
			}
		}
	}
	return cmds, from
}

// TestREADME runs every command of README.md and docs/*.md (every line of
// their `sh` blocks), the way a newcomer would, and fails when one of them
// gains a command this test does not run. Commands not to run (a load
// test, a deployment) go in `console` or unmarked blocks. Each
// capvend command is the built binary run in its folder (capvendIn), so
// the test changes no working directory and runs beside the other
// parallel tests.
//
//   - `go run ./cmd/capvend demo`: the built capvend binary runs `demo
//     --dir D` (the same command keeping its files), against its own
//     regtest stack; the transcript's milestones are checked and every
//     process it started must be gone.
//   - The ledger commands (docs/OPERATING.md) then run in D, on the
//     demo's ledger, and hledger and bean-check read the exports;
//     Litestream (built from its pinned version) replicates the ledger
//     to a file:// replica, and `ledger restore` brings it back, verified.
//   - `capvend init` and `capvend serve` run in a fresh folder: the
//     written configuration validates, and serve answers an MCP client.
//   - docs/PAYING.md's HTTP walk-through: `capvend serve --config
//     regtest.yaml` runs in-process on the shared regtest stack, and the
//     curl walk-through (L402, MPP, x402, X-Cashu, credit) runs line by
//     line in bash (payingFromHTTP).
//   - docs/OPERATING.md's PostgreSQL commands then start a stack with its
//     PostgreSQL server, move a copy of the demo's ledger into it and
//     verify it there (readmePostgres).
//   - `go test -race -timeout 60m ./...` is what .ci/run runs; this test checks
//     that it does.
func TestREADME(t *testing.T) {
	t.Parallel() // its commands run as the built binary, each in its folder
	files := docFiles(t)
	cmds, from := docCommands(t, files...)
	ran := map[string]bool{}
	run := func(cmd string, f func(t *testing.T)) {
		t.Helper()
		if !slices.Contains(cmds, cmd) {
			t.Errorf("README.md and docs/ no longer have %q: update this test", cmd)
			return
		}
		ran[cmd] = true
		t.Run(cmd, f)
	}
	// Checked first so a stale README fails fast, whatever else happens.
	defer func() {
		for _, c := range cmds {
			if !ran[c] {
				t.Errorf("%s: command %q is not run by TestREADME (a command not to run goes in a console block)", from[c], c)
			}
		}
	}()

	run("go test -race -timeout 60m ./...", func(t *testing.T) {
		b, err := os.ReadFile("../../.ci/run")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "\ngo test -race -timeout 60m ./...\n") {
			t.Fatal(".ci/run does not run the README's test command")
		}
	})

	if len(docBlocks(t, "README.md", "yaml")) == 0 {
		t.Fatal("the README has no configuration example")
	}
	t.Run("configuration example", func(t *testing.T) {
		for _, file := range files {
			for _, c := range docBlocks(t, file, "yaml") {
				if _, err := parseConfig(filepath.Join(t.TempDir(), "capvend.yaml"), []byte(c), func(string) string { return "" }); err != nil {
					t.Errorf("%s: a configuration is refused: %v\n%s", file, err, c)
				}
			}
		}
	})

	fresh := t.TempDir()
	run("capvend init", func(t *testing.T) {
		out := capvendIn(t, fresh, nil, "init")
		if _, err := loadConfig(filepath.Join(fresh, "capvend.yaml"), func(string) string { return "" }); err != nil {
			t.Fatalf("init wrote a configuration that does not load: %v (%s)", err, out)
		}
	})
	run("capvend serve --config capvend.yaml", func(t *testing.T) {
		src, listen := capvendtest.FreeToolsConfig(t, "") // builds example-tools from here
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "capvend.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		startCapvend(t, path)
		c, err := client.NewStreamableHttpClient("http://" + listen + "/mcp")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
		init.Params.Capabilities.Experimental = map[string]any{mcpfront.CapabilityPayments: map[string]any{}}
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatal(err)
		}
		// The upstream connects in the background: wait for its tools.
		for {
			list, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Tools) > 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal("serve lists no tools after a minute")
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	const discover = "curl -s http://127.0.0.1:8402/.well-known/capvend.json"
	run(discover, func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			skip.Missing(t, "curl is not installed", "apt-get install curl")
		}
		src, listen := capvendtest.FreeToolsConfig(t, "")
		startCapvend(t, src)
		url := strings.Replace(strings.Fields(discover)[2], "127.0.0.1:8402", listen, 1)
		var doc struct {
			MCP   string `json:"mcp"`
			Tools []struct {
				Name      string `json:"name"`
				PriceSats *int64 `json:"price_sats"`
			} `json:"tools"`
			Payments struct {
				L402 struct {
					Supported *bool `json:"supported"`
				} `json:"l402"`
			} `json:"payments"`
		}
		deadline := time.Now().Add(time.Minute)
		for { // the upstream connects in the background
			out, err := exec.Command("curl", "-s", url).Output()
			if err == nil && json.Unmarshal(out, &doc) == nil && len(doc.Tools) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v\n%s", discover, err, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if doc.MCP != "/mcp" || doc.Tools[0].Name == "" || doc.Tools[0].PriceSats == nil || doc.Payments.L402.Supported == nil {
			t.Fatalf("discovery document: %+v", doc)
		}
	})

	run("capvend unannounce --config capvend.yaml", func(t *testing.T) {
		relay := testkit.Relay(t)
		src, sk := capvendtest.UnannounceConfig(t, relay)
		pk, _ := nostr.GetPublicKey(sk)
		r, err := nostr.RelayConnect(context.Background(), relay)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		ann := nostr.Event{Kind: ctxvm.KindAnnounceTools, CreatedAt: nostr.Now(), Content: `{"tools":[]}`}
		ann.Sign(sk)
		if err := r.Publish(context.Background(), ann); err != nil {
			t.Fatal(err)
		}
		capvendIn(t, filepath.Dir(src), nil, "unannounce", "--config", "capvend.yaml")
		if n := len(capvendtest.AnnouncementsOn(t, relay, pk)); n != 0 {
			t.Fatalf("%d announcements left after unannounce", n)
		}
	})

	if testing.Short() {
		for _, c := range cmds {
			ran[c] = true
		}
		skip.Short(t, "the demo and the ledger commands need the regtest stack")
	}
	operating(t, run)
	payingFromHTTP(t, run)
	demoDir := filepath.Join(t.TempDir(), "demo")
	run("go run ./cmd/capvend demo", func(t *testing.T) { runDemoBinary(t, demoDir) })
	if t.Failed() {
		return
	}
	ledgerCmd := func(cmd string, check func(t *testing.T, out string)) {
		run(cmd, func(t *testing.T) {
			out := capvendIn(t, demoDir, nil, strings.Fields(cmd)[1:]...)
			if check != nil {
				check(t, out)
			}
		})
	}
	tool := func(cmd string, bin string) {
		run(cmd, func(t *testing.T) {
			if _, err := exec.LookPath(bin); err != nil {
				skip.Missing(t, bin+" is not installed", "apt-get install beancount hledger")
			}
			f := strings.Fields(cmd)
			c := exec.Command(f[0], f[1:]...)
			c.Dir = demoDir
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, out)
			}
			if bin == "hledger" && !strings.Contains(string(out), "income:tools:example:sha256") {
				t.Errorf("hledger balance lacks the income account:\n%s", out)
			}
		})
	}
	ledgerCmd("capvend ledger export --format hledger --out books.journal", nil)
	tool("hledger -f books.journal balance", "hledger")
	ledgerCmd("capvend ledger export --format beancount --out books.beancount", nil)
	tool("bean-check books.beancount", "bean-check")
	ledgerCmd("capvend ledger export --format csv --since 2026-11-01 --until 2026-12-01", func(t *testing.T, out string) {
		// The demo's entries are dated now: inside the README's window
		// only in November 2026.
		now := time.Now().UTC()
		inWindow := now.Year() == 2026 && now.Month() == time.November
		rows := strings.Count(out, "\n") - 1
		if !strings.HasPrefix(out, "entry,time,kind,account,amount_msat,") || (rows > 0) != inWindow {
			t.Errorf("csv export (%d rows, window holds now: %v):\n%s", rows, inWindow, out)
		}
	})
	ledgerCmd("capvend ledger balance", func(t *testing.T, out string) {
		if !strings.Contains(out, "income:tools:example:sha256") {
			t.Errorf("balance:\n%s", out)
		}
	})
	ledgerCmd("capvend ledger verify", func(t *testing.T, out string) {
		if !strings.Contains(out, "checks passed") {
			t.Errorf("verify:\n%s", out)
		}
	})
	ledgerCmd("capvend ledger backup --to backups/capvend.db", func(t *testing.T, out string) {
		if !strings.Contains(out, "checks passed") {
			t.Errorf("backup:\n%s", out)
		}
	})
	ledgerCmd("capvend ledger verify --db backups/capvend.db", func(t *testing.T, out string) {
		if !strings.Contains(out, "checks passed") {
			t.Errorf("verify of the backup:\n%s", out)
		}
	})
	// Continuous backup: Litestream replicates the demo's ledger to a
	// file:// replica (the README's ledger.replica, in a folder of the
	// test), and the ledger is restored from it.
	var litestreamBin string
	replicated := false
	run("capvend ledger litestream-config --out litestream.yml", func(t *testing.T) {
		litestreamBin = capvendtest.Litestream(t)
		path := filepath.Join(demoDir, "capvend.yaml")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		const at = "ledger:\n  path: capvend.db\n"
		if !strings.Contains(string(b), at) {
			t.Fatalf("the demo's configuration has no %q:\n%s", at, b)
		}
		cfg := strings.Replace(string(b), at, fmt.Sprintf("%s  replica: file://%s\n  litestream: %s\n", at, filepath.Join(demoDir, "replica"), litestreamBin), 1)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		capvendIn(t, demoDir, nil, "ledger", "litestream-config", "--out", "litestream.yml")
	})
	run("litestream replicate -config litestream.yml", func(t *testing.T) {
		if litestreamBin == "" {
			t.Skip("no Litestream: see litestream-config above")
		}
		capvendtest.Replicating(t, litestreamBin, filepath.Join(demoDir, "litestream.yml")) // stopped when this subtest ends
		cfg, err := loadConfig(filepath.Join(demoDir, "capvend.yaml"), func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		caughtUp(t, cfg)
		replicated = true
	})
	replicaCmd := func(cmd string) {
		ledgerCmd(cmd, func(t *testing.T, out string) {
			if !strings.Contains(out, "checks passed") {
				t.Errorf("%s:\n%s", cmd, out)
			}
		})
	}
	if replicated {
		replicaCmd("capvend ledger restore --to restored/capvend.db")
		replicaCmd("capvend ledger verify --db restored/capvend.db")
	} else {
		for _, cmd := range []string{"capvend ledger restore --to restored/capvend.db", "capvend ledger verify --db restored/capvend.db"} {
			run(cmd, func(t *testing.T) { t.Skip("nothing replicated: see litestream replicate above") })
		}
	}
	// The demo's answers are minutes old: none is past 30 days.
	ledgerCmd("capvend ledger prune --older-than 720h", func(t *testing.T, out string) {
		if !strings.Contains(out, "pruned 0 stored results and 0 stored replies") {
			t.Errorf("prune:\n%s", out)
		}
	})
	// The demo's failed call was paid by a hold invoice: canceled, nothing
	// owed.
	ledgerCmd("capvend refunds", func(t *testing.T, out string) {
		if !strings.Contains(out, "no refunds owed") {
			t.Errorf("refunds:\n%s", out)
		}
	})
	ledgerCmd("capvend refunds --all", func(t *testing.T, out string) {
		if !strings.Contains(out, "0 refund(s) owed") {
			t.Errorf("refunds --all:\n%s", out)
		}
	})
	// The demo revokes no L402 token.
	ledgerCmd("capvend l402 list", func(t *testing.T, out string) {
		if !strings.Contains(out, "0 L402 token(s) revoked") {
			t.Errorf("l402 list:\n%s", out)
		}
	})
	// The demo buys no credit: no accounts, nothing owed.
	ledgerCmd("capvend credit", func(t *testing.T, out string) {
		if !strings.Contains(out, "0 account(s), 0.000 sat owed in credit") {
			t.Errorf("credit:\n%s", out)
		}
	})
	readmePostgres(t, run, filepath.Join(demoDir, "capvend.db"))
}

// runDemoBinary runs `capvend demo --dir dir` as a user does: the real
// binary, its own regtest stack, a customer paying over Lightning and
// Cashu, the books, and teardown.
func runDemoBinary(t *testing.T, dir string) {
	c := startCapvend(t, "", capvendtest.Options{Args: []string{"demo", "--dir", dir}, Process: true})
	if code := c.Wait(); code != 0 {
		t.Fatalf("capvend demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, c.Stdout(), c.Stderr())
	}
	for _, want := range []string{
		"tools/list: always_fails (5 sats), confirm (free), sha256 (20-50 sats)",
		"word_count(\"Lightning pays for tools\"), free: 4 words",
		"sha256 paid over Lightning (LND hold invoice): payment_required 21 sats (sha256: 1 KB of text × 1 sat/KB + 20 sat = 21 sat)",
		"sha256 paid through a Cashu mint quote: payment_required 21 sats",
		"sha256 paid with a 21-sat Cashu token",
		"the same token again is refused: Payment failed: the Cashu token was already spent",
		"refused before any charge: Invalid params: at /text",
		"the invoice was canceled and the customer's balance is back to the msat",
		"[cap tool:sha256 20-50 sats]",
		"payment_required -> payment_accepted -> result",
		"income:tools:example:sha256           4         84.000",
		"income:tools:example:sha256  -21.000 SAT",
		"checks passed",
		"teardown: stopping the regtest stack",
	} {
		if !strings.Contains(c.Stdout(), want) {
			t.Errorf("transcript lacks %q:\n%s", want, c.Stdout())
		}
	}
	st, err := testnet.Load(filepath.Join(dir, "stack"), nil)
	if err == nil {
		running := st.Running()
		st.Release()
		if running {
			t.Error("the demo left its regtest stack running")
		}
	}
}

// operating runs docs/OPERATING.md's doctor and reconcile commands in a fresh
// folder whose configuration sells example-tools through the shared
// regtest stack's vendor LND (its invoice macaroon) and mint: doctor
// passes (liquidity is skipped: the invoice macaroon cannot read it), and
// reconcile finds the books of a new ledger in agreement, records each run,
// and lists them.
func operating(t *testing.T, run func(string, func(*testing.T))) {
	stack := needStack(t)
	v, _ := stack.Node(testnet.Vendor)
	dir := t.TempDir()
	cfg := fmt.Sprintf("ledger:\n  path: capvend.db\nlnd:\n  host: %s\n  tls_cert_file: %s\n  macaroon_file: %s\n"+
		"cashu:\n  mints: [%s]\n  wallet_dir: wallet\nupstreams:\n  - name: tools\n    command: %s\n    tools:\n      sha256:\n        price_sats: 21\n",
		v.RPCHost, v.TLSCert, v.InvoiceMacaroon, stack.MintURL, capvendtest.ExampleTools(t))
	if err := os.WriteFile(filepath.Join(dir, "capvend.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "wallet"), 0o700); err != nil {
		t.Fatal(err)
	}
	capvend := func(t *testing.T, args ...string) string {
		t.Helper()
		return capvendIn(t, dir, nil, args...)
	}
	run("capvend doctor --config capvend.yaml", func(t *testing.T) {
		out := capvend(t, "doctor", "--config", "capvend.yaml")
		for _, want := range []string{"ok    lnd: ", "skip  liquidity: ", "ok    upstream tools: ", "ok    clock: ", "ok    secrets: "} {
			if !strings.Contains(out, want) {
				t.Errorf("doctor lacks %q:\n%s", want, out)
			}
		}
	})
	ctx := context.Background()
	l, err := ledger.Open(ctx, filepath.Join(dir, "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	run("capvend reconcile --config capvend.yaml", func(t *testing.T) {
		if out := capvend(t, "reconcile", "--config", "capvend.yaml"); !strings.Contains(out, "the books agree") {
			t.Errorf("reconcile:\n%s", out)
		}
	})
	run("capvend reconcile --config capvend.yaml --repair", func(t *testing.T) {
		if out := capvend(t, "reconcile", "--config", "capvend.yaml", "--repair"); !strings.Contains(out, "the books agree") {
			t.Errorf("reconcile --repair:\n%s", out)
		}
	})
	run("capvend reconcile --config capvend.yaml --last 5", func(t *testing.T) {
		if out := capvend(t, "reconcile", "--config", "capvend.yaml", "--last", "5"); strings.Count(out, "0 difference(s)") != 2 {
			t.Errorf("reconcile --last 5 (two runs so far):\n%s", out)
		}
	})
}
