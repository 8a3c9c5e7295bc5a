package cli

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/internal/capvendtest"
)

// TestNUT24PaysWithCashuTS: the official MCP TypeScript SDK client, its
// fetch wrapped to pay HTTP 402s with cashu-ts (testdata/nut24/client.mjs),
// buys t_sha256 (21 sats) from `capvend serve` (payments.http_402, the
// regtest mint as Cashu backend) with tokens minted at that mint from the
// customer node. cashu-ts decodes our X-Cashu request (amount, unit,
// mints); a 10-sat token, a token naming another mint and one in another
// unit get HTTP 400 and stay unspent at the mint; a 30-sat token pays, the call runs once, the
// mint reports its proofs spent and the 9 sats of change come back to the
// client; the spent token is refused for another call; the proofs refused
// for their mint then pay a call. The ledger verifies.
func TestNUT24PaysWithCashuTS(t *testing.T) {
	dir := needNPM(t, "nut24")
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{cashu: true, http402: true})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	lines := runNode(t, dir, s.Pay, "client.mjs", url, s.MintURL)
	t.Logf("NUT-24 client saw: %v", lines)

	var creq struct {
		Amount     int64    `json:"amount"`
		Unit       string   `json:"unit"`
		Mints      []string `json:"mints"`
		SingleUse  bool     `json:"singleUse"`
		Transports any      `json:"transports"`
	}
	if err := json.Unmarshal([]byte(lines["CREQ"]), &creq); err != nil {
		t.Fatalf("CREQ %q: %v", lines["CREQ"], err)
	}
	if creq.Amount != 21 || creq.Unit != "sat" || len(creq.Mints) != 1 || creq.Mints[0] != s.MintURL || !creq.SingleUse || creq.Transports != nil {
		t.Fatalf("cashu-ts decoded X-Cashu as %+v; want 21 sat at %s", creq, s.MintURL)
	}
	want := fmt.Sprintf("%x", sha256.Sum256([]byte("paid over HTTP 402")))
	for word, sub := range map[string]string{
		"UNDERPAID":        "does not cover the price",
		"UNDERPAID_STATES": `["UNSPENT"`,
		"FOREIGN":          "from a mint this server does not accept",
		"UNIT":             "not in sats",
		"FOREIGN_STATES":   `["UNSPENT"`,
		"RESULT":           want,
		"PAID_STATES":      `["SPENT"`,
		"DOUBLE":           "already spent",
		"REUSED":           fmt.Sprintf("%x", sha256.Sum256([]byte("paid with the refused proofs"))),
		"DONE":             "true",
	} {
		if !strings.Contains(lines[word], sub) {
			t.Errorf("%s line %q lacks %q", word, lines[word], sub)
		}
	}
	for _, word := range []string{"UNDERPAID_STATES", "FOREIGN_STATES", "PAID_STATES"} {
		other := "SPENT"
		if word == "PAID_STATES" {
			other = "UNSPENT"
		}
		if strings.Contains(lines[word], `"`+other+`"`) {
			t.Errorf("%s: %s", word, lines[word])
		}
	}
	var accepted struct {
		Amount int64 `json:"amount"`
		Meta   struct {
			Change string `json:"change"`
		} `json:"_meta"`
	}
	if err := json.Unmarshal([]byte(lines["ACCEPTED"]), &accepted); err != nil || accepted.Meta.Change == "" {
		t.Fatalf("no change in payment_accepted: %q (%v)", lines["ACCEPTED"], err)
	}
	change, err := cashu.ParseToken(accepted.Meta.Change)
	if err != nil || change.Amount != 9 {
		t.Fatalf("change %+v (%v), want 9 sats", change, err)
	}

	if ran := capvendtest.PaidRuns(t, db); ran != 2 { // the 30-sat token's call and the reused proofs' call
		t.Fatalf("%d calls ran, want 2", ran)
	}
}

// runNode runs node on script in dir with args, paying each
// "PAY <bolt11>" line it writes with pay (with none, such a line fails
// the test), and returns its output lines "<WORD> <rest>" by word (the
// last of each). The script must exit 0.
func runNode[R any](t *testing.T, dir string, pay func(context.Context, string) (R, error), script string, args ...string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // a hang guard
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	var pays sync.WaitGroup
	var mu sync.Mutex
	var payErr error
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		word, rest, _ := strings.Cut(sc.Text(), " ")
		lines[word] = rest
		if word == "PAY" && pay == nil {
			payErr = fmt.Errorf("asked to pay %s", rest)
		} else if word == "PAY" {
			pays.Add(1)
			go func() {
				defer pays.Done()
				if _, err := pay(ctx, rest); err != nil {
					mu.Lock()
					payErr = err
					mu.Unlock()
				}
			}()
		}
	}
	err = cmd.Wait()
	pays.Wait()
	if err != nil || payErr != nil {
		t.Fatalf("node %s %v: %v, paying: %v\nstdout: %v\nstderr: %s", script, args, err, payErr, lines, stderr.String())
	}
	return lines
}
