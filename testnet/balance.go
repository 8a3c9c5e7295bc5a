package testnet

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/routerrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// moves are the payments and invoices one Stack value made on one node,
// by payment hash, with the amount each moved once it is final.
type moves struct {
	base    int64 // ChannelBalance when Balance first looked
	hasBase bool
	paid    map[string]*move // payments sent (Pay, PayFrom)
	got     map[string]*move // invoices created (InvoiceOn)
	order   []string         // hashes, for a stable iteration
}

type move struct {
	msat  int64
	final bool
}

type ownLedger struct {
	mu    sync.Mutex
	nodes map[string]*moves
}

func (o *ownLedger) node(name string) *moves {
	if o.nodes == nil {
		o.nodes = map[string]*moves{}
	}
	m := o.nodes[name]
	if m == nil {
		m = &moves{paid: map[string]*move{}, got: map[string]*move{}}
		o.nodes[name] = m
	}
	return m
}

func (o *ownLedger) record(name string, hash []byte, sent bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.node(name)
	h := hex.EncodeToString(hash)
	set := m.got
	if sent {
		set = m.paid
	}
	if _, ok := set[h]; !ok {
		set[h] = &move{}
		m.order = append(m.order, h)
	}
}

// Balance is node name's channel balance, in msat, as this Stack value
// alone moved it: the node's ChannelBalance when Balance was first called
// for it, minus amount and fee of each payment this Stack made from the
// node (Pay, PayFrom) that succeeded or is in flight, plus what each
// invoice it created on the node (InvoiceOn) received. Every figure is
// read from lnd, by payment hash.
//
// On a stack nobody else uses, Balance and ChannelBalance move alike. On a
// stack shared with other test binaries (Shared), their payments move
// ChannelBalance and not Balance: a test measures what it paid with the
// difference of two Balance calls.
func (s *Stack) Balance(ctx context.Context, name string) (int64, error) {
	s.own.mu.Lock()
	m := s.own.node(name)
	needBase := !m.hasBase
	type pending struct {
		hash string
		sent bool
	}
	var ask []pending
	for _, h := range m.order {
		if mv, ok := m.paid[h]; ok && !mv.final {
			ask = append(ask, pending{h, true})
		}
		if mv, ok := m.got[h]; ok && !mv.final {
			ask = append(ask, pending{h, false})
		}
	}
	s.own.mu.Unlock()

	if needBase {
		b, err := s.ChannelBalance(ctx, name)
		if err != nil {
			return 0, err
		}
		s.own.mu.Lock()
		if !m.hasBase {
			m.base, m.hasBase = b, true
		}
		s.own.mu.Unlock()
	}
	c, err := s.Conn(name)
	if err != nil {
		return 0, err
	}
	for _, p := range ask {
		var mv move
		var err error
		if p.sent {
			mv, err = paymentMove(ctx, c, p.hash)
		} else {
			mv, err = invoiceMove(ctx, lnrpc.NewLightningClient(c), p.hash)
		}
		if err != nil {
			return 0, fmt.Errorf("testnet: balance of %s: %w", name, err)
		}
		s.own.mu.Lock()
		if p.sent {
			*m.paid[p.hash] = mv
		} else {
			*m.got[p.hash] = mv
		}
		s.own.mu.Unlock()
	}

	s.own.mu.Lock()
	defer s.own.mu.Unlock()
	b := m.base
	for _, mv := range m.paid {
		b -= mv.msat
	}
	for _, mv := range m.got {
		b += mv.msat
	}
	return b, nil
}

// paymentMove is what payment hash took from the node's channels: amount
// plus fee while in flight or once succeeded, nothing once failed.
func paymentMove(ctx context.Context, c grpc.ClientConnInterface, hash string) (move, error) {
	h, err := hex.DecodeString(hash)
	if err != nil {
		return move{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the first update is the payment's current state
	stream, err := routerrpc.NewRouterClient(c).TrackPaymentV2(ctx, &routerrpc.TrackPaymentRequest{PaymentHash: h})
	if err != nil {
		return move{}, err
	}
	p, err := stream.Recv()
	if status.Code(err) == codes.NotFound {
		// Not sent (yet): lnd refused it before any HTLC, or Pay has
		// not reached SendPaymentV2.
		return move{}, nil
	}
	if err != nil {
		return move{}, fmt.Errorf("track payment %s: %w", hash, err)
	}
	switch p.Status {
	case lnrpc.Payment_SUCCEEDED:
		return move{msat: p.ValueMsat + p.FeeMsat, final: true}, nil
	case lnrpc.Payment_FAILED:
		return move{final: true}, nil
	case lnrpc.Payment_IN_FLIGHT:
		return move{msat: p.ValueMsat + p.FeeMsat}, nil
	default: // INITIATED: no HTLC sent yet
		return move{}, nil
	}
}

// invoiceMove is what invoice hash brought into the node's channels: the
// amount paid once settled (an accepted hold invoice's HTLC is not in the
// balance yet).
func invoiceMove(ctx context.Context, ln lnrpc.LightningClient, hash string) (move, error) {
	h, err := hex.DecodeString(hash)
	if err != nil {
		return move{}, err
	}
	inv, err := ln.LookupInvoice(ctx, &lnrpc.PaymentHash{RHash: h})
	if err != nil {
		return move{}, fmt.Errorf("lookup invoice %s: %w", hash, err)
	}
	switch inv.State {
	case lnrpc.Invoice_SETTLED:
		return move{msat: inv.AmtPaidMsat, final: true}, nil
	case lnrpc.Invoice_CANCELED:
		return move{final: true}, nil
	default:
		return move{}, nil
	}
}
