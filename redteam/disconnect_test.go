package redteam

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
)

// Issue 11, "A client that disconnects at the instant its payment lands
// leaves no call stuck in paid and no hold invoice locked: it runs
// (result stored for replay) or the payment is canceled/refunded; Recover
// never fails the same way on every start."

// TestDisconnectAtPayment opens several paid calls (hold invoices), pays
// them, and drops each call's stream at (or a few milliseconds after) the
// instant the vendor node reports its HTLC locked in: the delays sweep the
// window in which capvend has learned of the payment and is starting the
// call. Afterwards no call may stay paid or executing and no
// invoice ACCEPTED (locked, the customer's money frozen until the HTLC
// times out): each ran, or its invoice was canceled. The same after a
// restart (Recover).
func TestDisconnectAtPayment(t *testing.T) {
	t.Parallel()
	const attempts = 24
	// One client (one address) holds all of them unpaid for a moment.
	sh := startShop(t, shopOpts{limits: "  requests_per_minute: 100000\n  max_unpaid_per_client: 100\n"})
	var wg sync.WaitGroup
	defer func() {
		// The payments end once capvend settled or canceled their
		// invoices; one left locked ends only with its 3-minute guard.
		if !t.Failed() {
			wg.Wait()
		}
	}()
	hashes := make([]string, attempts)
	bolt11s := make([]string, attempts)
	var dropped []<-chan struct{}
	for i := range attempts {
		c := newHTTPClient(t, sh)
		sess := c.initialize()
		st, err := c.postRaw(sess, request(1, "tools/call", callParams("sha256", map[string]any{"text": fmt.Sprintf("disconnect %d", i)}, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		bolt11s[i] = untilNote(t, st, notePaymentRequired).payReq()
		hashes[i] = paymentHash(t, bolt11s[i])
		delay := time.Duration(i) * 2 * time.Millisecond
		dropped = append(dropped, whenAccepted(t, sh.s, hashes[i], func() {
			time.Sleep(delay) // the sweep: not synchronisation
			st.close()
		}))
	}
	// All paid at once: capvend records the payments and starts the
	// calls one ledger transaction after another while the clients leave.
	for _, b := range bolt11s {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-payAsync(sh.s, b) // settled if it ran, failed if canceled
		}()
	}
	for _, d := range dropped {
		<-d
	}

	settled := func() []string {
		var stuck []string
		calls, _ := readLedger(t, sh.db)
		for _, c := range calls {
			if c.state == "paid" || c.state == "executing" {
				stuck = append(stuck, fmt.Sprintf("call %d is %s", c.id, c.state))
			}
		}
		for _, h := range hashes {
			if st := vendorInvoiceState(t, sh.s, h); st == lnrpc.Invoice_ACCEPTED {
				stuck = append(stuck, fmt.Sprintf("invoice %.12s… is ACCEPTED (locked)", h))
			}
		}
		return stuck
	}
	// Bounded: a call that ran or was canceled is done at once; this only
	// covers capvend's own follow-up (cancel, refund).
	deadline := time.Now().Add(time.Minute)
	for stuck := settled(); len(stuck) > 0; stuck = settled() {
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the disconnects: %v", stuck)
		}
		time.Sleep(200 * time.Millisecond)
	}
	sh.restart()
	if stuck := settled(); len(stuck) > 0 {
		t.Fatalf("after a restart: %v", stuck)
	}
}
