package cashu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut02"
	"github.com/elnosh/gonuts/cashu/nuts/nut07"
	"github.com/elnosh/gonuts/crypto"
	"github.com/elnosh/gonuts/wallet"

	"github.com/capvend/capvend/vend"
)

// Limits on an untrusted token, far above any real payment.
const (
	maxTokenLen    = 64 << 10
	maxProofs      = 256
	maxSecretLen   = 512
	maxProofAmount = 1 << 40 // sats
)

// Token is a decoded, structurally checked Cashu token: one mint, one unit,
// bearer proofs with unique secrets.
type Token struct {
	Mint   string // as written in the token
	Unit   string // "sat" for a V3 token without a unit
	Proofs cashu.Proofs
	Amount uint64 // sum of the proofs, sats (checked against overflow)
}

// ParseToken decodes a cashuA (V3, JSON) or cashuB (V4, CBOR) token, with an
// optional "cashu:" URI prefix. It never contacts a mint. Errors match
// ErrMalformedToken, or ErrLockedToken for proofs with NUT-10 spending
// conditions. It does not panic on any input.
func ParseToken(s string) (tok *Token, err error) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "cashu:")
	if len(s) > maxTokenLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrMalformedToken, maxTokenLen)
	}
	if len(s) <= 6 {
		return nil, fmt.Errorf("%w: too short", ErrMalformedToken)
	}
	// gonuts' decoders index and dereference without checks on some
	// inputs; a panic there is a malformed token, not a crash.
	defer func() {
		if r := recover(); r != nil {
			tok, err = nil, fmt.Errorf("%w: undecodable", ErrMalformedToken)
		}
	}()
	tok = &Token{}
	switch s[:6] {
	case "cashuA":
		t, err := cashu.DecodeTokenV3(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedToken, err)
		}
		if len(t.Token) == 0 {
			return nil, fmt.Errorf("%w: no proofs", ErrMalformedToken)
		}
		tok.Mint, tok.Unit = t.Token[0].Mint, t.Unit
		if tok.Unit == "" {
			tok.Unit = cashu.Sat.String() // V3 predates units: sat
		}
		for _, tp := range t.Token {
			if tp.Mint != tok.Mint {
				return nil, fmt.Errorf("%w: proofs of several mints", ErrMalformedToken)
			}
			tok.Proofs = append(tok.Proofs, tp.Proofs...)
		}
	case "cashuB":
		t, err := cashu.DecodeTokenV4(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedToken, err)
		}
		tok.Mint, tok.Unit = t.MintURL, t.Unit
		for _, tp := range t.TokenProofs {
			if len(tp.Id) == 0 {
				return nil, fmt.Errorf("%w: empty keyset id", ErrMalformedToken)
			}
		}
		tok.Proofs = t.Proofs()
	default:
		return nil, fmt.Errorf("%w: not a cashuA or cashuB token", ErrMalformedToken)
	}
	if tok.Mint == "" {
		return nil, fmt.Errorf("%w: no mint URL", ErrMalformedToken)
	}
	if len(tok.Proofs) == 0 || len(tok.Proofs) > maxProofs {
		return nil, fmt.Errorf("%w: %d proofs (want 1 to %d)", ErrMalformedToken, len(tok.Proofs), maxProofs)
	}
	seen := make(map[string]bool, len(tok.Proofs))
	locked := false
	for i, p := range tok.Proofs {
		if p.Amount == 0 || p.Amount > maxProofAmount || bits.OnesCount64(p.Amount) != 1 {
			return nil, fmt.Errorf("%w: proof %d: amount %d is not a power of two", ErrMalformedToken, i, p.Amount)
		}
		if p.Secret == "" || len(p.Secret) > maxSecretLen {
			return nil, fmt.Errorf("%w: proof %d: secret length %d", ErrMalformedToken, i, len(p.Secret))
		}
		if seen[p.Secret] {
			return nil, fmt.Errorf("%w: duplicate proofs", ErrMalformedToken)
		}
		seen[p.Secret] = true
		if c, err := hex.DecodeString(p.C); err != nil || len(c) != 33 {
			return nil, fmt.Errorf("%w: proof %d: C is not a compressed point", ErrMalformedToken, i)
		}
		if id, err := hex.DecodeString(p.Id); err != nil || len(id) == 0 || len(id) > 64 {
			return nil, fmt.Errorf("%w: proof %d: keyset id is not hex", ErrMalformedToken, i)
		}
		tok.Amount += p.Amount // cannot overflow: ≤ 256 proofs of ≤ 2^40
		if strings.HasPrefix(p.Secret, "[") || p.Witness != "" {
			locked = true
		}
	}
	if locked {
		return nil, ErrLockedToken
	}
	return tok, nil
}

// Ref is the token's stable id: hex SHA-256 over its proofs' secret hashes,
// sorted, so the same proofs in any order or encoding give the same ref.
func (t *Token) Ref() string {
	hs := make([]string, len(t.Proofs))
	for i, p := range t.Proofs {
		hs[i] = secretHash(p.Secret)
	}
	sort.Strings(hs)
	h := sha256.New()
	h.Write([]byte("capvend cashu token\x00"))
	for _, s := range hs {
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func secretHash(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// Serialize encodes the token as cashuB (V4), or cashuA (V3) if its keyset
// ids are not hex.
func (t *Token) Serialize() (string, error) {
	ps := append(cashu.Proofs(nil), t.Proofs...)
	if v4, err := cashu.NewTokenV4(ps, t.Mint, cashu.Sat, false); err == nil {
		if s, err := v4.Serialize(); err == nil {
			return s, nil
		}
	}
	v3, err := cashu.NewTokenV3(ps, t.Mint, cashu.Sat, false)
	if err != nil {
		return "", err
	}
	return v3.Serialize()
}

// AcceptToken implements vend.TokenAcceptor. In order, it:
//
//  1. parses the token offline: ErrMalformedToken, ErrLockedToken,
//     ErrUntrustedMint, ErrWrongUnit;
//  2. refuses a token whose ref is already in the ledger, or any of whose
//     proofs was received before (if the ledger can tell: ProofsReceived),
//     with ErrTokenReplayed, without contacting the mint;
//  3. checks the amount covers the price (rounded up to whole sats) plus the
//     mint's input fees (NUT-02 input_fee_ppk): ErrTokenUnderpaid;
//  4. asks the mint whether the proofs are spent (NUT-07): ErrTokenSpent, or
//     ErrMintUnavailable, with nothing recorded;
//  5. records the payment (KindToken) for the call and claims the proofs'
//     secret hashes: a proof received before ends the payment canceled and
//     returns ErrTokenReplayed;
//  6. swaps the proofs at the mint (NUT-03): spent proofs give ErrTokenSpent,
//     other refusals ErrMintRejected, no answer ErrMintUnavailable; each ends
//     the payment canceled (the proofs stay claimed: whether a swap without
//     an answer happened is unknown);
//  7. splits off what was paid beyond the price and the input fees as a new
//     token (TokenReceipt.Change);
//  8. records the settlement: the asset gets what was kept, fees are an
//     expense.
//
// Not idempotent: the same token a second time is ErrTokenReplayed.
func (b *Backend) AcceptToken(ctx context.Context, id vend.CallID, price vend.Msat, token string) (vend.TokenReceipt, error) {
	if !b.cfg.AcceptTokens {
		return vend.TokenReceipt{}, fmt.Errorf("accept token: %w", ErrDisabled)
	}
	if price <= 0 {
		return vend.TokenReceipt{}, errors.New("cashu: accept token: price must be positive")
	}
	tok, err := ParseToken(token)
	if err != nil {
		return vend.TokenReceipt{}, err
	}
	mint, ok := b.trusted(tok.Mint)
	if !ok {
		return vend.TokenReceipt{}, fmt.Errorf("%w: %q", ErrUntrustedMint, tok.Mint)
	}
	if tok.Unit != cashu.Sat.String() {
		return vend.TokenReceipt{}, fmt.Errorf("%w: %q", ErrWrongUnit, tok.Unit)
	}
	tok.Mint = mint
	ref := tok.Ref()
	if _, err := b.ledger.Payment(ctx, ref); err == nil {
		return vend.TokenReceipt{}, ErrTokenReplayed
	} else if !errors.Is(err, vend.ErrNotFound) {
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
	}
	claims := make([]vend.Proof, len(tok.Proofs))
	hashes := make([]string, len(tok.Proofs))
	for i, pr := range tok.Proofs {
		hashes[i] = secretHash(pr.Secret)
		claims[i] = vend.Proof{SecretHash: hashes[i], AmountSat: int64(pr.Amount), KeysetID: pr.Id, MintURL: mint}
	}
	if pl, ok := b.ledger.(proofLookup); ok {
		n, err := pl.ProofsReceived(ctx, hashes)
		if err != nil {
			return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
		}
		if n > 0 {
			return vend.TokenReceipt{}, ErrTokenReplayed
		}
	}
	fee, err := b.inputFee(ctx, mint, tok.Proofs)
	if err != nil {
		return vend.TokenReceipt{}, err
	}
	priceSats := uint64(price.SatsCeil())
	if tok.Amount < priceSats+fee {
		return vend.TokenReceipt{}, fmt.Errorf("%w: token %d sat, price %d sat + input fee %d sat", ErrTokenUnderpaid, tok.Amount, priceSats, fee)
	}
	// Ask the mint before recording anything: a spent token, or a mint
	// that cannot be reached, is refused with nothing recorded (the
	// token stays usable if the mint was only down).
	if spent, err := b.anySpent(ctx, mint, tok.Proofs); err != nil {
		if errors.Is(err, ErrMintUnavailable) {
			return vend.TokenReceipt{}, err
		}
		return vend.TokenReceipt{}, fmt.Errorf("%w: proof state: %v", ErrMintRejected, err)
	} else if spent {
		return vend.TokenReceipt{}, ErrTokenSpent
	}
	if err := b.loadWallet(); err != nil {
		return vend.TokenReceipt{}, err
	}
	amount, _ := vend.FromSats(int64(priceSats))
	p, err := b.ledger.RecordPayment(ctx, id, vend.NewPayment{
		Backend:   vend.BackendCashu,
		Kind:      vend.KindToken,
		Ref:       ref,
		MintURL:   mint,
		Amount:    amount,
		ExpiresAt: b.now().Add(5 * time.Minute),
	})
	if errors.Is(err, vend.ErrDuplicatePayment) {
		return vend.TokenReceipt{}, ErrTokenReplayed
	}
	if err != nil {
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
	}
	fail := func(reason string, err error) (vend.TokenReceipt, error) {
		// Not ctx: the payment must end even if the caller gave up.
		if _, e := b.ledger.EndPayment(context.Background(), ref, vend.PaymentCanceled, reason); e != nil {
			b.log.Error("ending refused token payment", logRef, short(ref), logErr, e)
		}
		b.log.Info("token refused", logRef, short(ref), logCall, int64(id), logMint, mint, "reason", reason)
		return vend.TokenReceipt{}, err
	}
	if err := b.ledger.ClaimProofs(ctx, p.ID, claims); err != nil {
		if errors.Is(err, vend.ErrProofSpent) {
			return fail("token replayed", ErrTokenReplayed)
		}
		return fail("claiming proofs failed", fmt.Errorf("cashu: accept token: %w", err))
	}

	var received, change, changeFee uint64
	var changeToken string
	swap := func(w *wallet.Wallet) error {
		v3, err := cashu.NewTokenV3(append(cashu.Proofs(nil), tok.Proofs...), mint, cashu.Sat, true)
		if err != nil {
			return err
		}
		if received, err = w.Receive(v3, false); err != nil {
			return err
		}
		if received <= priceSats {
			return nil
		}
		// Change: everything beyond the price that the swap left us.
		change = received - priceSats
		before := w.GetBalanceByMints()[mint]
		cps, err := w.Send(change, mint, false)
		if err != nil {
			b.log.Warn("making change failed; the overpayment is kept", logRef, short(ref), logErr, err)
			change = 0
			return nil
		}
		after := w.GetBalanceByMints()[mint]
		if spent := before - after; before >= after && spent > change {
			changeFee = spent - change
		}
		ct := &Token{Mint: mint, Unit: cashu.Sat.String(), Proofs: cps}
		if changeToken, err = ct.Serialize(); err != nil {
			b.log.Error("serializing change failed; the overpayment is kept", logRef, short(ref), logErr, err)
			change, changeToken = 0, ""
		}
		return nil
	}
	err = b.withWallet(swap)
	if alreadySigned(err) {
		// The wallet's counter is behind the mint: repair and retry.
		if _, rerr := b.recoverWallet(ctx, mint, ""); rerr == nil {
			err = b.withWallet(swap)
		}
	}
	if err != nil {
		return fail("swap refused", b.classifySwapError(ctx, mint, tok.Proofs, err))
	}
	swapFee := tok.Amount - received
	s := vend.Settlement{
		Ref:    ref,
		Amount: vend.Msat((tok.Amount - change) * vend.MsatPerSat),
		Fee:    vend.Msat((swapFee + changeFee) * vend.MsatPerSat),
	}
	sp, err := b.ledger.SettlePayment(context.Background(), s)
	if err != nil {
		// The ecash is in the wallet but the ledger does not say so:
		// `capvend cashu balance` shows the difference.
		b.log.Error("token swapped but its settlement was not recorded", logRef, short(ref), logCall, int64(id), logErr, err)
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: recording settlement: %w", err)
	}
	b.log.Info("token accepted", logRef, short(ref), logCall, int64(id), logMint, mint,
		logAmount, int64(s.Amount), logFee, int64(s.Fee), "change_sat", change)
	return vend.TokenReceipt{Payment: sp, Change: changeToken}, nil
}

// proofLookup is a ledger that can tell, without claiming, whether proofs
// were received before (*ledger.Ledger can): a partly replayed token is then
// refused before the mint is asked anything.
type proofLookup interface {
	ProofsReceived(ctx context.Context, secretHashes []string) (int, error)
}

// trusted returns the configured mint URL matching u.
func (b *Backend) trusted(u string) (string, bool) {
	n, err := NormalizeMintURL(u)
	if err != nil {
		return "", false
	}
	for _, m := range b.mints {
		if m == n {
			return m, true
		}
	}
	return "", false
}

// inputFee is the mint's fee for spending proofs: the sum of their keysets'
// input_fee_ppk, rounded up to whole sats (NUT-02). Keysets are cached per
// mint and fetched again when a proof names an unknown one.
func (b *Backend) inputFee(ctx context.Context, mint string, proofs cashu.Proofs) (uint64, error) {
	b.feeMu.Lock()
	known := b.fees[mint]
	b.feeMu.Unlock()
	for refreshed := false; ; refreshed = true {
		var ppk uint64
		missing := ""
		for _, p := range proofs {
			v, ok := known[p.Id]
			if !ok {
				missing = p.Id
				break
			}
			ppk += uint64(v)
		}
		if missing == "" {
			return (ppk + 999) / 1000, nil
		}
		if refreshed {
			return 0, fmt.Errorf("%w: unknown sat keyset %s", ErrMintRejected, missing)
		}
		var ks nut02.GetKeysetsResponse
		if err := b.getJSON(ctx, mint+"/v1/keysets", &ks); err != nil {
			if errors.Is(err, ErrMintUnavailable) {
				return 0, err
			}
			return 0, fmt.Errorf("%w: keysets of %s: %v", ErrMintUnavailable, mint, err)
		}
		known = map[string]uint{}
		for _, k := range ks.Keysets {
			if k.Unit == cashu.Sat.String() {
				known[k.Id] = k.InputFeePpk
			}
		}
		b.feeMu.Lock()
		b.fees[mint] = known
		b.feeMu.Unlock()
	}
}

// classifySwapError turns a failed swap into a sentinel: it asks the mint
// for the proofs' state (NUT-07) and reports spent proofs as ErrTokenSpent.
func (b *Backend) classifySwapError(ctx context.Context, mint string, proofs cashu.Proofs, swapErr error) error {
	spent, err := b.anySpent(ctx, mint, proofs)
	switch {
	case err == nil && spent:
		return ErrTokenSpent
	case err != nil && errors.Is(err, ErrMintUnavailable):
		return fmt.Errorf("%w: swap: %v", ErrMintUnavailable, swapErr)
	case errors.Is(swapErr, ErrClosed):
		return swapErr
	}
	var ce cashu.Error
	if errors.As(swapErr, &ce) && ce.Code == cashu.ProofAlreadyUsedErrCode {
		return ErrTokenSpent
	}
	return fmt.Errorf("%w: %v", ErrMintRejected, swapErr)
}

// anySpent asks the mint whether any of proofs is spent or pending.
func (b *Backend) anySpent(ctx context.Context, mint string, proofs cashu.Proofs) (bool, error) {
	states, err := b.proofStates(ctx, mint, proofs)
	if err != nil {
		return false, err
	}
	for _, s := range states {
		if s != nut07.Unspent {
			return true, nil
		}
	}
	return false, nil
}

// proofStates asks the mint for the state of each proof (NUT-07), in order.
func (b *Backend) proofStates(ctx context.Context, mint string, proofs cashu.Proofs) ([]nut07.State, error) {
	ys := make([]string, len(proofs))
	at := make(map[string]int, len(proofs))
	for i, p := range proofs {
		y, err := crypto.HashToCurve([]byte(p.Secret))
		if err != nil {
			return nil, err
		}
		ys[i] = hex.EncodeToString(y.SerializeCompressed())
		at[ys[i]] = i
	}
	body, _ := json.Marshal(nut07.PostCheckStateRequest{Ys: ys})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, mint+"/v1/checkstate", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	var resp nut07.PostCheckStateResponse
	if err := b.doJSON(req, &resp); err != nil {
		return nil, err
	}
	states := make([]nut07.State, len(proofs))
	seen := 0
	for _, s := range resp.States {
		if i, ok := at[s.Y]; ok {
			states[i] = s.State
			seen++
		}
	}
	if seen != len(proofs) {
		return nil, fmt.Errorf("mint answered %d of %d proof states", seen, len(proofs))
	}
	return states, nil
}
