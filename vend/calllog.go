package vend

import "log/slog"

// LogCallEnds returns an Observer that passes everything on to next (nil:
// to nothing) and writes the log line of every priced call the ledger ends
// unpaid, expired or canceled: "vend: priced call", with its call id,
// item (its server and upstream name: the ledger does not know the name
// clients see), price, outcome and the ledger's reason, the line a paid call gets
// when it ends (see pending.finish). However such a call ends (its
// payment request expired or was canceled at the backend, the client left
// before the request was issued, the request was withdrawn to make room,
// a token was refused, a recovery or a reconciliation ended it), the
// ledger records the move once, so the call gets exactly one line. Give
// it to the ledger as its Observer (ledger.Options.Observer). The line is
// written on the ledger's writer goroutine, after the commit: log's
// handler must be quick (a write to standard error is).
func LogCallEnds(log *slog.Logger, next Observer) Observer {
	if next == nil {
		next = NopObserver{}
	}
	return callEndLog{Observer: next, log: log}
}

// callEndLog is LogCallEnds's Observer.
type callEndLog struct {
	Observer
	log *slog.Logger
}

// LedgerChanged implements Observer.
func (o callEndLog) LedgerChanged(changes []Change) {
	for i := range changes {
		c := &changes[i]
		if c.What == ChangeCall && (c.CallTo == CallExpired || c.CallTo == CallCanceled) {
			o.log.Info("vend: priced call", "call", int64(c.Call), "kind", string(c.Kind.Or()), "server", c.Server,
				"upstream_tool", c.Tool, "price_msat", int64(c.Price), "outcome", string(c.CallTo), "reason", c.Reason)
		}
	}
	o.Observer.LedgerChanged(changes)
}
