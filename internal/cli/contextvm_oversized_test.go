package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/internal/testkit/ledgerkit"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/testnet/exampletools"
)

// relayLimit is the message limit of the relays of the oversized tests:
// what public relays commonly take (and advertise in NIP-11).
const relayLimit = 64 << 10

// oversizedConfig writes a configuration selling example-tools with bulk
// (t_bulk at 7 sats, t_sha256 at 21) over the Nostr front on relay, paid
// with the stack's vendor node.
func oversizedConfig(t testing.TB, s *testnet.Stack, relay, nsec string) (path, listen string) {
	t.Helper()
	vendor, _ := s.Node(testnet.Vendor)
	listen = capvendtest.FreeAddr(t)
	cfg := fmt.Sprintf(`ledger:
  path: capvend.db
server:
  name: "capvend e2e"
http:
  listen: %s
lnd:
  host: %s
  tls_cert_file: %s
  macaroon_file: %s
nostr:
  relays: [%s]
  nsec_file: %s
payments:
  ttl: 2m
upstreams:
  - name: tools
    command: %s
    args: [--bulk]
    prefix: t_
    tools:
      sha256: {price_sats: 21}
      bulk: {price_sats: 7}
`, listen, vendor.RPCHost, vendor.TLSCert, vendor.InvoiceMacaroon, relay, nsec, capvendtest.ExampleTools(t))
	path = filepath.Join(t.TempDir(), "capvend.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, listen
}

// TestContextVMOversizedStockClient: the stock @contextvm/sdk client,
// plaintext and gift wrapped, through a relay that takes no message over
// 64 KiB (and says so in NIP-11), pays for answers of 1 MiB and 4 MiB and
// gets them byte-exact (CEP-22 frames to the client), and pays for a hash
// of a large argument: 300 KiB plaintext; gift wrapped, what the stock
// client can send (its encrypted requests must stay under NIP-44's 65535
// bytes as one event: 40,000 bytes, split as it is over 48,000 wrapped).
// Each call is paid once; the ledger verifies.
func TestContextVMOversizedStockClient(t *testing.T) {
	s := needStack(t)
	needNPM(t, "contextvm")
	relay := testkit.LimitedRelay(t, relayLimit)
	server, nsec := capvendtest.ServerKey(t)
	path, _ := oversizedConfig(t, s, relay, nsec)
	startCapvend(t, path)
	c := dialContextVM(t, relay, server)
	c.waitReady()
	c.waitNames("tools/list", "t_bulk", "t_sha256")

	for _, tc := range []struct {
		encryption string
		argBytes   int
	}{{"disabled", 300 << 10}, {"optional", 40_000}} {
		t.Run("encryption "+tc.encryption, func(t *testing.T) {
			lines := runNode(t, filepath.Join("testdata", "contextvm"), s.Pay, "oversized.mjs",
				relay, server, tc.encryption, "t_bulk", "1024,4096", "t_sha256", strconv.Itoa(tc.argBytes))
			for _, kib := range []int{1024, 4096} {
				sum := sha256.Sum256([]byte(exampletools.BulkText(kib)))
				want := fmt.Sprintf("%d %s", kib<<10, hex.EncodeToString(sum[:]))
				if got := lines["BIG"+strconv.Itoa(kib)]; got != want {
					t.Errorf("bulk %d KiB: the stock client got %q, want %q", kib, got, want)
				}
			}
			sum := sha256.Sum256([]byte(strings.Repeat("a", tc.argBytes)))
			if got := lines["ARG"]; got != hex.EncodeToString(sum[:]) {
				t.Errorf("sha256 of %d bytes: the stock client got %q", tc.argBytes, got)
			}
			if lines["DONE"] != "true" {
				t.Errorf("the stock client did not finish: %v", lines)
			}
		})
	}

	l := ledgerkit.OpenVerified(t, filepath.Join(filepath.Dir(path), "capvend.db"))
	b, err := l.Balance(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	revenue := map[string]int64{}
	for _, tr := range b.Tools {
		revenue[tr.Account[strings.LastIndex(tr.Account, ":")+1:]] += int64(tr.Revenue)
	}
	// Per mode: two bulk answers (7 sats each) and one hash (21 sats),
	// each paid once.
	if revenue["bulk"] != 4*7_000 || revenue["sha256"] != 2*21_000 {
		t.Fatalf("revenue %v (msat), want bulk %d and sha256 %d: %+v", revenue, 4*7_000, 2*21_000, b.Tools)
	}
}

// TestContextVMOversizedStockServer: capvend's own ContextVM client reads
// the stock @contextvm/sdk server's oversized answers (1 MiB plaintext,
// 40 KiB gift wrapped: all it can send so) through a relay that takes no message over 64 KiB,
// byte-exact, and sends it a 300 KiB request as frames (interop both
// ways).
func TestContextVMOversizedStockServer(t *testing.T) {
	needNPM(t, "contextvm")
	relay := testkit.LimitedRelay(t, relayLimit)
	server, _ := startSDKServer(t, "oversized-server.mjs", relay)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, relay, server, ctxvmclient.Options{Oversized: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	text := func(res json.RawMessage) string {
		var r struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if err := json.Unmarshal(res, &r); err != nil || len(r.Content) != 1 {
			t.Fatalf("result %.300s: %v", res, err)
		}
		return r.Content[0].Text
	}
	// Gift wrapped, the stock server splits only answers whose inner
	// event is under NIP-44's 65535 bytes (it measures the whole answer
	// as one wrap first, and that throws above): 40 KiB, split as its
	// wrap is over 48,000 bytes.
	for _, tc := range []struct{ wrap, kib int }{{0, 1024}, {ctxvmclient.KindGiftWrap, 40}} {
		wrap := tc.wrap
		m, rec, err := c.Request(ctx, "tools/call", map[string]any{"name": "bulk", "arguments": map[string]any{"kib": tc.kib}},
			ctxvmclient.Request{Wrap: wrap})
		if err != nil || m.Error != nil {
			t.Fatalf("bulk (wrap %d): %v %v", wrap, err, m.Error)
		}
		if got := text(m.Result); got != exampletools.BulkText(tc.kib) {
			t.Fatalf("bulk (wrap %d): %d bytes, not the %d KiB the server sent", wrap, len(got), tc.kib)
		}
		if rec.Frames < 3 || rec.Wrapped != wrap {
			t.Fatalf("bulk (wrap %d) came in %d frames, wrapped %d", wrap, rec.Frames, rec.Wrapped)
		}
	}
	arg := strings.Repeat("é", 150<<10) // 300 KiB
	m, _, err := c.Request(ctx, "tools/call", map[string]any{"name": "size", "arguments": map[string]any{"text": arg}}, ctxvmclient.Request{})
	sum := sha256.Sum256([]byte(arg))
	if err != nil || m.Error != nil || text(m.Result) != fmt.Sprintf("%d %x", len(arg), sum) {
		t.Fatalf("size of 300 KiB: %s %v %v", m.Result, m.Error, err)
	}
}

// refusingRelay serves a relay that refuses every event of pubkey (and
// every gift wrap) with reason, until the test ends.
func refusingRelay(t *testing.T, pubkey, reason string) string {
	t.Helper()
	rl := testkit.NewRelay()
	rl.RejectEvent = append(rl.RejectEvent, func(_ context.Context, ev *nostr.Event) (bool, string) {
		return ev.PubKey == pubkey || ev.Kind == ctxvmclient.KindGiftWrap || ev.Kind == ctxvmclient.KindEphemeralGiftWrap, reason
	})
	return testkit.ServeRelay(t, rl)
}

// TestServeRefusingRelay: `capvend serve` on a relay that refuses every
// event of its key and one that limits messages to 64 KiB: answers go by
// the other relay; an answer too large for both (bulk, 1 MiB, to a client
// without CEP-22) gets a -32058 error at once, not a timeout; the log
// names the refusing relay's reason, the metrics count its refusals by
// relay and reason and the undelivered answer, and /readyz shows the
// relay that refuses our events (and is not ready once every relay does).
func TestServeRefusingRelay(t *testing.T) {
	t.Parallel()
	const reason = "blocked: not on this relay's list of writers"
	sk := nostr.GeneratePrivateKey()
	server, _ := nostr.GetPublicKey(sk)
	refuser := refusingRelay(t, server, reason)
	limited := testkit.LimitedRelay(t, relayLimit)
	path, _ := capvendtest.NostrToolsConfig(t, limited, sk, "ex_")
	cfg, _ := os.ReadFile(path)
	cfg = []byte(strings.Replace(string(cfg), "relays: ["+limited+"]", "relays: ["+refuser+", "+limited+"]", 1))
	cfg = []byte(strings.Replace(string(cfg), "    command: ", "    args: [--bulk]\n    command: ", 1))
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := capvendtest.AdminConfig(t, path, "")
	sv := startCapvend(t, path)
	c := dialContextVM(t, limited, server)
	c.waitReady()
	c.waitNames("tools/list", "ex_bulk")

	start := time.Now()
	m := c.until(c.request(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ex_bulk","arguments":{"kib":1024}}}`), func(cvmMessage) {})
	if m.Error == nil || m.Error.Code != -32058 || !strings.Contains(m.Error.Message, "larger than the relays take") {
		t.Fatalf("answer %.200s %+v, want error -32058", m.Result, m.Error)
	}
	if d := time.Since(start); d > 30*time.Second { // a bound: PublishTimeout is 10 s; the stock client waits 60 s
		t.Fatalf("the error came after %s", d)
	}
	if !strings.Contains(sv.Logs(), "relay="+refuser+" reason=\""+reason+"\"") {
		t.Fatalf("the log does not name the relay's reason:\n%s", sv.Logs())
	}
	_, metrics := capvendtest.Get(t, "http://"+addr+"/metrics", "")
	for _, want := range []string{
		`capvend_nostr_publish_failures_total{reason="blocked",relay="` + refuser + `"}`,
		`capvend_nostr_publish_failures_total{reason="too-large",relay="` + limited + `"} 1`,
		`capvend_nostr_undelivered_answers_total 1`,
		`capvend_nostr_published_total{relay="` + limited + `"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, capvendtest.GrepLines(metrics, "capvend_nostr"))
		}
	}
	code, body := capvendtest.Get(t, "http://"+addr+"/readyz", "")
	if !strings.Contains(body, refuser+" refuses our events (\""+reason+"\"") {
		t.Fatalf("readyz %d does not show the refusing relay:\n%s", code, body)
	}

	// On the refusing relay alone (its announcements refused): not ready.
	path2, _ := capvendtest.NostrToolsConfig(t, refuser, sk, "ex_")
	addr2 := capvendtest.AdminConfig(t, path2, "")
	startCapvend(t, path2)
	for i := 0; ; i++ { // until the announcements were refused: a hang guard, not a speed check
		code, body = capvendtest.Get(t, "http://"+addr2+"/readyz", "")
		if strings.Contains(body, "not ready: nostr: every relay refuses our events: "+refuser) || i == 300 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != 503 || !strings.Contains(body, "not ready: nostr: every relay refuses our events: "+refuser) {
		t.Fatalf("readyz %d with every relay refusing:\n%s", code, body)
	}
}

// TestDoctorRelayLimitsAndRefusals: doctor reports a relay's advertised
// message limit and that it takes our events that large; a relay that
// refuses our events fails, with the relay's reason.
func TestDoctorRelayLimitsAndRefusals(t *testing.T) {
	t.Parallel()
	s := newDoctorSetup(t)
	s.relays = []string{testkit.LimitedRelay(t, relayLimit)}
	rep, _, code := run(t, nil, "doctor", "--config", s.write(t))
	if l := wantStatus(t, rep, "relay "+s.relays[0], "ok"); !strings.Contains(l, "takes our events of 65536 bytes (its advertised max_message_length)") {
		t.Fatalf("exit %d; relay line %q", code, l)
	}
	// A relay that refuses the server's events: the key is written by
	// s.write, so refuse by kind.
	const reason = "restricted: this relay takes no kind 25910"
	rl := testkit.NewRelay()
	rl.RejectEvent = append(rl.RejectEvent, func(_ context.Context, ev *nostr.Event) (bool, string) {
		return ev.Kind == ctxvmclient.KindMessage, reason
	})
	s.relays = []string{testkit.ServeRelay(t, rl)}
	rep, _, code = run(t, nil, "doctor", "--config", s.write(t))
	if l := wantStatus(t, rep, "relay "+s.relays[0], "FAIL"); code != 1 || !strings.Contains(l, reason) {
		t.Fatalf("exit %d; relay line %q", code, l)
	}
}
