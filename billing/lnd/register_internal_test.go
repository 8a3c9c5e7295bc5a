package lnd

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/invoicesrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// lateNode is an LND node in memory whose SubscribeInvoices stream, like
// LND's, is registered only after the call returned, and from settle
// index 0 replays nothing: it delivers what the test sends on it, and
// nothing of what happened before.
type lateNode struct {
	Invoices // unused methods panic
	stream   chan *lnrpc.Invoice

	mu       sync.Mutex
	invoices map[string]*lnrpc.Invoice
	adds     uint64
	settles  uint64
	// subscribed: the settle index of each SubscribeInvoices call
	subscribed []uint64
}

func newLateNode() *lateNode {
	return &lateNode{stream: make(chan *lnrpc.Invoice), invoices: map[string]*lnrpc.Invoice{}}
}

var errNoInvoice = status.Error(codes.NotFound, "unable to locate invoice")

func (n *lateNode) AddInvoice(_ context.Context, in *lnrpc.Invoice, _ ...grpc.CallOption) (*lnrpc.AddInvoiceResponse, error) {
	inv := n.add(in.ValueMsat)
	return &lnrpc.AddInvoiceResponse{RHash: inv.RHash, PaymentRequest: "lnbcrt1fake" + hex.EncodeToString(inv.RHash), AddIndex: inv.AddIndex}, nil
}

// add adds an open invoice and returns a copy of it.
func (n *lateNode) add(msat int64) *lnrpc.Invoice {
	hash := make([]byte, 32)
	rand.Read(hash)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.adds++
	inv := &lnrpc.Invoice{RHash: hash, ValueMsat: msat, State: lnrpc.Invoice_OPEN, AddIndex: n.adds}
	n.invoices[hex.EncodeToString(hash)] = inv
	return proto.Clone(inv).(*lnrpc.Invoice)
}

// settle pays invoice ref in full; cancel cancels it.
func (n *lateNode) settle(ref string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	inv := n.invoices[ref]
	n.settles++
	inv.State, inv.SettleIndex, inv.AmtPaidMsat = lnrpc.Invoice_SETTLED, n.settles, inv.ValueMsat
}

// skipIndex uses up a settle index with no settled invoice (an AMP
// payment's: its invoice stays open on the stream and in LND's replay).
func (n *lateNode) skipIndex() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.settles++
}

func (n *lateNode) cancel(ref string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.invoices[ref].State = lnrpc.Invoice_CANCELED
}

func (n *lateNode) LookupInvoice(_ context.Context, in *lnrpc.PaymentHash, _ ...grpc.CallOption) (*lnrpc.Invoice, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	inv, ok := n.invoices[hex.EncodeToString(in.RHash)]
	if !ok {
		return nil, errNoInvoice
	}
	return proto.Clone(inv).(*lnrpc.Invoice), nil
}

// SubscribeInvoices returns a stream of what the test sends, after (as
// LND does from a settle index above 0) the invoices settled after in's
// settle index, in settle order.
func (n *lateNode) SubscribeInvoices(ctx context.Context, in *lnrpc.InvoiceSubscription, _ ...grpc.CallOption) (lnrpc.Lightning_SubscribeInvoicesClient, error) {
	st := &lateStream{ctx: ctx, ch: n.stream}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.subscribed = append(n.subscribed, in.SettleIndex)
	if in.SettleIndex > 0 {
		for _, inv := range n.invoices {
			if inv.State == lnrpc.Invoice_SETTLED && inv.SettleIndex > in.SettleIndex {
				st.backlog = append(st.backlog, proto.Clone(inv).(*lnrpc.Invoice))
			}
		}
		slices.SortFunc(st.backlog, func(a, b *lnrpc.Invoice) int { return cmp.Compare(a.SettleIndex, b.SettleIndex) })
	}
	return st, nil
}

// subscriptions returns the settle index of every SubscribeInvoices so far.
func (n *lateNode) subscriptions() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.subscribed)
}

// settled returns a copy of invoice ref (settled by settle).
func (n *lateNode) invoice(ref string) *lnrpc.Invoice {
	n.mu.Lock()
	defer n.mu.Unlock()
	return proto.Clone(n.invoices[ref]).(*lnrpc.Invoice)
}

func (n *lateNode) DeleteCanceledInvoice(context.Context, *lnrpc.DelCanceledInvoiceReq, ...grpc.CallOption) (*lnrpc.DelCanceledInvoiceResp, error) {
	return nil, errNoInvoice
}

func (n *lateNode) CancelInvoice(context.Context, *invoicesrpc.CancelInvoiceMsg, ...grpc.CallOption) (*invoicesrpc.CancelInvoiceResp, error) {
	return nil, errNoInvoice // only New's probe calls it here
}

type lateStream struct {
	lnrpc.Lightning_SubscribeInvoicesClient // unused methods panic
	ctx                                     context.Context
	ch                                      <-chan *lnrpc.Invoice
	backlog                                 []*lnrpc.Invoice // sent first
}

func (s *lateStream) Recv() (*lnrpc.Invoice, error) {
	if len(s.backlog) > 0 {
		inv := s.backlog[0]
		s.backlog = s.backlog[1:]
		return inv, nil
	}
	select {
	case inv := <-s.ch:
		return inv, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

// TestSettlementBeforeTheStreamIsRegisteredIsBooked: a plain invoice paid
// after the backend subscribed and reconciled, but before LND registered
// the stream (so not on it: from settle index 0 LND replays nothing), is
// booked settled without a reconcile run or its expiry: once the stream's
// first message proves LND registered it, or by the sweep before that. An
// invoice canceled at LND in the same window stays open in the ledger:
// that difference is the reconciler's to report.
func TestSettlementBeforeTheStreamIsRegisteredIsBooked(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sweep     time.Duration
		registers bool // the stream sends a first message after the window
	}{
		{"first message", time.Hour, true},
		{"sweep before any message", 10 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			// The canceled one is recorded first, so it is looked up
			// before the paid one: by the paid one's report, any
			// booking of the cancel has happened.
			n, l, ps, settled := runLate(t, Config{Sweep: tc.sweep})
			canceled, paid := ps[0], ps[1]
			// Subscribed and reconciled (both open then); LND has not
			// registered the stream yet.
			n.settle(paid.Ref)
			n.cancel(canceled.Ref)
			if tc.registers {
				n.stream <- n.add(1000) // LND's first message: an unrelated addition
			}
			select {
			case ref := <-settled:
				if ref != paid.Ref {
					t.Fatalf("settled %s, want %s", ref, paid.Ref)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a settlement made before LND registered the stream was not booked in 10 s")
			}
			if p, err := l.Payment(ctx, paid.Ref); err != nil || p.State != vend.PaymentSettled {
				t.Fatalf("paid invoice: %s %v", p.State, err)
			}
			if p, err := l.Payment(ctx, canceled.Ref); err != nil || p.State != vend.PaymentOpen {
				t.Fatalf("invoice canceled at LND is %s (%v) in the ledger, want open: the reconciler reports it", p.State, err)
			}
		})
	}
}

// runLate runs a backend with cfg on a lateNode and a fresh ledger, with
// two plain invoices of 1 sat requested (in order), until the test ends.
// It returns once the backend is connected (subscribed and reconciled);
// settled receives the ref of each payment the backend reports settled.
func runLate(t *testing.T, cfg Config) (*lateNode, *ledger.Ledger, []vend.Payment, <-chan string) {
	t.Helper()
	ctx := context.Background()
	n := newLateNode()
	l, err := ledger.Open(ctx, filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	b, err := New(ctx, n, n, l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ps []vend.Payment
	for i := range 2 {
		c, _, err := l.RecordCall(ctx, vend.NewCall{Transport: "test", Client: "c", RequestID: fmt.Sprint(i),
			Server: "s", Name: "t", ArgsHash: strings.Repeat("0", 63) + fmt.Sprint(i), Price: 1000, Idempotent: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := b.Request(ctx, vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	settled := make(chan string, 4)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Run(rctx, func(e vend.PaymentEvent) {
			if e.Payment.State == vend.PaymentSettled {
				settled <- e.Payment.Ref
			}
		})
	}()
	t.Cleanup(func() { stop(); <-done }) // before the ledger's Close: cleanups run last first
	for deadline := time.Now().Add(10 * time.Second); !b.Connected(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not connected in 10 s")
		}
	}
	return n, l, ps, settled
}
