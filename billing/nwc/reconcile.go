package nwc

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// Reconciler is an NWC connection as package reconcile sees it: its
// incoming invoices from list_transactions, and canceling a hold invoice.
// It needs list_transactions (and cancel_hold_invoice to repair an orphan
// hold invoice).
type Reconciler struct {
	c    *Client
	name vend.Backend
}

var _ reconcile.NWC = (*Reconciler)(nil)

// NewReconciler returns the reconciler's view of the connection c, whose
// payments are recorded under vend.NWCBackend(name).
func NewReconciler(c *Client, name string) *Reconciler {
	return &Reconciler{c: c, name: vend.NWCBackend(name)}
}

// Backend implements reconcile.NWC.
func (r *Reconciler) Backend() vend.Backend { return r.name }

// listPage is how many transactions one list_transactions asks for.
const listPage = 200

// Invoices implements reconcile.LND. NIP-47 lists by creation time, not by
// an index: the invoices are ordered by (created_at, payment hash) and
// each gets AddIndex created_at×10⁶ + its place among those of the same
// second, stable once that second is past. after is such an index.
func (r *Reconciler) Invoices(ctx context.Context, after uint64, max int) ([]reconcile.Invoice, error) {
	if r.c.Current() == nil {
		if _, err := r.c.Connect(ctx); err != nil {
			return nil, err
		}
	}
	from := int64(after / 1_000_000)
	var txs []Transaction
	for offset := 0; ; offset += listPage {
		var page struct {
			Transactions []Transaction `json:"transactions"`
		}
		err := r.c.Do(ctx, MethodListTransactions, map[string]any{"from": from, "limit": listPage, "offset": offset,
			"unpaid": true, "type": "incoming"}, &page)
		if err != nil {
			return nil, fmt.Errorf("list_transactions: %w", err)
		}
		txs = append(txs, page.Transactions...)
		if len(page.Transactions) < listPage {
			break
		}
	}
	sort.Slice(txs, func(i, j int) bool {
		if txs[i].CreatedAt != txs[j].CreatedAt {
			return txs[i].CreatedAt < txs[j].CreatedAt
		}
		return txs[i].PaymentHash < txs[j].PaymentHash
	})
	out := make([]reconcile.Invoice, 0, len(txs))
	var sec int64 = -1
	n := uint64(0)
	for _, tx := range txs {
		if tx.Type != "" && tx.Type != "incoming" {
			continue
		}
		if tx.CreatedAt != sec {
			sec, n = tx.CreatedAt, 0
		}
		n++
		idx := uint64(tx.CreatedAt)*1_000_000 + n
		if idx <= after || !isHash(strings.ToLower(tx.PaymentHash)) {
			continue
		}
		inv := reconcile.Invoice{Ref: strings.ToLower(tx.PaymentHash), AddIndex: idx, Created: time.Unix(tx.CreatedAt, 0)}
		switch txState(tx) {
		case stateSettled:
			inv.State, inv.AmountPaid = reconcile.InvoiceSettled, vend.Msat(tx.Amount)
		case stateAccepted:
			inv.State = reconcile.InvoiceAccepted
		case stateEnded:
			inv.State = reconcile.InvoiceCanceled
		default:
			inv.State = reconcile.InvoiceOpen
		}
		out = append(out, inv)
		if len(out) == max {
			break
		}
	}
	return out, nil
}

// CancelInvoice implements reconcile.LND: cancel_hold_invoice. A wallet's
// plain invoice cannot be canceled (ErrNotImplemented from most wallets).
func (r *Reconciler) CancelInvoice(ctx context.Context, ref string) error {
	return r.c.Do(ctx, MethodCancelHoldInvoice, map[string]any{"payment_hash": ref}, nil)
}
