package cli

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
)

// TestMCPInspectorBuysWithNothingInstalled: the official MCP Inspector CLI
// as the host (a stock client: no capvend/payments capability, no _meta)
// buys t_sha256 from `capvend serve` on the regtest stack. The first call
// answers with a tool result whose text holds the invoice and the
// payment token (never -32042); the customer node pays the invoice; the
// second call, with the same arguments plus capvend_payment, gets the
// tool's result; a third with the same token is refused. The upstream ran
// once, for exactly one settled payment.
func TestMCPInspectorBuysWithNothingInstalled(t *testing.T) {
	inspector, err := filepath.Abs(filepath.Join(needNPM(t, "inspector"), "node_modules/.bin/mcp-inspector"))
	if err != nil {
		t.Fatal(err)
	}
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	run := func(args ...string) (string, error) {
		cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer ccancel()
		b, err := exec.CommandContext(cctx, inspector, append([]string{"--cli", url, "--transport", "http", "--method", "tools/call",
			"--tool-name", "t_sha256", "--tool-arg", "text=bought by a stock host"}, args...)...).CombinedOutput()
		return string(b), err
	}
	var first string
	for attempt := 0; ; attempt++ { // the upstream may still be connecting
		out, err := run()
		if err == nil && strings.Contains(out, "Payment required") {
			first = out
			break
		}
		if attempt == 40 {
			t.Fatalf("first call: %v\n%s", err, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if strings.Contains(first, "-32042") {
		t.Fatalf("a stock host got -32042:\n%s", first)
	}
	var res struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	if err := json.Unmarshal([]byte(first[strings.Index(first, "{"):]), &res); err != nil || !res.IsError || len(res.Content) == 0 {
		t.Fatalf("first call: not an isError tool result (%v):\n%s", err, first)
	}
	text := res.Content[0].Text
	bolt11 := regexp.MustCompile(`\blnbcrt[0-9a-z]+`).FindString(text)
	m := regexp.MustCompile(`plus capvend_payment: (cvp_[0-9a-f]+)`).FindStringSubmatch(text)
	if bolt11 == "" || m == nil || !strings.Contains(text, "lightning:"+bolt11) || !strings.Contains(text, "21 sats") {
		t.Fatalf("content[0].text lacks the amount, invoice, lightning: URI or retry instructions:\n%s", text)
	}
	token := m[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := s.Pay(ctx, bolt11); err != nil {
		t.Fatalf("paying %s: %v", bolt11, err)
	}
	want := fmt.Sprintf("%x", sha256.Sum256([]byte("bought by a stock host")))
	for attempt := 0; ; attempt++ { // the settlement may reach capvend after the payer returns
		out, err := run("--tool-arg", "capvend_payment="+token)
		if err == nil && strings.Contains(out, want) {
			break
		}
		if err != nil || !strings.Contains(out, "Payment not received yet") || attempt == 100 {
			t.Fatalf("second call with capvend_payment: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := run("--tool-arg", "capvend_payment="+token)
	if err == nil || !strings.Contains(out, "payment token already used") || strings.Contains(out, want) {
		t.Fatalf("third call with the same token: %v\n%s", err, out)
	}

	if ran := capvendtest.PaidRuns(t, db); ran != 1 {
		t.Fatalf("%d calls ran, want 1", ran)
	}
}
