package redteam

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/nbd-wtf/go-nostr"
)

// Issue 11, hole 4 and "Invoice spam cannot take the shop down": fresh
// identities asking priced calls and never paying must not stop a real
// customer who then buys. This is the small-scale version (the figures
// come from the load generator): 50 Nostr keys × 10 calls, 20 HTTP
// clients × 10, under limits.max_unpaid_total 100.

const (
	spamClients  = 50
	spamPerKey   = 10
	maxUnpaid    = 100
	spamLimitsYA = "  requests_per_minute: 100000\n  max_unpaid_total: 100\n"
)

// openInvoices counts the shop's invoices still OPEN on the vendor node.
func openInvoices(t *testing.T, sh *shop) int {
	t.Helper()
	db := openLedger(t, sh.db)
	rows, err := db.Query(`SELECT ref FROM payments WHERE backend = 'lnd'`)
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for rows.Next() {
		var r string
		rows.Scan(&r)
		refs = append(refs, r)
	}
	rows.Close()
	n := 0
	for _, r := range refs {
		if vendorInvoiceState(t, sh.s, r) == lnrpc.Invoice_OPEN {
			n++
		}
	}
	return n
}

// honestNostrBuy has a fresh key buy sha256 over ContextVM and pay.
func honestNostrBuy(t *testing.T, sh *shop) {
	t.Helper()
	c := dialNostr(t, sh)
	id := c.send(ctxvmPlain, 1, "tools/call", callParams("sha256", map[string]any{"text": "honest"}, nil))
	var paid <-chan error
	m := c.untilResponse(id, func(n nostrMsg) {
		if n.Method == notePaymentRequired && paid == nil {
			paid = payAsync(sh.s, n.payReq)
		}
	})
	if paid == nil {
		t.Fatalf("the honest customer was not asked to pay: %v", m)
	}
	if err := <-paid; err != nil {
		t.Fatalf("the honest customer's payment: %v", err)
	}
	if !strings.Contains(string(m.Result), sha256Hex("honest")) {
		t.Fatalf("the honest customer was not served under the flood: %v", m)
	}
}

func TestInvoiceSpamNostr(t *testing.T) {
	sh := startShop(t, shopOpts{nostr: true, limits: spamLimitsYA})
	ready := dialNostr(t, sh)
	ready.waitReady()
	var wg sync.WaitGroup
	errs := make(chan error, spamClients)
	for k := range spamClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := nostr.RelayConnect(ctx, sh.s.RelayURL)
			if err != nil {
				errs <- err
				return
			}
			defer r.Close()
			sk := nostr.GeneratePrivateKey()
			for i := range spamPerKey {
				ev := nostr.Event{Kind: kindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", sh.serverPK}},
					Content: request(i, "tools/call", callParams("sha256", map[string]any{"text": fmt.Sprintf("spam %d/%d", k, i)}, nil))}
				ev.Sign(sk)
				if err := r.Publish(ctx, ev); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("spamming: %v", err)
	}
	// The flood's quotes are being made; the honest customer buys now.
	honestNostrBuy(t, sh)
	if n := openInvoices(t, sh); n > maxUnpaid {
		t.Errorf("%d open invoices on the vendor node, limits.max_unpaid_total %d", n, maxUnpaid)
	}
}

func TestInvoiceSpamHTTP(t *testing.T) {
	// capvend counts HTTP clients by address: the flood comes from
	// 127.0.0.2 ... 127.0.0.21, the customer from 127.0.0.1.
	sh := startShop(t, shopOpts{limits: spamLimitsYA})
	const clients = 20
	var streams []*stream
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newHTTPClientFrom(t, sh, fmt.Sprintf("127.0.0.%d", k+2))
			sess, err := c.tryInitialize()
			if err != nil {
				return
			}
			for i := range spamPerKey {
				st, err := c.postRaw(sess, request(i, "tools/call", callParams("sha256", map[string]any{"text": fmt.Sprintf("spam %d/%d", k, i)}, nil)), nil)
				if err != nil {
					continue
				}
				st.next(time.Minute) // payment_required, or a refusal
				mu.Lock()
				streams = append(streams, st)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, st := range streams {
			st.close()
		}
	}()
	c := newHTTPClient(t, sh)
	sess := c.initialize()
	st, err := c.postRaw(sess, request(1, "tools/call", callParams("sha256", map[string]any{"text": "honest"}, nil)), nil)
	if err != nil {
		t.Fatalf("the honest customer under the flood: %v", err)
	}
	defer st.close()
	var paid <-chan error
	m, _ := untilResponse(t, st, func(b string) { paid = payAsync(sh.s, b) })
	if paid == nil {
		t.Fatalf("the honest customer was not asked to pay: %s", m)
	}
	if err := <-paid; err != nil {
		t.Fatalf("the honest customer's payment: %v", err)
	}
	if !strings.Contains(string(m.Result), sha256Hex("honest")) {
		t.Fatalf("the honest customer was not served under the flood: %s", m)
	}
	if n := openInvoices(t, sh); n > maxUnpaid {
		t.Errorf("%d open invoices on the vendor node, limits.max_unpaid_total %d", n, maxUnpaid)
	}
}
