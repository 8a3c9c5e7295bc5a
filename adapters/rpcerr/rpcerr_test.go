package rpcerr_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

func TestFromVend(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{fmt.Errorf("%w: %q", vend.ErrUnknownTool, "x"), rpcerr.CodeInvalidParams, "Unknown tool: x"},
		{&vend.InvalidParamsError{Tool: "x", Reason: "at /text: wrong type"}, rpcerr.CodeInvalidParams, "Invalid params: at /text: wrong type"},
		{&vend.PaymentRequiredError{}, rpcerr.CodePaymentRequired, "Payment Required"},
		{&vend.PaymentPendingError{RetryAfter: 2}, rpcerr.CodePaymentPending, "Payment Pending"},
		{vend.ErrPaymentExpired, rpcerr.CodePaymentExpired, "Payment expired"},
		{fmt.Errorf("%w: token spent at /var/lib/x", vend.ErrPaymentFailed), rpcerr.CodePaymentFailed, "Payment failed"},
		// Why a token was refused is told (in fixed words), details never.
		{fmt.Errorf("%w: %w", vend.ErrPaymentFailed, fmt.Errorf("cashu: spent at mint http://10.0.0.1: %w", vend.ErrProofSpent)),
			rpcerr.CodePaymentFailed, "Payment failed: the Cashu token was already spent"},
		{fmt.Errorf("%w: %w", vend.ErrPaymentFailed, vend.ErrUnderpaid), rpcerr.CodePaymentFailed,
			"Payment failed: the Cashu token does not cover the price and the mint's fees"},
		{fmt.Errorf("%w: %w", vend.ErrPaymentFailed, vend.ErrForeignMint), rpcerr.CodePaymentFailed,
			"Payment failed: the Cashu token is from a mint this server does not accept"},
		{fmt.Errorf("%w: %w", vend.ErrPaymentFailed, vend.ErrBadToken), rpcerr.CodePaymentFailed,
			"Payment failed: the Cashu token is malformed, not in sats, or locked"},
		{vend.ErrNoPaymentMethod, rpcerr.CodeNoPaymentMethod, "No payment method in common"},
		{vend.ErrLimit, rpcerr.CodeLimit, "Limit reached"},
		{vend.ErrUpstream, rpcerr.CodeUpstream, "Upstream server failed"},
		{&vend.WorkRequiredError{Required: 20, Work: 3}, rpcerr.CodeWorkRequired, "Proof of work required"},
		{fmt.Errorf("result of call 3, pruned 2026-12-21T00:00:00Z: %w", vend.ErrResultExpired), rpcerr.CodeResultExpired,
			"Result expired: this request ran before, and its stored answer was deleted after the server's retention period; it does not run again"},
		{fmt.Errorf("record call: %w: request \"7\" is call 3 (tool ex/slow_count)", vend.ErrRequestReused), rpcerr.CodeInvalidRequest,
			"Invalid Request: request id reused with different parameters"},
		{vend.ErrTokenMismatch, rpcerr.CodeInvalidRequest, "Invalid Request: payment token is for another call"},
		{vend.ErrTokenUsed, rpcerr.CodeInvalidRequest, "Invalid Request: payment token already used"},
		{vend.ErrTokenUnknown, rpcerr.CodeInvalidParams, "Invalid params: unknown payment token"},
		{vend.ErrTokenExpired, rpcerr.CodePaymentExpired,
			"Payment expired: the payment token's invoice expired unpaid; call again without capvend_payment for a new invoice"},
		{fmt.Errorf("%w; a payment made for it is owed back, never run", vend.ErrTokenCanceled), rpcerr.CodeInvalidRequest,
			"Invalid Request: payment token's call was canceled; a payment made for it is owed back, never run"},
		{errors.New("sqlite: disk I/O error at /var/lib/capvend.db"), rpcerr.CodeInternal, "Internal error"},
	} {
		got := rpcerr.FromVend(tc.err, "x")
		if got.Code != tc.code || got.Message != tc.msg {
			t.Errorf("%v: %+v, want %d %q", tc.err, got, tc.code, tc.msg)
		}
	}
	data := rpcerr.FromVend(&vend.PaymentRequiredError{}, "x").Data.(map[string]any)
	if opts, ok := data["payment_options"].([]vend.PaymentOption); !ok || opts == nil || data["instructions"] != rpcerr.InstructionsRequired {
		t.Fatalf("-32042 data %+v: payment_options must be a non-nil list", data)
	}
}

func TestLogLevel(t *testing.T) {
	for code, want := range map[int]slog.Level{
		rpcerr.CodePaymentRequired: slog.LevelDebug,
		rpcerr.CodePaymentPending:  slog.LevelDebug,
		rpcerr.CodeInternal:        slog.LevelError,
		rpcerr.CodeInvalidParams:   slog.LevelInfo,
		rpcerr.CodePaymentFailed:   slog.LevelInfo,
	} {
		if got := rpcerr.LogLevel(code); got != want {
			t.Errorf("LogLevel(%d) = %v, want %v", code, got, want)
		}
	}
}
