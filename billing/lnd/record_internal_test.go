package lnd

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/capvend/capvend/vend"
)

// endedLedger is a Ledger whose one payment is already expired: another
// writer (vend expiring its quote) won the race to end it.
type endedLedger struct {
	Ledger // unused methods panic
	state  vend.PaymentState
}

func (l *endedLedger) Payment(context.Context, string) (vend.Payment, error) {
	return vend.Payment{NewPayment: vend.NewPayment{Ref: "ab"}, State: l.state}, nil
}

// TestRecordTakesALostRaceAsUnchanged: LND reports an invoice canceled
// while vend expires the quote itself; the cancel's write then meets an
// expired payment (expired -> canceled is refused). That is not a failure
// to record: nothing is logged as an error. Any other refused change
// still is.
func TestRecordTakesALostRaceAsUnchanged(t *testing.T) {
	for _, tc := range []struct {
		state     vend.PaymentState
		wantError bool
	}{
		{vend.PaymentExpired, false},
		{vend.PaymentOpen, true}, // refused, and not ended by anyone: an error
	} {
		var logs bytes.Buffer
		b := &Backend{led: &endedLedger{state: tc.state}, cfg: Config{Log: slog.New(slog.NewTextHandler(&logs, nil))}}
		b.record(context.Background(), "ab", func() (vend.Payment, error) {
			return vend.Payment{}, &vend.TransitionError{What: "payment 1", From: "expired", To: "canceled"}
		})
		if got := strings.Contains(logs.String(), "level=ERROR"); got != tc.wantError {
			t.Errorf("payment %s: error logged %v, want %v:\n%s", tc.state, got, tc.wantError, logs.String())
		}
	}
}
