package redteam

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"github.com/lightningnetwork/lnd/zpay32"

	"github.com/btcsuite/btcd/chaincfg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/capvend/capvend/testnet"
)

// paymentHash returns the payment hash (hex) of a regtest bolt11.
func paymentHash(t testing.TB, bolt11 string) string {
	t.Helper()
	inv, err := zpay32.Decode(bolt11, &chaincfg.RegressionNetParams)
	if err != nil || inv.PaymentHash == nil {
		t.Fatalf("decode %s: %v", bolt11, err)
	}
	return hex.EncodeToString(inv.PaymentHash[:])
}

// vendorInvoiceState returns the state of an invoice of the vendor node;
// an invoice capvend deleted (a canceled unpaid one) counts as CANCELED.
func vendorInvoiceState(t testing.TB, s *testnet.Stack, hash string) lnrpc.Invoice_InvoiceState {
	t.Helper()
	conn, err := s.Conn(testnet.Vendor)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rhash, err := hex.DecodeString(hash)
	if err != nil {
		t.Fatalf("payment hash %q: %v", hash, err)
	}
	inv, err := lnrpc.NewLightningClient(conn).LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: rhash})
	if status.Code(err) == codes.NotFound {
		return lnrpc.Invoice_CANCELED
	}
	if err != nil {
		t.Fatalf("lookup invoice %s: %v", hash, err)
	}
	return inv.State
}

// whenAccepted calls fn the moment the vendor node reports the invoice of
// hash ACCEPTED (an HTLC locked in: the instant capvend learns of the
// payment), or settled or canceled. The returned channel is closed after
// fn ran.
func whenAccepted(t testing.TB, s *testnet.Stack, hash string, fn func()) <-chan struct{} {
	t.Helper()
	conn, err := s.Conn(testnet.Vendor)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := hex.DecodeString(hash)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard
	sub, err := invoicesrpc.NewInvoicesClient(conn).SubscribeSingleInvoice(ctx, &invoicesrpc.SubscribeSingleInvoiceRequest{RHash: raw})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		defer fn()
		for {
			inv, err := sub.Recv()
			if err != nil {
				return
			}
			if inv.State != lnrpc.Invoice_OPEN {
				return
			}
		}
	}()
	return done
}
