package cashu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/elnosh/gonuts/wallet/storage"
	decodepay "github.com/nbd-wtf/ln-decodepay"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/capvend/capvend/internal/journal"
	"github.com/capvend/capvend/vend"
)

// Operator commands (capvend cashu balance|melt) work on the wallet file
// directly. The wallet is a bbolt file that one process at a time may open:
// while capvend serves, it holds it.

// ErrWalletBusy: another process (a running capvend) has the wallet open.
var ErrWalletBusy = errors.New("cashu: the wallet is in use by another process (stop 'capvend serve' first)")

// ErrInsufficientFunds: the wallet holds less ecash at the mint than a melt
// needs (amount + the mint's fee reserve).
var ErrInsufficientFunds = errors.New("cashu: not enough ecash at the mint")

// Journal is the part of the ledger the operator commands use;
// *ledger.Ledger implements it.
type Journal interface {
	Post(ctx context.Context, e journal.Entry) error
	// AccountBalances returns the balance of each account whose name
	// starts with prefix.
	AccountBalances(ctx context.Context, prefix string) (map[string]vend.Msat, error)
}

// walletFile is where gonuts keeps the wallet inside its directory.
func walletFile(dir string) string { return filepath.Join(dir, "wallet.db") }

// checkWalletFree fails with ErrWalletBusy if another process holds the
// wallet file. (gonuts opens it without a timeout: it would wait forever.)
func checkWalletFree(dir string) error {
	f := walletFile(dir)
	if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	db, err := bolt.Open(f, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: true})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return ErrWalletBusy
	}
	if err != nil {
		return fmt.Errorf("cashu: wallet %s: %w", f, err)
	}
	return db.Close()
}

// MintBalance is one mint's ecash as the wallet and the ledger see it.
type MintBalance struct {
	Mint    string    // the mint URL ("" for a ledger account no wallet mint matches)
	Account string    // the ledger account, assets:cashu:<mint>
	Wallet  vend.Msat // unspent proofs in the wallet
	Pending vend.Msat // proofs handed out (change, melts in flight) not yet known spent
	Ledger  vend.Msat // balance of Account
}

// Difference is the wallet's balance less the ledger's: zero when they
// reconcile.
func (m MintBalance) Difference() vend.Msat { return m.Wallet - m.Ledger }

// Balances reads the wallet in dir offline (no mint is contacted) and the
// ledger, and returns per mint what each holds: the configured mints first,
// then any other mint either knows. It fails with ErrWalletBusy while a
// running capvend holds the wallet. A missing wallet counts as empty.
func Balances(ctx context.Context, dir string, mints []string, j Journal) ([]MintBalance, error) {
	if err := checkWalletFree(dir); err != nil {
		return nil, err
	}
	byMint := map[string]*MintBalance{}
	var order []string
	get := func(mint string) *MintBalance {
		if m, ok := byMint[mint]; ok {
			return m
		}
		m := &MintBalance{Mint: mint, Account: journal.CashuAccount(mint)}
		byMint[mint] = m
		order = append(order, mint)
		return m
	}
	for _, m := range mints {
		n, err := NormalizeMintURL(m)
		if err != nil {
			return nil, err
		}
		get(n)
	}
	if _, err := os.Stat(walletFile(dir)); err == nil {
		db, err := storage.InitBolt(dir)
		if err != nil {
			return nil, fmt.Errorf("cashu: open wallet: %w", err)
		}
		keysetMint := map[string]string{}
		for mint, kss := range db.GetKeysets() {
			n, err := NormalizeMintURL(mint)
			if err != nil {
				n = mint
			}
			m := get(n)
			for _, ks := range kss {
				keysetMint[ks.Id] = n
				m.Wallet += vend.Msat(db.GetProofsByKeysetId(ks.Id).Amount() * vend.MsatPerSat)
			}
		}
		for _, p := range db.GetPendingProofs() {
			if n, ok := keysetMint[p.Id]; ok {
				get(n).Pending += vend.Msat(p.Amount * vend.MsatPerSat)
			}
		}
		if err := db.Close(); err != nil {
			return nil, err
		}
	}
	bal, err := j.AccountBalances(ctx, "assets:cashu:")
	if err != nil {
		return nil, err
	}
	byAccount := map[string]*MintBalance{}
	for _, m := range byMint {
		byAccount[m.Account] = m
	}
	var extra []string
	for account, b := range bal {
		if m, ok := byAccount[account]; ok {
			m.Ledger += b
			continue
		}
		extra = append(extra, account)
		byMint["account "+account] = &MintBalance{Account: account, Ledger: b}
	}
	sort.Strings(extra)
	out := make([]MintBalance, 0, len(order)+len(extra))
	for _, m := range order {
		out = append(out, *byMint[m])
	}
	for _, a := range extra {
		out = append(out, *byMint["account "+a])
	}
	return out, nil
}

// meltableInvoice decodes a bolt11 a melt can pay: with an amount in whole
// sats. It returns the invoice trimmed and its amount.
func meltableInvoice(invoice string) (string, vend.Msat, error) {
	invoice = strings.ToLower(strings.TrimPrefix(strings.TrimSpace(invoice), "lightning:"))
	inv, err := decodepay.Decodepay(invoice)
	if err != nil {
		return "", 0, fmt.Errorf("cashu: melt: invalid invoice: %w", err)
	}
	if inv.MSatoshi <= 0 {
		return "", 0, errors.New("cashu: melt: the invoice has no amount")
	}
	if inv.MSatoshi%vend.MsatPerSat != 0 {
		return "", 0, errors.New("cashu: melt: the invoice's amount is not whole sats")
	}
	return invoice, vend.Msat(inv.MSatoshi), nil
}

// MeltResult is a Lightning payment made from the wallet's ecash.
type MeltResult struct {
	Mint     string
	Quote    string    // the NUT-05 melt quote id
	Amount   vend.Msat // the invoice's amount
	Fee      vend.Msat // what the melt cost beyond it: Lightning fee and input fees
	Preimage string    // proof of payment, hex
}

// Melt pays a bolt11 invoice from the ecash the wallet in dir holds at mint
// (NUT-05), the operator's withdrawal. The withdrawal is reserved in the
// ledger with its melt quote before the melt, then booked with one entry
// once the mint reports it paid: Cr assets:cashu:<mint> amount+fee, Dr
// expenses:fees:cashu:<mint> fee, Dr equity:withdrawals amount (the fee
// is the wallet's balance change less the amount), or released if the
// mint did not pay. It contacts the mint. It first resolves the payouts
// this wallet left in flight. It fails with ErrWalletBusy while capvend
// serves, ErrInsufficientFunds if the wallet cannot cover amount + fee
// reserve; an invoice without an amount is refused. If the mint reports
// the payment pending, the withdrawal stays reserved (the error says so;
// the wallet keeps the proofs pending) and is booked or released when the
// wallet is opened again. Not idempotent: the mint refuses to pay an
// invoice twice.
func Melt(ctx context.Context, dir, mint, invoice string, l PayoutBook) (MeltResult, error) {
	mint, err := NormalizeMintURL(mint)
	if err != nil {
		return MeltResult{}, err
	}
	invoice, amount, err := meltableInvoice(invoice)
	if err != nil {
		return MeltResult{}, err
	}
	if err := checkWalletFree(dir); err != nil {
		return MeltResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return MeltResult{}, err
	}
	w, err := openWallet(dir, []string{mint})
	if err != nil {
		return MeltResult{}, err
	}
	defer w.Shutdown()
	p := cliPayer(w, l)
	p.resolve(ctx) // what it cannot resolve stays reserved
	_, res, err := p.payInvoice(ctx, vend.NewPayout{Kind: vend.PayoutWithdrawal, MintURL: mint, Amount: amount}, invoice)
	return res, err
}
