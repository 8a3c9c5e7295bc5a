package cashu

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/btcsuite/btcd/btcutil/hdkeychain"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/decred/dcrd/dcrec/secp256k1/v4"
	gcashu "github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/cashu/nuts/nut07"
	"github.com/elnosh/gonuts/cashu/nuts/nut09"
	"github.com/elnosh/gonuts/cashu/nuts/nut13"
	"github.com/elnosh/gonuts/crypto"
	"github.com/elnosh/gonuts/wallet"
	"github.com/elnosh/gonuts/wallet/storage"
)

// A mint or swap request whose answer is lost (the connection broke after
// the mint signed) leaves the mint with signatures for outputs the wallet
// derived from its keyset counter (NUT-13) but never saved: the ecash is
// missing from the wallet, and gonuts, whose counter did not move, derives
// the same outputs again next time, which the mint refuses ("blinded message
// already signed") for every later mint and swap. recoverSigned repairs both
// with NUT-09 restore.

// restoreBatch is how many outputs past the counter are asked for at once;
// one request signs at most a few dozen.
const restoreBatch = 64

// recoverWallet closes the wallet, restores what the mint signed past the
// counters (marking quote, if not "", issued), and loads the wallet again.
// It holds the wallet exclusively throughout.
func (b *Backend) recoverWallet(ctx context.Context, mint, quote string) (uint64, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.closed {
		return 0, ErrClosed
	}
	if b.w != nil {
		b.w.Shutdown()
		b.w = nil
	}
	n, err := b.recoverSigned(ctx, b.cfg.WalletDir, mint, quote)
	w, lerr := openWallet(b.cfg.WalletDir, b.mints)
	if lerr == nil {
		b.w = w
	}
	if err != nil {
		return n, err
	}
	b.log.Warn("recovered ecash the mint signed but the wallet never received (NUT-09)", logMint, mint, logRef, short(quote), "sat", n)
	return n, lerr
}

// recoverSigned does the restore on the closed wallet in dir.
func (b *Backend) recoverSigned(ctx context.Context, dir, mint, quote string) (uint64, error) {
	db, err := storage.InitBolt(dir)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	seed := db.GetSeed()
	if len(seed) == 0 {
		return 0, errors.New("cashu: recover: the wallet has no seed")
	}
	master, err := hdkeychain.NewMaster(seed, &chaincfg.MainNetParams) // as gonuts derives it
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, ks := range db.GetKeysets()[mint] {
		if _, err := hex.DecodeString(ks.Id); err != nil {
			continue
		}
		keys := ks.PublicKeys
		if len(keys) == 0 {
			if keys, err = wallet.GetKeysetKeys(mint, ks.Id); err != nil {
				return total, fmt.Errorf("%w: keys of keyset %s: %v", ErrMintUnavailable, ks.Id, err)
			}
		}
		path, err := nut13.DeriveKeysetPath(master, ks.Id)
		if err != nil {
			return total, err
		}
		for {
			n, used, err := b.restoreBatch(ctx, db, mint, ks.Id, keys, path)
			total += n
			if err != nil {
				return total, err
			}
			if used == 0 {
				break
			}
		}
	}
	if quote != "" {
		if q := db.GetMintQuoteById(quote); q != nil && q.State != nut04.Issued {
			q.State = nut04.Issued
			if err := db.SaveMintQuote(*q); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// restoreBatch asks the mint for signatures of the next restoreBatch
// outputs past the keyset's counter, saves the unspent proofs, and moves the
// counter past the last signed one. used is how far it moved.
func (b *Backend) restoreBatch(ctx context.Context, db *storage.BoltDB, mint, id string, keys map[uint64]*secp256k1.PublicKey, path *hdkeychain.ExtendedKey) (restored uint64, used uint32, err error) {
	start := db.GetKeysetCounter(id)
	outputs := make(gcashu.BlindedMessages, restoreBatch)
	secrets := make([]string, restoreBatch)
	rs := make([]*secp256k1.PrivateKey, restoreBatch)
	index := make(map[string]int, restoreBatch)
	for i := range outputs {
		c := start + uint32(i)
		secret, err := nut13.DeriveSecret(path, c)
		if err != nil {
			return 0, 0, err
		}
		r, err := nut13.DeriveBlindingFactor(path, c)
		if err != nil {
			return 0, 0, err
		}
		B, r, err := crypto.BlindMessage(secret, r)
		if err != nil {
			return 0, 0, err
		}
		B_ := hex.EncodeToString(B.SerializeCompressed())
		outputs[i] = gcashu.BlindedMessage{Id: id, B_: B_}
		secrets[i], rs[i], index[B_] = secret, r, i
	}
	body, _ := json.Marshal(nut09.PostRestoreRequest{Outputs: outputs})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, mint+"/v1/restore", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	var resp nut09.PostRestoreResponse
	if err := b.doJSON(req, &resp); err != nil {
		return 0, 0, err
	}
	if len(resp.Outputs) != len(resp.Signatures) {
		return 0, 0, errors.New("cashu: restore: the mint's answer does not pair outputs and signatures")
	}
	var proofs gcashu.Proofs
	last := -1
	for i, sig := range resp.Signatures {
		j, ok := index[resp.Outputs[i].B_]
		if !ok {
			return 0, 0, errors.New("cashu: restore: the mint answered for an output not asked for")
		}
		K, ok := keys[sig.Amount]
		if !ok {
			return 0, 0, fmt.Errorf("cashu: restore: keyset %s has no key for amount %d", id, sig.Amount)
		}
		cb, err := hex.DecodeString(sig.C_)
		if err != nil {
			return 0, 0, err
		}
		C_, err := secp256k1.ParsePubKey(cb)
		if err != nil {
			return 0, 0, err
		}
		C := crypto.UnblindSignature(C_, rs[j], K)
		proofs = append(proofs, gcashu.Proof{Amount: sig.Amount, Id: id, Secret: secrets[j], C: hex.EncodeToString(C.SerializeCompressed())})
		last = max(last, j)
	}
	if last < 0 {
		return 0, 0, nil
	}
	// Keep only what is unspent: outputs of a swap whose answer was
	// lost may have been spent since only if the wallet had them, which
	// it did not; the check is cheap insurance.
	states, err := b.proofStates(ctx, mint, proofs)
	if err != nil {
		return 0, 0, err
	}
	var unspent gcashu.Proofs
	for i, p := range proofs {
		if states[i] == nut07.Unspent {
			unspent = append(unspent, p)
		}
	}
	if err := db.SaveProofs(unspent); err != nil {
		return 0, 0, err
	}
	used = uint32(last + 1)
	if err := db.IncrementKeysetCounter(id, used); err != nil {
		return unspent.Amount(), 0, err
	}
	return unspent.Amount(), used, nil
}

// alreadySigned reports whether err is the mint refusing outputs it signed
// before: the sign that the wallet's counter is behind. Mint requests keep
// gonuts' typed error; swaps (Receive) flatten it to text, so the mint's
// fixed detail string is the only thing left to match there.
func alreadySigned(err error) bool {
	var ce gcashu.Error
	if errors.As(err, &ce) {
		return ce.Code == gcashu.BlindedMessageAlreadySignedErrCode
	}
	return err != nil && strings.Contains(err.Error(), gcashu.BlindedMessageAlreadySigned.Detail)
}
