package cli

import (
	"context"

	"github.com/capvend/capvend/adapters/admin"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// ledgerDashboard is the ledger as the admin dashboard reads it: the
// ledger's read models, turned into the dashboard's own types (the admin
// package does not know the ledger).
type ledgerDashboard struct{ l *ledger.Ledger }

var _ admin.DashboardSource = ledgerDashboard{}

// Snapshot implements admin.DashboardSource.
func (d ledgerDashboard) Snapshot(ctx context.Context) (*admin.Snapshot, error) {
	b, err := d.l.Dashboard(ctx, admin.ChartDays)
	if err != nil {
		return nil, err
	}
	s := &admin.Snapshot{Now: b.Now, Open: b.Open, Held: b.Held, Owed: b.Owed, Pending: admin.Pending{
		OpenPayments: b.Pending.OpenPayments, OpenAmount: b.Pending.OpenAmount,
		HeldPayments: b.Pending.HeldPayments, HeldAmount: b.Pending.HeldAmount,
		AwaitingCalls: b.Pending.AwaitingCalls, RefundsOwed: b.Pending.RefundsOwedCount, OwedAmount: b.Pending.RefundsOwed,
	}}
	for _, t := range b.Tools {
		s.Tools = append(s.Tools, admin.Revenue{Account: t.Account, Calls: t.Calls, Revenue: t.Revenue})
	}
	for _, r := range b.Days {
		s.Days = append(s.Days, admin.DayRevenue{Day: r.Day, Account: r.Account, Revenue: r.Revenue})
	}
	for _, c := range b.Calls {
		s.Calls = append(s.Calls, admin.CallRow{Call: c.Call, Backend: c.Backend, Duration: c.Duration})
	}
	for _, r := range b.Reconcile {
		run := admin.ReconcileRun{ID: r.ID, Started: r.Started, Finished: r.Finished, Repaired: r.Repaired, Error: r.Error,
			DifferencesCount: max(r.Found, len(r.Differences)), Differences: differences(r.Differences)}
		s.Reconcile = append(s.Reconcile, run)
	}
	return s, nil
}

// CallHistory implements admin.DashboardSource.
func (d ledgerDashboard) CallHistory(ctx context.Context, id vend.CallID) (*admin.CallHistory, error) {
	h, err := d.l.CallHistory(ctx, id)
	if err != nil {
		return nil, err
	}
	out := &admin.CallHistory{Call: h.Call, Payments: h.Payments, Refund: h.Refund, Differences: differences(h.Differences)}
	for _, e := range h.Executions {
		out.Executions = append(out.Executions, admin.Execution{Seq: e.Seq, Server: e.Server, Tool: e.Tool, Started: e.Started, Backfilled: e.Backfilled})
	}
	if r := h.Result; r != nil {
		out.Result = &admin.Result{IsError: r.IsError, Stored: r.Stored, Bytes: r.Bytes}
	}
	for _, e := range h.Entries {
		entry := admin.Entry{ID: e.ID, Time: e.Time, Kind: e.Kind, Description: e.Description, Sealed: e.Sealed}
		for _, p := range e.Postings {
			entry.Postings = append(entry.Postings, admin.Posting{Account: p.Account, Amount: p.Amount})
		}
		out.Entries = append(out.Entries, entry)
	}
	return out, nil
}

func differences(ds []reconcile.Difference) []admin.Difference {
	out := make([]admin.Difference, 0, len(ds))
	for _, d := range ds {
		out = append(out, admin.Difference{ID: d.ID, Run: d.Run, Kind: string(d.Kind), Backend: string(d.Backend), Ref: d.Ref,
			CallID: d.CallID, MintURL: d.MintURL, Ledger: d.Ledger, Remote: d.Remote, Detail: d.Detail, Repair: d.Repair, Found: d.FoundAt})
	}
	return out
}
