package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/testnet"
)

// TestDemo runs `capvend demo` as a user does: the real binary, its own
// regtest stack, a customer paying over Lightning and Cashu, the books,
// and teardown. It checks the exit status, the transcript's milestones and
// that nothing is left behind in the temporary folder.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a regtest stack (not in -short mode)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin := capvendBin
	if bin == "" {
		var err error
		if bin, err = testnet.BuildCapvend(ctx, t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	tmp := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, "demo")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("capvend demo: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{
		"tools/list: always_fails (5 sats), confirm (free), sha256 (21 sats)",
		"word_count(\"Lightning pays for tools\"), free: 4 words",
		"sha256 paid over Lightning (LND hold invoice): payment_required 21 sats",
		"sha256 paid through a Cashu mint quote: payment_required 21 sats",
		"sha256 paid with a 21-sat Cashu token",
		"the same token again is refused",
		"refused before any charge: invalid params",
		"the invoice was canceled and the customer's balance is back to the msat",
		"[cap tool:sha256 21 sats]",
		"payment_required -> payment_accepted -> result",
		"income:tools:example:sha256           4         84.000",
		"income:tools:example:sha256  -21.000 SAT",
		"all 12 checks passed",
		"teardown: stopping the regtest stack",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("transcript lacks %q:\n%s", want, out.String())
		}
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "capvend-demo-*"))
	if len(left) > 0 {
		t.Errorf("the demo left %v behind", left)
	}
}
