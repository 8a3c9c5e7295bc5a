package redteam

import (
	"context"
	"encoding/json"
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
// come from the load generator, cmd/capvend-flood): 50 Nostr keys × 10
// calls, 20 HTTP addresses × 10, under limits.max_unpaid_total 100 and
// lnd.max_hold_invoices 50.
//
// Under a flood capvend may refuse a request at once with -32053 ("too
// many payment requests waiting to be issued; ask again shortly") when
// its line to issue payment requests is full: a correct refusal, if it
// recorded and ran nothing. What must hold:
//   - every flood request is answered: a payment request, or -32053;
//   - a refused one left nothing open: no call in the ledger, or one
//     canceled without a payment; nothing ran unpaid (the money
//     invariant, at the end);
//   - a returning customer (a key, an address, that paid before) buys
//     during the flood;
//   - a fresh customer buys once the flood stopped;
//   - the vendor node holds at most max_hold_invoices open hold invoices
//     and at most max_unpaid_total open ones in all.

const (
	spamClients  = 50
	spamPerKey   = 10
	maxUnpaid    = 100
	maxHold      = 50
	spamLimitsYA = "  requests_per_minute: 100000\n  max_unpaid_total: 100\n"
	spamLNDYA    = "  max_hold_invoices: 50\n"
	codeLimit    = -32053
)

// floodOutcome counts how a flood's requests were answered.
type floodOutcome struct {
	mu       sync.Mutex
	quoted   []string // request keys answered with a payment request
	refused  []string // request keys refused -32053 (or another error)
	other    []string // answers that are neither
	missing  int      // requests not answered within the bound
	requests int
}

func (f *floodOutcome) add(quoted, refused, other []string, missing int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.quoted = append(f.quoted, quoted...)
	f.refused = append(f.refused, refused...)
	f.other = append(f.other, other...)
	f.missing += missing
}

// check fails t unless every flood request was quoted or refused, the
// ledger holds a call for each quoted one, and a refused one left nothing
// open: no call, or a canceled call whose payment requests (if any) are
// all canceled. A request refused after it took its place in the line
// and was recorded (see vend's issueQueue) has none; a quoted request
// shed as the oldest unpaid (-32053 "withdrawn") has its canceled
// invoice, and over Nostr its error can reach the client before its
// payment_required (two events, published apart). Keys are "client
// request_id", as the ledger has them.
func (f *floodOutcome) check(t *testing.T, sh *shop) {
	t.Helper()
	type row struct {
		state    string
		payments int // not canceled
	}
	inLedger := map[string]row{}
	db := openLedger(t, sh.db)
	rows, err := db.Query(`SELECT client, request_id, state, (SELECT count(*) FROM payments p WHERE p.call_id = c.id AND p.state <> 'canceled') FROM calls c`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var client, req string
		var r row
		rows.Scan(&client, &req, &r.state, &r.payments)
		inLedger[client+" "+req] = r
	}
	rows.Close()
	recorded := 0
	for _, k := range f.refused {
		r, ok := inLedger[k]
		if !ok {
			continue
		}
		recorded++
		if r.state != "canceled" || r.payments != 0 {
			t.Errorf("flood request %s was refused, yet its call is %s with %d payments not canceled", k, r.state, r.payments)
		}
	}
	t.Logf("flood: %d requests, %d quoted, %d refused at once (%d of them recorded and canceled), %d unanswered",
		f.requests, len(f.quoted), len(f.refused), recorded, f.missing)
	if len(f.other) > 0 {
		t.Errorf("flood requests answered neither with a payment request nor -32053: %v", f.other[:min(len(f.other), 5)])
	}
	if f.missing > 0 {
		t.Errorf("%d flood requests were never answered", f.missing)
	}
	for _, k := range f.quoted {
		if _, ok := inLedger[k]; !ok {
			t.Errorf("flood request %s was quoted but the ledger has no such call (are the keys read right?)", k)
			break
		}
	}
}

// invoiceCounts counts the shop's LND invoices still OPEN on the vendor
// node: hold invoices, and all.
func invoiceCounts(t *testing.T, sh *shop) (hold, all int) {
	t.Helper()
	db := openLedger(t, sh.db)
	rows, err := db.Query(`SELECT ref, kind FROM payments WHERE backend = 'lnd' AND state NOT IN ('settled', 'canceled')`)
	if err != nil {
		t.Fatal(err)
	}
	type inv struct{ ref, kind string }
	var invs []inv
	for rows.Next() {
		var i inv
		rows.Scan(&i.ref, &i.kind)
		invs = append(invs, i)
	}
	rows.Close()
	for _, i := range invs {
		if vendorInvoiceState(t, sh.s, i.ref) == lnrpc.Invoice_OPEN {
			all++
			if i.kind == "hold_invoice" {
				hold++
			}
		}
	}
	return hold, all
}

func checkInvoiceBounds(t *testing.T, sh *shop) {
	t.Helper()
	hold, all := invoiceCounts(t, sh)
	if hold > maxHold {
		t.Errorf("%d open hold invoices on the vendor node, lnd.max_hold_invoices %d", hold, maxHold)
	}
	if all > maxUnpaid {
		t.Errorf("%d open invoices on the vendor node, limits.max_unpaid_total %d", all, maxUnpaid)
	}
}

// nostrBuy has c buy sha256(text) over ContextVM and pay; it fails the
// test unless c is asked to pay and then served.
func nostrBuy(t *testing.T, sh *shop, c *nostrClient, who, text string) {
	t.Helper()
	id := c.send(ctxvmPlain, 1, "tools/call", callParams("sha256", map[string]any{"text": text}, nil))
	var paid <-chan error
	m := c.untilResponse(id, func(n nostrMsg) {
		if n.Method == notePaymentRequired && paid == nil {
			paid = payAsync(sh.s, n.payReq)
		}
	})
	if paid == nil {
		t.Fatalf("%s was not asked to pay: %v", who, m)
	}
	if err := <-paid; err != nil {
		t.Fatalf("%s's payment: %v", who, err)
	}
	if !strings.Contains(string(m.Result), sha256Hex(text)) {
		t.Fatalf("%s was not served: %v", who, m)
	}
}

// nostrFlooder is one fresh key of the flood: it sends spamPerKey priced
// calls and never pays, and reports how each was answered.
func nostrFlooder(ctx context.Context, sh *shop, k int, out *floodOutcome, sent func()) error {
	r, err := nostr.RelayConnect(ctx, sh.s.RelayURL)
	if err != nil {
		return err
	}
	defer r.Close()
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	sub, err := r.Subscribe(ctx, nostr.Filters{{Kinds: []int{kindMessage}, Tags: nostr.TagMap{"p": {pk}}}})
	if err != nil {
		return err
	}
	select {
	case <-sub.EndOfStoredEvents:
	case <-ctx.Done():
		return ctx.Err()
	}
	pending := map[string]bool{}
	for i := range spamPerKey {
		ev := nostr.Event{Kind: kindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", sh.serverPK}},
			Content: request(i, "tools/call", callParams("sha256", map[string]any{"text": fmt.Sprintf("spam %d/%d", k, i)}, nil))}
		ev.Sign(sk)
		if err := r.Publish(ctx, ev); err != nil {
			return err
		}
		pending[ev.ID] = true
		sent()
	}
	var quoted, refused, other []string
	for len(pending) > 0 {
		select {
		case ev := <-sub.Events:
			e := ev.Tags.Find("e")
			if ev.PubKey != sh.serverPK || len(e) < 2 || !pending[e[1]] {
				continue
			}
			var m rpcMessage
			json.Unmarshal([]byte(ev.Content), &m)
			key := pk + " " + e[1]
			switch {
			case m.Method == notePaymentRequired:
				quoted = append(quoted, key)
			case m.Method != "":
				continue // another notification
			case m.Error != nil && m.Error.Code == codeLimit:
				refused = append(refused, key)
			default:
				other = append(other, m.String())
			}
			delete(pending, e[1])
		case <-ctx.Done():
			out.add(quoted, refused, other, len(pending))
			return nil
		}
	}
	out.add(quoted, refused, other, 0)
	return nil
}

func TestInvoiceSpamNostr(t *testing.T) {
	t.Parallel()
	sh := startShop(t, shopOpts{nostr: true, limits: spamLimitsYA, lndExtra: spamLNDYA})
	returning := dialNostr(t, sh)
	returning.waitReady()
	nostrBuy(t, sh, returning, "the returning customer, before the flood", "before the flood")

	out := &floodOutcome{requests: spamClients * spamPerKey}
	halfway := make(chan struct{})
	var sentMu sync.Mutex
	sent := 0
	var wg sync.WaitGroup
	errs := make(chan error, spamClients)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard
	defer cancel()
	for k := range spamClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := nostrFlooder(ctx, sh, k, out, func() {
				sentMu.Lock()
				defer sentMu.Unlock()
				if sent++; sent == spamClients*spamPerKey/2 {
					close(halfway)
				}
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	select {
	case <-halfway:
	case <-ctx.Done():
		t.Fatal("the flood did not get half its requests out")
	}
	// Under the flood: the customer who paid before is served first.
	nostrBuy(t, sh, returning, "the returning customer, under the flood", "under the flood")
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("flooding: %v", err)
	}
	out.check(t, sh)
	// The flood stopped: a customer nobody knows buys.
	nostrBuy(t, sh, dialNostr(t, sh), "a fresh customer, after the flood", "after the flood")
	checkInvoiceBounds(t, sh)
}

// httpBuy has c (a session of its own) buy sha256(text) and pay.
func httpBuy(t *testing.T, sh *shop, c *httpClient, who, text string) {
	t.Helper()
	sess, err := c.tryInitialize()
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	st, err := c.postRaw(sess, request(1, "tools/call", callParams("sha256", map[string]any{"text": text}, nil)), nil)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	defer st.close()
	var paid <-chan error
	m, _ := untilResponse(t, st, func(b string) { paid = payAsync(sh.s, b) })
	if paid == nil {
		t.Fatalf("%s was not asked to pay: %s", who, m)
	}
	if err := <-paid; err != nil {
		t.Fatalf("%s's payment: %v", who, err)
	}
	if !strings.Contains(string(m.Result), sha256Hex(text)) {
		t.Fatalf("%s was not served: %s", who, m)
	}
}

func TestInvoiceSpamHTTP(t *testing.T) {
	t.Parallel()
	// capvend counts HTTP clients by address: the flood comes from
	// 127.0.0.2 ... 127.0.0.21, the returning customer from 127.0.0.1,
	// the fresh one from 127.0.0.100.
	const clients = 20
	ips := []string{"127.0.0.100"}
	for k := range clients {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", k+2))
	}
	needLoopback(t, ips...)
	sh := startShop(t, shopOpts{limits: spamLimitsYA, lndExtra: spamLNDYA})
	httpBuy(t, sh, newHTTPClient(t, sh), "the returning customer, before the flood", "before the flood")

	out := &floodOutcome{requests: clients * spamPerKey}
	var streams []*stream
	var mu sync.Mutex
	defer func() {
		for _, st := range streams {
			st.close()
		}
	}()
	halfway := make(chan struct{})
	sent := 0
	deadline := time.Now().Add(3 * time.Minute) // a hang guard for the whole flood
	var wg sync.WaitGroup
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newHTTPClientFrom(t, sh, fmt.Sprintf("127.0.0.%d", k+2))
			sess, err := c.tryInitialize()
			if err != nil {
				out.add(nil, nil, []string{"initialize: " + err.Error()}, 0)
				return
			}
			var quoted, refused, other []string
			missing := 0
			for i := range spamPerKey {
				key := fmt.Sprintf("%s %d", sess, i)
				st, err := c.postRaw(sess, request(i, "tools/call", callParams("sha256", map[string]any{"text": fmt.Sprintf("spam %d/%d", k, i)}, nil)), nil)
				mu.Lock()
				if sent++; sent == clients*spamPerKey/2 {
					close(halfway)
				}
				mu.Unlock()
				if err != nil {
					other = append(other, err.Error())
					continue
				}
				mu.Lock()
				streams = append(streams, st) // held open: the flood waits, unpaid
				mu.Unlock()
			read:
				for {
					m, ok := st.next(time.Until(deadline))
					switch {
					case !ok:
						missing++
					case m.Method == notePaymentRequired:
						quoted = append(quoted, key)
					case m.Method != "":
						continue // another notification
					case m.Error != nil && m.Error.Code == codeLimit:
						refused = append(refused, key)
					default:
						other = append(other, m.String())
					}
					break read
				}
			}
			out.add(quoted, refused, other, missing)
		}()
	}
	select {
	case <-halfway:
	case <-time.After(time.Until(deadline)):
		t.Fatal("the flood did not get half its requests out")
	}
	httpBuy(t, sh, newHTTPClient(t, sh), "the returning customer, under the flood", "under the flood")
	wg.Wait()
	out.check(t, sh)
	httpBuy(t, sh, newHTTPClientFrom(t, sh, "127.0.0.100"), "a fresh customer, after the flood", "after the flood")
	checkInvoiceBounds(t, sh)
}
