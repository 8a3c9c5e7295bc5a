package testnet

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/wallet"
	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/routerrpc"
)

// Mine mines n blocks and waits until every lnd node has processed them.
// Not idempotent: each call extends the chain.
func (s *Stack) Mine(ctx context.Context, n int) error {
	if n <= 0 {
		return fmt.Errorf("testnet: mine: n must be positive, got %d", n)
	}
	b, err := s.btcd()
	if err != nil {
		return err
	}
	if err := s.generate(ctx, n); err != nil {
		return err
	}
	h, err := b.blockCount(ctx)
	if err != nil {
		return &ComponentError{Component: "btcd", Log: s.Info.Btcd.Log, Err: err}
	}
	return s.waitSynced(ctx, h)
}

// BlockHeight returns btcd's current height.
func (s *Stack) BlockHeight(ctx context.Context) (int64, error) {
	b, err := s.btcd()
	if err != nil {
		return 0, err
	}
	return b.blockCount(ctx)
}

// PayResult is the outcome of Pay.
type PayResult struct {
	PaymentHash string // hex
	Preimage    string // hex; empty unless Status is SUCCEEDED
	FeeMsat     int64
	Status      lnrpc.Payment_PaymentStatus
	// Failure is lnd's failure reason when Status is FAILED.
	Failure lnrpc.PaymentFailureReason
}

// Pay pays bolt11 from the customer node with routerrpc.SendPaymentV2
// (fee limit 1,000 sat, 60 s timeout) and returns when the payment
// succeeded or failed. A failed payment returns the result and an error.
// Paying the same invoice twice is refused by lnd (already paid).
func (s *Stack) Pay(ctx context.Context, bolt11 string) (*PayResult, error) {
	return s.PayFrom(ctx, Customer, bolt11)
}

// PayFrom is Pay from the node called name (e.g. Vendor paying a refund
// invoice of the customer). The payment counts in Balance.
func (s *Stack) PayFrom(ctx context.Context, name, bolt11 string) (*PayResult, error) {
	c, err := s.Conn(name)
	if err != nil {
		return nil, err
	}
	req, err := lnrpc.NewLightningClient(c).DecodePayReq(ctx, &lnrpc.PayReqString{PayReq: bolt11})
	if err != nil {
		return nil, fmt.Errorf("testnet: pay: %w", err)
	}
	hash, err := hex.DecodeString(req.PaymentHash)
	if err != nil {
		return nil, fmt.Errorf("testnet: pay: payment hash: %w", err)
	}
	s.own.record(name, hash, true)
	stream, err := routerrpc.NewRouterClient(c).SendPaymentV2(ctx, &routerrpc.SendPaymentRequest{
		PaymentRequest:    bolt11,
		TimeoutSeconds:    60,
		FeeLimitSat:       1000,
		NoInflightUpdates: true,
	})
	if err != nil {
		return nil, fmt.Errorf("testnet: pay: %w", err)
	}
	for {
		p, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("testnet: pay: %w", err)
		}
		switch p.Status {
		case lnrpc.Payment_SUCCEEDED:
			return &PayResult{PaymentHash: p.PaymentHash, Preimage: p.PaymentPreimage, FeeMsat: p.FeeMsat, Status: p.Status}, nil
		case lnrpc.Payment_FAILED:
			r := &PayResult{PaymentHash: p.PaymentHash, FeeMsat: p.FeeMsat, Status: p.Status, Failure: p.FailureReason}
			return r, fmt.Errorf("testnet: pay: payment failed: %s", p.FailureReason)
		}
	}
}

// Invoice creates an invoice for sats on the vendor node and returns lnd's
// answer (PaymentRequest is the bolt11, RHash the payment hash).
func (s *Stack) Invoice(ctx context.Context, sats int64, memo string) (*lnrpc.AddInvoiceResponse, error) {
	return s.InvoiceOn(ctx, Vendor, sats, memo)
}

// InvoiceOn is Invoice on the node called name (one-hour expiry). What it
// receives counts in Balance.
func (s *Stack) InvoiceOn(ctx context.Context, name string, sats int64, memo string) (*lnrpc.AddInvoiceResponse, error) {
	c, err := s.Conn(name)
	if err != nil {
		return nil, err
	}
	r, err := lnrpc.NewLightningClient(c).AddInvoice(ctx, &lnrpc.Invoice{Value: sats, Memo: memo, Expiry: 3600})
	if err != nil {
		return nil, fmt.Errorf("testnet: invoice: %w", err)
	}
	s.own.record(name, r.RHash, false)
	return r, nil
}

// CashuMint has the customer buy sats of ecash from the stack's mint: it
// asks the mint for a quote (NUT-04), pays the quote's invoice from the
// customer node, mints the proofs and returns them as a cashuB token. The
// token is the only copy of the ecash: the scratch wallet used to mint it
// is deleted.
func (s *Stack) CashuMint(ctx context.Context, sats uint64) (string, error) {
	wdir, err := os.MkdirTemp(s.Info.Dir, "cashu-wallet-")
	if err != nil {
		return "", fmt.Errorf("testnet: cashu-mint: %w", err)
	}
	defer os.RemoveAll(wdir)
	w, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(wdir, "wallet"), CurrentMintURL: s.MintURL})
	if err != nil {
		return "", &ComponentError{Component: "cashu mint", Log: s.Info.Mint.Log, Err: fmt.Errorf("load wallet: %w", err)}
	}
	defer w.Shutdown()
	q, err := w.RequestMint(sats, s.MintURL)
	if err != nil {
		return "", &ComponentError{Component: "cashu mint", Log: s.Info.Mint.Log, Err: fmt.Errorf("mint quote: %w", err)}
	}
	if _, err := s.Pay(ctx, q.Request); err != nil {
		return "", err
	}
	err = poll(ctx, 30*time.Second, 100*time.Millisecond, "mint quote paid", func() (bool, error) {
		st, err := w.MintQuoteState(q.Quote)
		if err != nil {
			return false, nil
		}
		return st.State == nut04.Paid || st.State == nut04.Issued, nil
	})
	if err != nil {
		return "", &ComponentError{Component: "cashu mint", Log: s.Info.Mint.Log, Err: err}
	}
	if _, err := w.MintTokens(q.Quote); err != nil {
		return "", &ComponentError{Component: "cashu mint", Log: s.Info.Mint.Log, Err: fmt.Errorf("mint tokens: %w", err)}
	}
	proofs, err := w.Send(sats, s.MintURL, false)
	if err != nil {
		return "", fmt.Errorf("testnet: cashu-mint: select proofs: %w", err)
	}
	tok, err := cashu.NewTokenV4(proofs, s.MintURL, cashu.Sat, false)
	if err != nil {
		return "", fmt.Errorf("testnet: cashu-mint: token: %w", err)
	}
	str, err := tok.Serialize()
	if err != nil {
		return "", fmt.Errorf("testnet: cashu-mint: token: %w", err)
	}
	return str, nil
}

// ChannelBalance returns the spendable balance, in msat, of node name's
// channels (its local balance).
func (s *Stack) ChannelBalance(ctx context.Context, name string) (int64, error) {
	c, err := s.Conn(name)
	if err != nil {
		return 0, err
	}
	r, err := lnrpc.NewLightningClient(c).ChannelBalance(ctx, &lnrpc.ChannelBalanceRequest{})
	if err != nil {
		return 0, fmt.Errorf("testnet: channel balance of %s: %w", name, err)
	}
	return int64(r.GetLocalBalance().GetMsat()), nil
}
