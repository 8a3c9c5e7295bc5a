package ledger_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// fixtureLedger books a small but varied history: Lightning and Cashu
// settlements (with a mint fee and an overpayment), a hold invoice cancelled
// after a failure, a refund of a settled call, an adjustment, names that
// Beancount cannot spell as they are, a sold prompt and a sold resource
// (read through a URI template), and entries on two UTC days.
func fixtureLedger(t *testing.T) *ledger.Ledger {
	t.Helper()
	ctx := context.Background()
	c := newClock()
	c.t = time.Date(2026, 11, 20, 23, 59, 45, 0, time.UTC)
	l, err := ledger.OpenForTest(t, ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	// Migrations read the clock too: start the history at a fixed time
	// whatever their number.
	c.t = time.Date(2026, 11, 20, 23, 59, 45, 0, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var item vend.ItemKind // what the next call sells ("": a tool)
	call := func(i int, server, tool string, price vend.Msat, kind vend.PaymentKind, backend vend.Backend) (vend.Call, vend.Payment) {
		nc := newCall(i)
		nc.Server, nc.Name, nc.Price, nc.Kind = server, tool, price, item
		cl, _, err := l.RecordCall(ctx, nc)
		must(err)
		np := newPayment(i)
		np.Kind, np.Backend, np.Amount = kind, backend, price
		if kind == vend.KindHoldInvoice {
			np.HoldPreimage = make([]byte, 32)
		}
		if backend == vend.BackendCashu {
			np.MintURL = "http://127.0.0.1:3338"
		}
		p, err := l.RecordPayment(ctx, cl.ID, np)
		must(err)
		return cl, p
	}
	deliver := func(c vend.Call) {
		_, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice))
		must(err)
		must(l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{"content":[]}`)}))
	}

	c1, p1 := call(1, "demo", "echo", 21_000, vend.KindInvoice, vend.BackendLND)
	_, err = l.SettlePayment(ctx, vend.Settlement{Ref: p1.Ref, Amount: 21_000})
	must(err)
	deliver(c1)

	c2, p2 := call(2, "weather", "forecast_7d", 50_500, vend.KindToken, vend.BackendCashu)
	_, err = l.SettlePayment(ctx, vend.Settlement{Ref: p2.Ref, Amount: 52_000, Fee: 1_000})
	must(err)
	deliver(c2)

	c3, p3 := call(3, "demo", "echo", 21_000, vend.KindHoldInvoice, vend.BackendLND)
	_, err = l.AcceptPayment(ctx, p3.Ref)
	must(err)
	_, err = l.StartExecution(ctx, c3.ID, c3.Binding(), c3.Released(vend.SchemeInvoice))
	must(err)
	must(l.Fail(ctx, c3.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "upstream timed out"))
	_, err = l.EndPayment(ctx, p3.Ref, vend.PaymentCanceled, "tool failed")
	must(err)
	must(l.Refund(ctx, c3.ID, "hold invoice canceled"))

	c4, p4 := call(4, "my.srv", "get_quote", 1_001, vend.KindMintQuote, vend.BackendCashu)
	_, err = l.SettlePayment(ctx, vend.Settlement{Ref: p4.Ref, Amount: 1_001})
	must(err)
	_, err = l.StartExecution(ctx, c4.ID, c4.Binding(), c4.Released(vend.SchemeInvoice))
	must(err)
	must(l.Fail(ctx, c4.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, `said "no", then crashed; sorry`))
	must(l.Refund(ctx, c4.ID, `upstream said "no", then crashed; sorry`))

	c5, p5 := call(5, "my-srv", "get-quote", 2_000, vend.KindInvoice, vend.BackendLND)
	_, err = l.SettlePayment(ctx, vend.Settlement{Ref: p5.Ref, Amount: 2_000})
	must(err)
	deliver(c5)

	// An unpaid quote stays pending and books nothing.
	call(6, "demo", "echo", 21_000, vend.KindInvoice, vend.BackendLND)

	item = vend.ItemPrompt
	c7, p7 := call(7, "demo", "summarize", 3_000, vend.KindInvoice, vend.BackendLND)
	_, err = l.SettlePayment(ctx, vend.Settlement{Ref: p7.Ref, Amount: 3_000})
	must(err)
	deliver(c7)
	item = vend.ItemResource
	c8, p8 := call(8, "demo", "docs://guide/{page}", 1_500, vend.KindInvoice, vend.BackendLND)
	_, err = l.SettlePayment(ctx, vend.Settlement{Ref: p8.Ref, Amount: 1_500})
	must(err)
	deliver(c8)
	item = ""

	must(l.Post(ctx, ledger.Entry{Kind: "melt", Description: "melted ecash to Lightning", Postings: []ledger.Posting{
		{Account: ledger.AccountLND, Amount: 40_000},
		{Account: ledger.CashuFeeAccount("http://127.0.0.1:3338"), Amount: 2_000},
		{Account: ledger.CashuAccount("http://127.0.0.1:3338"), Amount: -42_000},
	}}))
	return l
}

func TestExportGolden(t *testing.T) {
	l := fixtureLedger(t)
	mustVerify(t, l)
	for _, format := range ledger.Formats {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			if err := l.Export(context.Background(), &buf, ledger.ExportOptions{Format: format}); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "export."+format)
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("export differs from %s (go test -update rewrites it):\n%s", golden, buf.String())
			}
		})
	}
}

func TestExportJSONLIsJSONAndBalanced(t *testing.T) {
	l := fixtureLedger(t)
	var buf bytes.Buffer
	if err := l.Export(context.Background(), &buf, ledger.ExportOptions{Format: ledger.FormatJSONL}); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	n := 0
	for sc.Scan() {
		var e struct {
			Entry    int64
			Postings []struct {
				Account    string
				AmountMsat int64 `json:"amount_msat"`
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %d: %v", n+1, err)
		}
		var sum int64
		for _, p := range e.Postings {
			sum += p.AmountMsat
		}
		if sum != 0 || len(e.Postings) < 2 {
			t.Fatalf("entry %d: sum %d over %d postings", e.Entry, sum, len(e.Postings))
		}
		n++
	}
	if n != 8 {
		t.Fatalf("%d entries, want 8", n)
	}
}

func TestExportSinceUntil(t *testing.T) {
	l := fixtureLedger(t)
	day2 := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	count := func(opts ledger.ExportOptions) int {
		opts.Format = ledger.FormatJSONL
		var buf bytes.Buffer
		if err := l.Export(context.Background(), &buf, opts); err != nil {
			t.Fatal(err)
		}
		return strings.Count(buf.String(), "\n")
	}
	before, after, all := count(ledger.ExportOptions{Until: day2}), count(ledger.ExportOptions{Since: day2}), count(ledger.ExportOptions{})
	if before == 0 || after == 0 || before+after != all {
		t.Fatalf("before=%d after=%d all=%d", before, after, all)
	}
}

// requireTool finds an accounting tool; CI installs them, so there a missing
// tool fails the test instead of skipping it.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		skip.Missing(t, name+" is not installed", "apt-get install beancount hledger")
	}
	return p
}

func TestBeancountExportPassesBeanCheck(t *testing.T) {
	beanCheck := requireTool(t, "bean-check")
	l := fixtureLedger(t)
	file := filepath.Join(t.TempDir(), "capvend.beancount")
	f, _ := os.Create(file)
	if err := l.Export(context.Background(), f, ledger.ExportOptions{Format: ledger.FormatBeancount}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command(beanCheck, file).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("bean-check: %v\n%s", err, out)
	}
	// bean-query agrees with our balance of the tools' income.
	if bq, err := exec.LookPath("bean-query"); err == nil {
		out, err := exec.Command(bq, "-q", "-f", "csv", file,
			"SELECT account, sum(number) AS total WHERE account ~ '^Income:(Tools|Prompts|Resources)' GROUP BY account ORDER BY account").CombinedOutput()
		if err != nil {
			t.Fatalf("bean-query: %v\n%s", err, out)
		}
		got := strings.ReplaceAll(string(out), " ", "")
		for _, want := range []string{
			"Income:Tools:Demo:Echo,-21.000",
			"Income:Tools:Weather:Forecast-7d,-50.500",
			"Income:Tools:My-srv:Get-quote,0.000",    // my.srv/get_quote: paid, then refunded
			"Income:Tools:My-srv:Get-quote-9,-2.000", // my-srv/get-quote: same Beancount spelling, kept apart
			"Income:Prompts:Demo:Summarize,-3.000",
			"Income:Resources:Demo:Docs---guide--page-,-1.500",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("bean-query output lacks %q:\n%s", want, out)
			}
		}
	}
}

func TestHledgerExportLoadsInHledger(t *testing.T) {
	hledger := requireTool(t, "hledger")
	l := fixtureLedger(t)
	file := filepath.Join(t.TempDir(), "capvend.journal")
	f, _ := os.Create(file)
	if err := l.Export(context.Background(), f, ledger.ExportOptions{Format: ledger.FormatHledger}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command(hledger, "-f", file, "balance", "--flat", "--no-elide", "-O", "csv").CombinedOutput()
	if err != nil {
		t.Fatalf("hledger balance: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{
		`"assets:lightning:lnd","67.500 SAT"`,
		`"income:prompts:demo:summarize","-3.000 SAT"`,
		`"income:resources:demo:docs---guide--page-","-1.500 SAT"`,
		`"income:tools:demo:echo","-21.000 SAT"`,
		`"income:tools:weather:forecast_7d","-50.500 SAT"`,
		`"income:overpayments","-1.500 SAT"`,
		`"liabilities:refunds","-1.001 SAT"`,
		`"total","0"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("hledger balance lacks %s:\n%s", want, got)
		}
	}
}
