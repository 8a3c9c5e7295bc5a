package admin

import (
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// BenchmarkObservePaidCall is what the metrics do for one paid call: its
// nine ledger changes, five commits and one upstream call (compare with a
// paid call's own cost: vend's BenchmarkMetricsOverhead).
func BenchmarkObservePaidCall(b *testing.B) {
	m := NewMetrics([]string{"demo"}, []Item{{"demo", "echo"}}, Sources{}, nil)
	call := func(from, to vend.CallState) vend.Change {
		return vend.Change{What: vend.ChangeCall, Call: 7, Kind: vend.ItemTool, Server: "demo", Tool: "echo", CallFrom: from, CallTo: to, Since: time.Millisecond}
	}
	pay := func(from, to vend.PaymentState) vend.Change {
		return vend.Change{What: vend.ChangePayment, Call: 7, Backend: vend.BackendLND, Payment: vend.KindInvoice, PayFrom: from, PayTo: to, Amount: 21000}
	}
	writes := [][]vend.Change{
		{call("", vend.CallQuoted)},
		{call(vend.CallQuoted, vend.CallAwaitingPayment), pay("", vend.PaymentOpen)},
		{pay(vend.PaymentOpen, vend.PaymentSettled), call(vend.CallAwaitingPayment, vend.CallPaid)},
		{call(vend.CallPaid, vend.CallExecuting)},
		{call(vend.CallExecuting, vend.CallDelivered)},
	}
	tool := vend.Item{Server: "demo", UpstreamName: "echo"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for _, w := range writes {
				m.LedgerCommit(time.Millisecond, 1)
				m.LedgerChanged(w)
			}
			m.UpstreamCall(tool, 7, time.Millisecond, nil)
		}
	})
}

// BenchmarkObserveFreeCall is what the metrics do for one free call.
func BenchmarkObserveFreeCall(b *testing.B) {
	m := NewMetrics([]string{"demo"}, nil, Sources{}, nil)
	tool := vend.Item{Server: "demo", UpstreamName: "free"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.UpstreamCall(tool, 0, time.Millisecond, nil)
			m.FreeCall(tool, nil)
		}
	})
}
