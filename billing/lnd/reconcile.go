package lnd

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"google.golang.org/grpc"

	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

// InvoiceLister is the part of lnrpc.LightningClient the reconciler's Node
// calls (invoices:read).
type InvoiceLister interface {
	ListInvoices(ctx context.Context, in *lnrpc.ListInvoiceRequest, opts ...grpc.CallOption) (*lnrpc.ListInvoiceResponse, error)
}

// InvoiceCanceler is the part of invoicesrpc.InvoicesClient the
// reconciler's Node calls (invoices:write).
type InvoiceCanceler interface {
	CancelInvoice(ctx context.Context, in *invoicesrpc.CancelInvoiceMsg, opts ...grpc.CallOption) (*invoicesrpc.CancelInvoiceResp, error)
}

// Node is an LND node as the reconciler sees it: its invoices in add-index
// order, and canceling one. It needs invoices:read and invoices:write,
// like the Backend.
type Node struct {
	ln  InvoiceLister
	inv InvoiceCanceler
}

var _ reconcile.LND = (*Node)(nil)

// NewNode returns the reconciler's view of the node behind ln and inv.
func NewNode(ln InvoiceLister, inv InvoiceCanceler) *Node { return &Node{ln: ln, inv: inv} }

// Invoices implements reconcile.LND.
func (n *Node) Invoices(ctx context.Context, after uint64, max int) ([]reconcile.Invoice, error) {
	resp, err := n.ln.ListInvoices(ctx, &lnrpc.ListInvoiceRequest{IndexOffset: after, NumMaxInvoices: uint64(max)})
	if err != nil {
		return nil, fmt.Errorf("list invoices: %w", rpcError(err))
	}
	out := make([]reconcile.Invoice, 0, len(resp.Invoices))
	for _, inv := range resp.Invoices {
		var st reconcile.InvoiceState
		switch inv.State {
		case lnrpc.Invoice_OPEN:
			st = reconcile.InvoiceOpen
		case lnrpc.Invoice_ACCEPTED:
			st = reconcile.InvoiceAccepted
		case lnrpc.Invoice_SETTLED:
			st = reconcile.InvoiceSettled
		case lnrpc.Invoice_CANCELED:
			st = reconcile.InvoiceCanceled
		default:
			return nil, fmt.Errorf("list invoices: invoice %x in unknown state %v", inv.RHash, inv.State)
		}
		out = append(out, reconcile.Invoice{Ref: hex.EncodeToString(inv.RHash), State: st,
			AmountPaid: vend.Msat(inv.AmtPaidMsat), AddIndex: inv.AddIndex, SettleIndex: inv.SettleIndex, Preimage: settledPreimage(inv),
			Created: time.Unix(inv.CreationDate, 0)})
	}
	return out, nil
}

// CancelInvoice implements reconcile.LND.
func (n *Node) CancelInvoice(ctx context.Context, ref string) error {
	hash, err := hex.DecodeString(ref)
	if err != nil {
		return fmt.Errorf("cancel invoice %s: bad hash", ref)
	}
	if _, err := n.inv.CancelInvoice(ctx, &invoicesrpc.CancelInvoiceMsg{PaymentHash: hash}); err != nil {
		return fmt.Errorf("cancel invoice %s: %w", ref, rpcError(err))
	}
	return nil
}

// settledPreimage is a settled invoice's preimage (the reconciler tells
// capvend's own by its mark); nil for any other.
func settledPreimage(inv *lnrpc.Invoice) []byte {
	if inv.State != lnrpc.Invoice_SETTLED {
		return nil
	}
	return inv.RPreimage
}
