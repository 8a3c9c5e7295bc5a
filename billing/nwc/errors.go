package nwc

import (
	"errors"
	"fmt"
)

// Errors of the connection.
var (
	// ErrUnreachable: no session with the wallet's relay (it is down, or
	// the connection broke before the answer came). vend falls back to
	// another backend (see Backend.Ready).
	ErrUnreachable = errors.New("nwc: the wallet's relay is unreachable")
	// ErrTimeout: the wallet did not answer in time. The request may
	// still have been carried out.
	ErrTimeout = errors.New("nwc: the wallet did not answer in time")
	// ErrNoInfo: the wallet's info event (kind 13194) is not on the
	// relay: the URI names the wrong relay or wallet.
	ErrNoInfo = errors.New("nwc: the wallet's info event (kind 13194) was not found")
	// ErrMethodNotGranted: the connection may not call a method the
	// backend needs (get_info does not list it).
	ErrMethodNotGranted = errors.New("nwc: the connection was not granted a method")
	// ErrSettled: the payment is settled and cannot be canceled.
	ErrSettled = errors.New("nwc: payment already settled")
)

// The error codes of NIP-47, each matched by a *WalletError of that code.
var (
	ErrRateLimited           = errors.New("RATE_LIMITED")
	ErrNotImplemented        = errors.New("NOT_IMPLEMENTED")
	ErrInsufficientBalance   = errors.New("INSUFFICIENT_BALANCE")
	ErrQuotaExceeded         = errors.New("QUOTA_EXCEEDED")
	ErrRestricted            = errors.New("RESTRICTED")
	ErrUnauthorized          = errors.New("UNAUTHORIZED")
	ErrInternal              = errors.New("INTERNAL")
	ErrUnsupportedEncryption = errors.New("UNSUPPORTED_ENCRYPTION")
	ErrPaymentFailed         = errors.New("PAYMENT_FAILED")
	ErrNotFound              = errors.New("NOT_FOUND")
	ErrOther                 = errors.New("OTHER")
)

var codes = map[string]error{}

func init() {
	for _, e := range []error{ErrRateLimited, ErrNotImplemented, ErrInsufficientBalance, ErrQuotaExceeded,
		ErrRestricted, ErrUnauthorized, ErrInternal, ErrUnsupportedEncryption, ErrPaymentFailed, ErrNotFound, ErrOther} {
		codes[e.Error()] = e
	}
}

// WalletError is an error answer of the wallet. errors.Is matches it
// against the sentinel of its code (ErrNotFound, ErrRestricted, ...); an
// unknown code matches ErrOther.
type WalletError struct {
	Method  string
	Code    string
	Message string // the wallet's words, shown to the operator
}

func (e *WalletError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = describe[e.Code]
	}
	return fmt.Sprintf("nwc: %s: wallet error %s: %s", e.Method, e.Code, msg)
}

// Unwrap returns the sentinel of e's code.
func (e *WalletError) Unwrap() error {
	if s, ok := codes[e.Code]; ok {
		return s
	}
	return ErrOther
}

// describe says what each code means, for wallets that send no message.
var describe = map[string]string{
	"RATE_LIMITED":           "the wallet is rate limiting this connection",
	"NOT_IMPLEMENTED":        "the wallet does not implement this method",
	"INSUFFICIENT_BALANCE":   "the wallet's balance is too low",
	"QUOTA_EXCEEDED":         "the connection's budget is spent",
	"RESTRICTED":             "the connection was not granted this method",
	"UNAUTHORIZED":           "the wallet does not know this connection (revoked?)",
	"INTERNAL":               "the wallet failed internally",
	"UNSUPPORTED_ENCRYPTION": "the wallet does not support this encryption",
	"PAYMENT_FAILED":         "the payment failed",
	"NOT_FOUND":              "no such invoice",
}
