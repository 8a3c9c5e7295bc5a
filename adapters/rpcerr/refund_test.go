package rpcerr_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// TestRefundIsTheErrorData: a refunded call's error keeps its code and
// message and carries the refund (the Cashu token, or that it is owed) in
// data.refund.
func TestRefundIsTheErrorData(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		want string
	}{
		{&vend.RefundError{Refund: vend.RefundInfo{ID: 3, Amount: 21, Unit: "sat", Cashu: "cashuBxyz"}, Err: fmt.Errorf("%w: could not run", vend.ErrUpstream)},
			rpcerr.CodeUpstream, `{"refund":{"id":3,"amount":21,"unit":"sat","cashu":"cashuBxyz"}}`},
		{&vend.RefundError{Refund: vend.RefundInfo{ID: 4, Amount: 2, Unit: "sat", Owed: true}, Err: fmt.Errorf("%w: refunded before it ran", vend.ErrPaymentFailed)},
			rpcerr.CodePaymentFailed, `{"refund":{"id":4,"amount":2,"unit":"sat","owed":true}}`},
	} {
		got := rpcerr.FromVend(tc.err, "x")
		data, _ := json.Marshal(got.Data)
		if got.Code != tc.code || string(data) != tc.want {
			t.Errorf("%v: code %d data %s, want %d %s", tc.err, got.Code, data, tc.code, tc.want)
		}
	}
}

// TestMintUnavailableSaysRetryWithTheSameToken: a token the mint could not
// take is not lost: the client is told to send it again.
func TestMintUnavailableSaysRetryWithTheSameToken(t *testing.T) {
	got := rpcerr.FromVend(fmt.Errorf("%w: %w", vend.ErrPaymentFailed, fmt.Errorf("cashu: mint http://10.0.0.1 down: %w", vend.ErrMintUnavailable)), "x")
	if got.Code != rpcerr.CodePaymentFailed || got.Message != "Payment failed: the Cashu mint could not be reached; retry later with the same token" {
		t.Fatalf("%+v", got)
	}
}
