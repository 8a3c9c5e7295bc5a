package cashu

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/cashu/nuts/nut07"
	"github.com/elnosh/gonuts/wallet"
	"github.com/elnosh/gonuts/wallet/storage"

	"github.com/capvend/capvend/internal/journal"
	"github.com/capvend/capvend/reconcile"
	"github.com/capvend/capvend/vend"
)

var (
	_ reconcile.Wallet = (*Backend)(nil)
	_ reconcile.Wallet = (*WalletFile)(nil)
)

// Holdings implements reconcile.Wallet for a running backend: the loaded
// wallet's ecash per configured mint, without asking the mint (gonuts
// keeps the proofs of a loaded wallet to itself; WalletFile asks the mint
// about each proof while capvend is stopped).
func (b *Backend) Holdings(ctx context.Context) ([]reconcile.Holding, error) {
	var out []reconcile.Holding
	err := b.withWalletShared(func(w *wallet.Wallet) error {
		byMint := w.GetBalanceByMints()
		for _, m := range b.mints {
			var sats uint64
			for mint, s := range byMint {
				if n, err := NormalizeMintURL(mint); err == nil && n == m {
					sats += s
				}
			}
			out = append(out, reconcile.Holding{Mint: m, Account: journal.CashuAccount(m), Unspent: vend.Msat(sats * vend.MsatPerSat)})
		}
		return nil
	})
	return out, err
}

// QuoteState implements reconcile.Wallet.
func (b *Backend) QuoteState(ctx context.Context, mint, ref string) (string, error) {
	return quoteStateWith(ctx, b.quoteState, mint, ref)
}

// quoteStateWith maps the mint's answer for a quote to a reconcile.Quote*
// state: a mint that answers 4xx does not know the quote.
func quoteStateWith(ctx context.Context, get func(ctx context.Context, mint, id string) (nut04.State, error), mint, ref string) (string, error) {
	st, err := get(ctx, mint, ref)
	var me *mintError
	switch {
	case errors.As(err, &me) && me.status >= 400 && me.status < 500:
		return reconcile.QuoteUnknown, nil
	case err != nil:
		return "", fmt.Errorf("mint quote %s at %s: %w", short(ref), mint, err)
	}
	switch st {
	case nut04.Unpaid:
		return reconcile.QuoteUnpaid, nil
	case nut04.Paid:
		return reconcile.QuotePaid, nil
	case nut04.Issued:
		return reconcile.QuoteIssued, nil
	}
	return "", fmt.Errorf("mint quote %s at %s: unknown state %s", short(ref), mint, st)
}

// WalletFile is the wallet in a directory while no capvend holds it
// (capvend reconcile with serve stopped): every proof it holds is checked
// at its mint (NUT-07), so ecash spent elsewhere (a copied wallet) shows.
type WalletFile struct {
	dir   string
	mints []string
	b     *Backend // for its mint HTTP calls only; its wallet is never loaded
}

// OpenWalletFile returns the wallet in dir for the configured mints. It
// fails with ErrWalletBusy while a running capvend holds it.
func OpenWalletFile(dir string, mints []string) (*WalletFile, error) {
	if err := checkWalletFree(dir); err != nil {
		return nil, err
	}
	ms := make([]string, 0, len(mints))
	for _, m := range mints {
		n, err := NormalizeMintURL(m)
		if err != nil {
			return nil, err
		}
		ms = append(ms, n)
	}
	return &WalletFile{dir: dir, mints: ms, b: &Backend{http: &http.Client{Timeout: 30 * time.Second}}}, nil
}

// QuotesOnly returns a WalletFile that compares mint quotes only: its
// Holdings are empty (the wallet is held by a running capvend, whose own
// reconciliation compares it).
func QuotesOnly(mints []string) (*WalletFile, error) {
	for _, m := range mints {
		if _, err := NormalizeMintURL(m); err != nil {
			return nil, err
		}
	}
	return &WalletFile{b: &Backend{http: &http.Client{Timeout: 30 * time.Second}}}, nil
}

// Holdings implements reconcile.Wallet: per configured mint, the proofs
// the wallet holds that the mint says are unspent, and those it says are
// spent or pending.
func (f *WalletFile) Holdings(ctx context.Context) ([]reconcile.Holding, error) {
	if f.dir == "" {
		return nil, nil // QuotesOnly
	}
	out := make([]reconcile.Holding, 0, len(f.mints))
	byMint := map[string]*reconcile.Holding{}
	for _, m := range f.mints {
		out = append(out, reconcile.Holding{Mint: m, Account: journal.CashuAccount(m), Checked: true})
		byMint[m] = &out[len(out)-1]
	}
	if _, err := os.Stat(walletFile(f.dir)); errors.Is(err, os.ErrNotExist) {
		return out, nil // no wallet yet: it holds nothing
	}
	db, err := storage.InitBolt(f.dir)
	if err != nil {
		return nil, fmt.Errorf("cashu: open wallet: %w", err)
	}
	type proof struct {
		y   string
		amt uint64
	}
	proofs := map[string][]proof{}
	for mint, kss := range db.GetKeysets() {
		n, err := NormalizeMintURL(mint)
		if err != nil || byMint[n] == nil {
			continue // a mint no longer configured: its account is not compared
		}
		for _, ks := range kss {
			for _, p := range db.GetProofsByKeysetId(ks.Id) {
				y, err := proofY(p.Secret)
				if err != nil {
					db.Close()
					return nil, err
				}
				proofs[n] = append(proofs[n], proof{y, p.Amount})
			}
		}
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	for mint, ps := range proofs {
		ys := make([]string, len(ps))
		for i, p := range ps {
			ys[i] = p.y
		}
		states, err := f.b.statesByY(ctx, mint, ys)
		if err != nil {
			return nil, fmt.Errorf("cashu: proof states at %s: %w", mint, err)
		}
		h := byMint[mint]
		for i, p := range ps {
			if states[i] == nut07.Unspent {
				h.Unspent += vend.Msat(p.amt * vend.MsatPerSat)
			} else {
				h.Spent += vend.Msat(p.amt * vend.MsatPerSat)
			}
		}
	}
	return out, nil
}

// QuoteState implements reconcile.Wallet.
func (f *WalletFile) QuoteState(ctx context.Context, mint, ref string) (string, error) {
	return quoteStateWith(ctx, f.b.quoteState, mint, ref)
}
