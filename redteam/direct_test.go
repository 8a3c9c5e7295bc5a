package redteam

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm"
)

// TestDirectPaymentTag: a Cashu token in a ContextVM request's CEP-8
// ["direct_payment", "bitcoin-cashu-v4-direct", token] tag is the cashu
// way to pay by another carrier, under the same rules. In a plaintext
// event it is refused naming encryption, nothing is recorded and the
// token stays unspent. Gift wrapped, a token too small is refused with
// payment_rejected (and stays unspent); one large enough pays the call
// once, payment_accepted naming the PMI with the change in a ["change",
// pmi, token] tag that redeems at the mint; the same request event sent
// again gets the kept answer and is not charged again. No plaintext event
// capvend signed carries a token.
func TestDirectPaymentTag(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{nostr: true, cashu: true})
	seen := watchAuthored(t, sh)
	c := dialNostr(t, sh)
	c.waitReady()
	mint := func(sats uint64) string {
		t.Helper()
		tok, err := sh.s.CashuMint(context.Background(), sats)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	direct := func(tok string) nostr.Tag { return nostr.Tag{"direct_payment", ctxvm.PMICashuDirect, tok} }
	var notes []nostrMsg
	note := func(m nostrMsg) { notes = append(notes, m) }
	sha := func(text string) map[string]any { return callParams("sha256", map[string]any{"text": text}, nil) }

	// Plaintext: refused before anything is recorded or spent.
	tok := mint(30)
	m := c.untilResponse(c.send(ctxvmPlain, 1, "tools/call", sha("plain"), direct(tok)), note)
	if m.Error == nil || m.Error.Code != -32600 || !strings.Contains(m.Error.Message, "encrypted") || len(notes) != 0 {
		t.Fatalf("plaintext direct payment: %s after %v, want only -32600 naming encryption", m, notes)
	}
	nothingCharged(t, sh)

	// Too small: payment_rejected, then -32051; the token is the client's.
	small := mint(5)
	m = c.untilResponse(c.send(ctxvmWrapped, 2, "tools/call", sha("small"), direct(small)), note)
	if m.Error == nil || m.Error.Code != -32051 || len(notes) != 1 || notes[0].Method != "notifications/payment_rejected" ||
		!strings.Contains(string(notes[0].Params), ctxvm.PMICashuDirect) {
		t.Fatalf("underpaying direct payment: %s after %v, want payment_rejected then -32051", m, notes)
	}
	if n := redeem(t, sh.s, small); n < 4 {
		t.Fatalf("the rejected 5-sat token redeemed %d sats: it was spent", n)
	}

	// Enough, wrapped: paid once, the change in a tag and in _meta.
	notes = nil
	ev := c.build(ctxvmWrapped, 3, "tools/call", sha("wrapped"), nostr.Tag{"pmi", ctxvm.PMICashuDirect}, direct(tok))
	m = c.untilResponse(c.publish(ctxvmWrapped, ev), note)
	if !strings.Contains(string(m.Result), sha256Hex("wrapped")) || len(notes) != 1 || notes[0].Method != notePaymentAccepted {
		t.Fatalf("the wrapped call paid with a 30-sat token in the tag: %s after %v", m, notes)
	}
	var acc struct {
		Amount int64  `json:"amount"`
		PMI    string `json:"pmi"`
		Meta   struct {
			Change string `json:"change"`
		} `json:"_meta"`
	}
	json.Unmarshal(notes[0].Params, &acc)
	change := notes[0].tags.Find("change")
	if acc.Amount != 21 || acc.PMI != ctxvm.PMICashuDirect || len(change) != 3 || change[1] != ctxvm.PMICashuDirect ||
		change[2] != acc.Meta.Change || !strings.HasPrefix(change[2], "cashu") {
		t.Fatalf("payment_accepted %s tags %v, want amount 21, pmi %s and the change in a tag", notes[0].Params, notes[0].tags, ctxvm.PMICashuDirect)
	}
	if n := redeem(t, sh.s, change[2]); n == 0 || n > 9 {
		t.Fatalf("the change of 30 sats for 21 redeemed %d sats", n)
	}

	// The same request event again (in a new wrap): the kept answer.
	notes = nil
	again := c.untilResponse(c.publish(ctxvmWrapped, ev), note)
	if string(again.Result) != string(m.Result) {
		t.Fatalf("the same request again: %s, want the kept answer %s", again, m.Result)
	}
	calls, _ := readLedger(t, sh.db)
	paid := 0
	for _, c := range calls {
		if c.request == ev.ID {
			paid += len(c.payments)
			if c.executions != 1 {
				t.Errorf("the direct-paid call ran %d times", c.executions)
			}
		}
	}
	if paid != 1 {
		t.Fatalf("the direct-paid request has %d payments, want 1", paid)
	}

	sh.stop() // every answer is published before capvend exits
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for _, e := range seen.events {
		if e.Kind == kindGiftWrap || e.Kind == kindEphemeralGW {
			continue
		}
		if s := secretsIn(e.Content+fmt.Sprint(e.Tags), nil); len(s) > 0 {
			t.Errorf("a plaintext event capvend signed (kind %d) carries %v: %.300s", e.Kind, s, e.Content)
		}
	}
}
