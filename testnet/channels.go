package testnet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"golang.org/x/sync/errgroup"
)

// openChannels opens customer→vendor and customer→mint (each pushing
// opts.PushSats to the far side), mines 6 blocks and waits until both ends
// see each channel active and the customer's graph has both policies.
func (s *Stack) openChannels(ctx context.Context, opts Options) error {
	cust, err := s.mustNode(Customer)
	if err != nil {
		return err
	}
	cc, err := s.Conn(Customer)
	if err != nil {
		return err
	}
	lc := lnrpc.NewLightningClient(cc)
	custErr := func(err error) error { return &ComponentError{Component: "lnd customer", Log: cust.Log, Err: err} }

	// Coinbase outputs need 100 confirmations; wait until the wallet sees
	// enough mature funds for both channels.
	need := 2*opts.ChannelSats + 1_000_000
	err = poll(ctx, readyTimeout, 200*time.Millisecond, "customer wallet funds", func() (bool, error) {
		wb, err := lc.WalletBalance(ctx, &lnrpc.WalletBalanceRequest{})
		if err != nil {
			return false, nil
		}
		return wb.ConfirmedBalance >= need, nil
	})
	if err != nil {
		return custErr(err)
	}

	var txids []string
	for _, peer := range []string{Vendor, MintNode} {
		pn, err := s.mustNode(peer)
		if err != nil {
			return err
		}
		s.logf("opening channel customer→%s (%d sat, push %d)", peer, opts.ChannelSats, opts.PushSats)
		_, err = lc.ConnectPeer(ctx, &lnrpc.ConnectPeerRequest{
			Addr:    &lnrpc.LightningAddress{Pubkey: pn.Pubkey, Host: pn.P2PHost},
			Timeout: 30,
		})
		if err != nil {
			return custErr(fmt.Errorf("connect to %s: %w", peer, err))
		}
		pk, err := hex.DecodeString(pn.Pubkey)
		if err != nil {
			return err
		}
		var cp *lnrpc.ChannelPoint
		// The peer may still be finishing its handshake bookkeeping;
		// retry briefly.
		err = poll(ctx, 30*time.Second, 500*time.Millisecond, "open channel to "+peer, func() (bool, error) {
			cp, err = lc.OpenChannelSync(ctx, &lnrpc.OpenChannelRequest{
				NodePubkey:         pk,
				LocalFundingAmount: opts.ChannelSats,
				PushSat:            opts.PushSats,
				SatPerVbyte:        5,
			})
			if err != nil {
				s.logf("open channel to %s: %v (retrying)", peer, err)
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			return custErr(err)
		}
		txid := chanPointTxid(cp)
		txids = append(txids, txid)
		s.Info.Channels = append(s.Info.Channels, ChannelInfo{
			From: Customer, To: peer,
			ChanPoint: fmt.Sprintf("%s:%d", txid, cp.OutputIndex),
			Capacity:  opts.ChannelSats, PushSats: opts.PushSats,
		})
	}

	b, err := s.btcd()
	if err != nil {
		return err
	}
	err = poll(ctx, 30*time.Second, 100*time.Millisecond, "funding transactions in btcd's mempool", func() (bool, error) {
		mp, err := b.mempool(ctx)
		if err != nil {
			return false, nil
		}
		for _, t := range txids {
			if !slices.Contains(mp, t) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return &ComponentError{Component: "btcd", Log: s.Info.Btcd.Log, Err: err}
	}
	if err := s.Mine(ctx, 6); err != nil {
		return err
	}
	s.logf("mined 6 blocks; waiting for channels to become active")

	g, gctx := errgroup.WithContext(ctx)
	for i := range s.Info.Channels {
		ch := &s.Info.Channels[i]
		g.Go(func() error { return s.waitChannel(gctx, ch) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	s.logf("channels active: customer→vendor, customer→mint")
	return nil
}

// waitChannel waits until both ends list ch as active and both ends' graphs
// hold the channel with both directions' policies (so payments route in
// either direction), recording its short channel id.
func (s *Stack) waitChannel(ctx context.Context, ch *ChannelInfo) error {
	for _, name := range []string{ch.From, ch.To} {
		n, err := s.mustNode(name)
		if err != nil {
			return err
		}
		c, err := s.Conn(name)
		if err != nil {
			return err
		}
		lc := lnrpc.NewLightningClient(c)
		err = poll(ctx, channelTimeout, 250*time.Millisecond, "channel "+ch.ChanPoint+" active", func() (bool, error) {
			if !n.Alive() {
				return false, errors.New("exited")
			}
			lr, err := lc.ListChannels(ctx, &lnrpc.ListChannelsRequest{ActiveOnly: true})
			if err != nil {
				return false, nil
			}
			for _, c := range lr.Channels {
				if c.ChannelPoint == ch.ChanPoint {
					ch.ChanID = c.ChanId
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return &ComponentError{Component: "lnd " + name, Log: n.Log, Err: err}
		}
		err = poll(ctx, channelTimeout, 250*time.Millisecond, "channel "+ch.ChanPoint+" in graph", func() (bool, error) {
			ce, err := lc.GetChanInfo(ctx, &lnrpc.ChanInfoRequest{ChanId: ch.ChanID})
			if err != nil {
				return false, nil
			}
			return ce.Node1Policy != nil && ce.Node2Policy != nil, nil
		})
		if err != nil {
			return &ComponentError{Component: "lnd " + name, Log: n.Log, Err: err}
		}
	}
	return nil
}

// chanPointTxid renders the funding txid of cp in the usual (reversed) hex.
func chanPointTxid(cp *lnrpc.ChannelPoint) string {
	if s := cp.GetFundingTxidStr(); s != "" {
		return s
	}
	b := slices.Clone(cp.GetFundingTxidBytes())
	slices.Reverse(b)
	return hex.EncodeToString(b)
}
