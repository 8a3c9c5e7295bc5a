package cashu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/wallet"
	"github.com/elnosh/gonuts/wallet/storage"
	"github.com/tyler-smith/go-bip39"

	"github.com/capvend/capvend/vend"
)

// The wallet's seed. gonuts derives every proof the wallet makes from a
// BIP-39 mnemonic kept in the wallet file (NUT-13), so the mnemonic and
// the trusted mints rebuild the wallet (NUT-09 restore, NUT-07 states):
// ExportSeed writes it out once, Restore rebuilds a lost wallet from it.
//
// A rebuilt wallet finds again every proof of its own that is unspent at
// the mint: its ecash, and also the tokens it handed out that their
// holders have not redeemed yet (change, refund and payout tokens). Those
// are the clients' money: Restore moves them to the wallet's pending
// proofs (never spent by the wallet, as after a normal send), using the
// ledger's record of what was handed out (HandedOutEcash). The ledger is
// not written: its books already say what the wallet holds.

// seedMark is the file in the wallet directory that records when the
// seed was exported (doctor warns while it is missing).
const seedMark = "seed-exported"

// ErrSeedExported: the seed was exported before (ExportSeed writes it
// once; pass again to write it anew).
var ErrSeedExported = errors.New("cashu: the wallet's seed was exported before")

// SeedExported reports when the seed of the wallet in dir was exported,
// zero if never (or if there is no wallet).
func SeedExported(dir string) time.Time {
	b, err := os.ReadFile(filepath.Join(dir, seedMark))
	if err != nil {
		return time.Time{}
	}
	t, _ := time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
	return t
}

// ExportSeed writes the mnemonic of the wallet in dir to the new file to
// (mode 0600; an existing file is never overwritten) and records that it
// was exported. A second export is ErrSeedExported unless again. The
// wallet must exist and be free (ErrWalletBusy while capvend serves).
func ExportSeed(dir, to string, again bool) error {
	if err := checkWalletFree(dir); err != nil {
		return err
	}
	if _, err := os.Stat(walletFile(dir)); err != nil {
		return fmt.Errorf("cashu: no wallet in %s: %w", dir, err)
	}
	if !again && !SeedExported(dir).IsZero() {
		return ErrSeedExported
	}
	db, err := storage.InitBolt(dir)
	if err != nil {
		return fmt.Errorf("cashu: open wallet: %w", err)
	}
	mnemonic := db.GetMnemonic()
	if err := db.Close(); err != nil {
		return err
	}
	if !bip39.IsMnemonicValid(mnemonic) {
		return errors.New("cashu: the wallet holds no valid mnemonic")
	}
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("cashu: seed file: %w", err)
	}
	if _, err := f.WriteString(mnemonic + "\n"); err != nil {
		f.Close()
		os.Remove(to)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, seedMark), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600)
}

// HandedOutBook is what Restore reads of the ledger: the ecash the wallet
// handed out. *ledger.Ledger implements it.
type HandedOutBook interface {
	HandedOutEcash(ctx context.Context) (change map[string]bool, tokens []string, err error)
}

// Restored is what Restore found.
type Restored struct {
	Own     vend.Msat // the wallet's ecash: unspent proofs it holds
	Clients vend.Msat // unspent proofs it handed out, set aside as pending
}

// Restore rebuilds the wallet in dir (which must hold none) from the
// mnemonic at the mints (contacted: NUT-09 restore and NUT-07 states), and
// sets aside as pending the proofs the ledger says were handed out. It
// writes nothing to the ledger. The wallet's seed counts as exported.
func Restore(ctx context.Context, dir, mnemonic string, mints []string, l HandedOutBook) (Restored, error) {
	if _, err := os.Stat(walletFile(dir)); err == nil {
		return Restored{}, fmt.Errorf("cashu: %s already holds a wallet: restore into an empty directory", dir)
	}
	mnemonic = strings.Join(strings.Fields(mnemonic), " ")
	if !bip39.IsMnemonicValid(mnemonic) {
		return Restored{}, errors.New("cashu: not a valid BIP-39 mnemonic")
	}
	change, tokens, err := l.HandedOutEcash(ctx)
	if err != nil {
		return Restored{}, err
	}
	out := map[string]bool{}
	for h := range change {
		out[h] = true
	}
	for _, t := range tokens {
		tok, err := ParseToken(t)
		if err != nil {
			continue // not ours to judge: a token the ledger keeps is one we made
		}
		for _, p := range tok.Proofs {
			out[secretHash(p.Secret)] = true
		}
	}
	norm := make([]string, len(mints))
	for i, m := range mints {
		if norm[i], err = NormalizeMintURL(m); err != nil {
			return Restored{}, err
		}
	}
	mintDeadlines.cover(MintCallTimeout, norm...)
	if _, err := wallet.Restore(dir, mnemonic, norm); err != nil {
		return Restored{}, fmt.Errorf("%w: restore: %v", ErrMintUnavailable, err)
	}
	db, err := storage.InitBolt(dir)
	if err != nil {
		return Restored{}, fmt.Errorf("cashu: open restored wallet: %w", err)
	}
	defer db.Close()
	var r Restored
	var aside cashu.Proofs
	for _, p := range db.GetProofs() {
		if out[secretHash(p.Secret)] {
			aside = append(aside, p)
			r.Clients += vend.Msat(p.Amount * vend.MsatPerSat)
			continue
		}
		r.Own += vend.Msat(p.Amount * vend.MsatPerSat)
	}
	if len(aside) > 0 {
		if err := db.AddPendingProofs(aside); err != nil {
			return r, fmt.Errorf("cashu: setting aside handed-out proofs: %w", err)
		}
		for _, p := range aside {
			if err := db.DeleteProof(p.Secret); err != nil {
				return r, fmt.Errorf("cashu: setting aside handed-out proofs: %w", err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, seedMark), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return r, err
	}
	return r, nil
}

// handedOut is the record of proofs handed out at mint.
func handedOut(mint string, ps cashu.Proofs) []vend.Proof {
	out := make([]vend.Proof, len(ps))
	for i, p := range ps {
		out[i] = vend.Proof{SecretHash: secretHash(p.Secret), AmountSat: int64(p.Amount), MintURL: mint}
	}
	return out
}
