package capvendtest

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"

	"github.com/capvend/capvend/billing/lnd"
	"github.com/capvend/capvend/internal/skip"
	"github.com/capvend/capvend/testnet"
)

// CustomerBalance is the customer's balance as this test binary's payments
// moved it (Stack.Balance): other packages pay from the shared stack's
// customer at the same time.
func CustomerBalance(t testing.TB, s *testnet.Stack) int64 {
	t.Helper()
	b, err := s.Balance(context.Background(), testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// CustomerPayments returns the customer node's payments made since
// start, by payment hash (other test binaries pay from it too).
func CustomerPayments(t testing.TB, s *testnet.Stack, start time.Time) map[string]*lnrpc.Payment {
	t.Helper()
	conn, err := s.Conn(testnet.Customer)
	if err != nil {
		t.Fatal(err)
	}
	ln := lnrpc.NewLightningClient(conn)
	out := map[string]*lnrpc.Payment{}
	var offset uint64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := ln.ListPayments(ctx, &lnrpc.ListPaymentsRequest{IncludeIncomplete: true, IndexOffset: offset, MaxPayments: 500,
			CreationDateStart: uint64(start.Unix())})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.Payments {
			out[p.PaymentHash] = p
		}
		if len(r.Payments) == 0 || r.LastIndexOffset == offset {
			return out
		}
		offset = r.LastIndexOffset
	}
}

// CustomerPayment returns the customer node's payment of hash, made in
// the last hour (a zero Payment if there is none).
func CustomerPayment(t testing.TB, s *testnet.Stack, hash string) *lnrpc.Payment {
	t.Helper()
	if p := CustomerPayments(t, s, time.Now().Add(-time.Hour))[hash]; p != nil {
		return p
	}
	return &lnrpc.Payment{}
}

// WaitCustomerGot waits until the customer's balance is before+msat.
func WaitCustomerGot(t testing.TB, s *testnet.Stack, before, msat int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		after := CustomerBalance(t, s)
		if after-before == msat {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the customer got %d msat, want %d", after-before, msat)
		}
	}
}

// NWCWallet starts an NWC wallet service in front of the stack's vendor
// node on relay, skipping (failing in CI) without node or its packages.
func NWCWallet(t testing.TB, s *testnet.Stack, relay string) *testnet.NWCInfo {
	t.Helper()
	dir, err := testnet.NWCServiceDir()
	if errors.Is(err, testnet.ErrNWCNotInstalled) {
		skip.Missing(t, "the NWC wallet service (node and testnet/nwc's npm packages)", testnet.NWCInstall)
	}
	if err != nil {
		t.Fatal(err)
	}
	vendor, _ := s.Node(testnet.Vendor)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := testnet.StartNWC(ctx, testnet.NWCOptions{Node: vendor, Relay: relay, Dir: t.TempDir(), ServiceDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(w.Log)
			t.Logf("the wallet service's log:\n%s", b)
		}
	})
	return w
}

// StandInMint answers a mint's keysets (NUT-02, one keyset with an
// input fee of feePPK) and info, so that items can be priced (a price
// needs a payment backend) without the regtest stack.
func StandInMint(t testing.TB, feePPK int) string {
	mint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/keysets":
			fmt.Fprintf(w, `{"keysets":[{"id":"00ad268c4d1f5826","unit":"sat","active":true,"input_fee_ppk":%d}]}`, feePPK)
		case "/v1/info":
			io.WriteString(w, `{"name":"stand-in"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(mint.Close)
	return mint.URL
}

// CheckInvoicesAtLND checks that every LND invoice of the ledger db is
// settled at the stack's vendor LND if and only if the ledger booked it,
// for the amount it booked.
func CheckInvoicesAtLND(t testing.TB, s *testnet.Stack, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	vendor, _ := s.Node(testnet.Vendor)
	conn, err := lnd.Dial(vendor.RPCHost, vendor.TLSCert, vendor.AdminMacaroon)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ln := lnrpc.NewLightningClient(conn)
	prows, err := db.QueryContext(ctx, "SELECT ref, state, coalesce(settled_msat, 0) FROM payments WHERE backend = 'lnd'")
	if err != nil {
		t.Fatal(err)
	}
	defer prows.Close()
	checked := 0
	for prows.Next() {
		var ref, state string
		var msat int64
		if err := prows.Scan(&ref, &state, &msat); err != nil {
			t.Fatal(err)
		}
		hash, _ := hex.DecodeString(ref)
		inv, err := ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: hash})
		if err != nil {
			t.Fatalf("invoice %s: %v", ref, err)
		}
		settled := inv.State == lnrpc.Invoice_SETTLED
		if settled != (state == "settled") || (settled && inv.AmtPaidMsat != msat) {
			t.Errorf("invoice %s: LND %s, %d msat paid; ledger %s, %d msat", ref, inv.State, inv.AmtPaidMsat, state, msat)
		}
		checked++
	}
	t.Logf("%d LND invoices compared with the ledger", checked)
}
