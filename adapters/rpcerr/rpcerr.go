// Package rpcerr is the one JSON-RPC form of vend's errors that every front
// (MCP HTTP and stdio, Nostr) sends: the codes, the fixed messages, and the
// data of explicit gating and of refunds (data.refund: the Cashu token that
// pays a failed call back, or that its refund is owed). Messages never
// carry internal details.
package rpcerr

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/capvend/capvend/vend"
)

// JSON-RPC error codes: the standard ones capvend uses, and its own in the
// server range.
const (
	CodeInvalidRequest  = -32600
	CodeMethodNotFound  = -32601
	CodeInvalidParams   = -32602
	CodeInternal        = -32603
	CodePaymentRequired = -32042
	CodePaymentPending  = -32043
	CodePaymentExpired  = -32050
	CodePaymentFailed   = -32051
	CodeNoPaymentMethod = -32052
	CodeLimit           = -32053
	CodeUpstream        = -32054
	CodeWorkRequired    = -32055
	CodeCreditExhausted = -32056
	CodeResultExpired   = -32057
	// CodeUndelivered: the answer could not be delivered (the Nostr
	// front: no relay took it); a replay of the request gets a kept one.
	CodeUndelivered = -32058
)

// Instructions sent with -32042 and -32043.
const (
	InstructionsRequired = "Pay one of payment_options, then repeat the same call from the same session (or Nostr key); without a session, pass the capvend_payment token of this answer; with Cashu put the token in _meta[\"capvend/cashu\"] (over Nostr, encrypted)."
	InstructionsPending  = "Payment not received yet; repeat the same call after retry_after seconds."
)

// Error is a JSON-RPC error object.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// FromVend maps an error of vend.Vendor.CallItem (for tool) to the error the
// client gets. Errors vend does not define become -32603 "Internal error".
func FromVend(err error, tool string) Error {
	if re, ok := errors.AsType[*vend.RefundError](err); ok {
		return withRefund(FromVend(re.Err, tool), re.Refund)
	}
	var ip *vend.InvalidParamsError
	var pr *vend.PaymentRequiredError
	var pp *vend.PaymentPendingError
	var wr *vend.WorkRequiredError
	var ce *vend.CreditExhaustedError
	switch {
	case errors.As(err, &ce):
		return Error{CodeCreditExhausted, fmt.Sprintf("Credit exhausted: your balance is %d msat, the call costs %d msat; top up with %s",
			int64(ce.Balance), int64(ce.Price), vend.TopUpTool), map[string]any{
			"account": ce.Account, "balance_msat": int64(ce.Balance), "price_msat": int64(ce.Price),
			"top_up": map[string]any{"tool": vend.TopUpTool, "arguments": map[string]int64{"sats": ce.TopUpSats()},
				"instructions": "call " + vend.TopUpTool + " with your credit token, pay its invoice (or a Cashu token), then repeat this call with a new request id"}}}
	case errors.As(err, &pr):
		opts := pr.Options
		if opts == nil {
			opts = []vend.PaymentOption{}
		}
		data := map[string]any{"instructions": InstructionsRequired, "payment_options": opts}
		if pr.Token != "" { // only where secrets may go (vend issues none on a public channel)
			data[vend.PaymentArg] = pr.Token
		}
		return Error{CodePaymentRequired, "Payment Required", data}
	case errors.As(err, &pp):
		return Error{CodePaymentPending, "Payment Pending", map[string]any{
			"instructions": InstructionsPending, "retry_after": pp.RetryAfter}}
	case errors.As(err, &ip):
		return Error{Code: CodeInvalidParams, Message: "Invalid params: " + ip.Reason}
	case errors.As(err, &wr):
		return Error{CodeWorkRequired, "Proof of work required", map[string]any{
			"difficulty": wr.Required, "work": wr.Work,
			"instructions": "Mine the request event to the difficulty (NIP-13: leading zero bits of its id, committed in a nonce tag), or pay with a Cashu token."}}
	case errors.Is(err, vend.ErrPublicSecret):
		// The message names the secret by its kind, never its value.
		return Error{Code: CodeInvalidRequest, Message: "Encryption required: " + err.Error()}
	case errors.Is(err, vend.ErrL402Invalid), errors.Is(err, vend.ErrMPPInvalid), errors.Is(err, vend.ErrX402Invalid):
		// vend's reasons name no secret: they say which check failed.
		return Error{Code: CodeInvalidRequest, Message: "Invalid Request: " + err.Error()}
	case errors.Is(err, vend.ErrTokenMismatch):
		return Error{Code: CodeInvalidRequest, Message: "Invalid Request: payment token is for another call"}
	case errors.Is(err, vend.ErrTokenUsed):
		return Error{Code: CodeInvalidRequest, Message: "Invalid Request: payment token already used"}
	case errors.Is(err, vend.ErrTokenUnknown):
		return Error{Code: CodeInvalidParams, Message: "Invalid params: unknown payment token"}
	case errors.Is(err, vend.ErrTokenCanceled):
		// The reason is capvend's own (a client's cancel, a restore).
		return Error{Code: CodeInvalidRequest, Message: "Invalid Request: " + err.Error()}
	case errors.Is(err, vend.ErrTokenExpired):
		return Error{Code: CodePaymentExpired, Message: "Payment expired: the payment token's invoice expired unpaid; call again without " +
			vend.PaymentArg + " for a new invoice"}
	case errors.Is(err, vend.ErrRequestReused):
		return Error{Code: CodeInvalidRequest, Message: "Invalid Request: request id reused with different parameters"}
	case errors.Is(err, vend.ErrUnknownTool):
		return Error{Code: CodeInvalidParams, Message: "Unknown tool: " + tool}
	case errors.Is(err, vend.ErrPaymentExpired):
		return Error{Code: CodePaymentExpired, Message: "Payment expired"}
	case errors.Is(err, vend.ErrPaymentFailed):
		return Error{Code: CodePaymentFailed, Message: "Payment failed" + paymentFailure(err)}
	case errors.Is(err, vend.ErrNoPaymentMethod):
		return Error{Code: CodeNoPaymentMethod, Message: "No payment method in common"}
	case errors.Is(err, vend.ErrLimit):
		return Error{Code: CodeLimit, Message: "Limit reached"}
	case errors.Is(err, vend.ErrUpstream):
		return Error{Code: CodeUpstream, Message: "Upstream server failed"}
	case errors.Is(err, vend.ErrResultExpired):
		return Error{Code: CodeResultExpired, Message: "Result expired: this request ran before, and its stored answer was deleted after the server's retention period; it does not run again"}
	default:
		return Error{Code: CodeInternal, Message: "Internal error"}
	}
}

// paymentFailure says, in words safe for the client, why a Cashu token
// was refused: "" when the reason is not one the client can act on.
func paymentFailure(err error) string {
	switch {
	case errors.Is(err, vend.ErrProofSpent):
		return ": the Cashu token was already spent"
	case errors.Is(err, vend.ErrUnderpaid):
		return ": the Cashu token does not cover the price and the mint's fees"
	case errors.Is(err, vend.ErrForeignMint):
		return ": the Cashu token is from a mint this server does not accept"
	case errors.Is(err, vend.ErrWrongUnit):
		return ": the Cashu token is not in sats"
	case errors.Is(err, vend.ErrBadToken):
		return ": the Cashu token is malformed, not in sats, or locked"
	case errors.Is(err, vend.ErrMintUnavailable):
		return ": the Cashu mint could not be reached; retry later with the same token"
	}
	return ""
}

// LogLevel is how loudly a front logs a call answered with the error of
// code: explicit gating's -32042/-32043 are the normal flow (debug), an
// internal error is a fault (error), the rest are the client's or the
// payment's doing (info).
func LogLevel(code int) slog.Level {
	switch code {
	case CodePaymentRequired, CodePaymentPending:
		return slog.LevelDebug
	case CodeInternal:
		return slog.LevelError
	}
	return slog.LevelInfo
}
