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
	"strconv"
	"strings"
	"time"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut02"
	"github.com/elnosh/gonuts/cashu/nuts/nut07"
	"github.com/elnosh/gonuts/crypto"

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
//  2. refuses a token any of whose proofs was received before with
//     ErrTokenReplayed, without contacting the mint, unless they are only
//     recorded swapping by an earlier attempt whose swap's outcome is not
//     known (the mint was unreachable): then the mint is asked first (see
//     resolveSwap): unspent, they are released and the token pays this
//     call; spent by that attempt, its refund is owed and the token is
//     refused (ErrTokenReplayed); still no answer, ErrMintUnavailable;
//  3. checks the amount covers the price (rounded up to whole sats) plus the
//     mint's input fees (NUT-02 input_fee_ppk): ErrTokenUnderpaid;
//  4. asks the mint whether the proofs are spent (NUT-07): ErrTokenSpent, or
//     ErrMintUnavailable, with nothing recorded;
//  5. records the payment (KindToken) for the call and its proofs in state
//     swapping, in one transaction (a proof claimed meanwhile:
//     ErrTokenReplayed);
//  6. swaps the proofs at the mint (NUT-03) and splits off what was paid
//     beyond the price and the input fees as a new token
//     (TokenReceipt.Change);
//  7. records the settlement: the asset gets what was kept, fees are an
//     expense, the proofs are swapped.
//
// A failed swap is never a silent loss or gain (see swapFailed): the mint
// is asked for the proofs' state. Unspent: the swap did not happen, the
// proofs are released, and the error is ErrMintRejected (the mint refused
// them) or ErrMintUnavailable (it failed: the client may send the same
// token again). Spent although the mint did not answer "already spent":
// the swap happened and its answer was lost; the ecash is restored from
// the mint (NUT-09) and the payment settles as usual. Spent by someone
// else: ErrTokenSpent. No answer: the payment ends canceled with its
// proofs still swapping, ErrMintUnavailable; the outcome is settled later
// (Run, or the same token coming again).
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
	claims := make([]vend.Proof, len(tok.Proofs))
	hashes := make([]string, len(tok.Proofs))
	for i, pr := range tok.Proofs {
		y, err := proofY(pr.Secret)
		if err != nil {
			return vend.TokenReceipt{}, fmt.Errorf("%w: proof %d: %v", ErrMalformedToken, i, err)
		}
		hashes[i] = secretHash(pr.Secret)
		claims[i] = vend.Proof{SecretHash: hashes[i], Y: y, AmountSat: int64(pr.Amount), KeysetID: pr.Id, MintURL: mint}
	}
	n, err := b.tl.ProofsReceived(ctx, hashes)
	if err != nil {
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
	}
	if n > 0 {
		// Received before. Only a swap whose outcome is unknown can
		// free them: settle that first.
		if err := b.resolveEarlier(ctx, hashes); err != nil {
			return vend.TokenReceipt{}, err
		}
		if n, err := b.tl.ProofsReceived(ctx, hashes); err != nil {
			return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
		} else if n > 0 {
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
		return vend.TokenReceipt{}, fmt.Errorf("%w: proof state: %v", ErrMintUnavailable, err)
	} else if spent {
		return vend.TokenReceipt{}, ErrTokenSpent
	}
	if err := b.loadWallet(); err != nil {
		return vend.TokenReceipt{}, err
	}
	ref := tok.Ref()
	if _, err := b.ledger.Payment(ctx, ref); err == nil {
		// The same proofs paid an earlier call whose swap did not
		// happen (they were released): this payment needs its own ref.
		ref += "." + strconv.FormatInt(int64(id), 10)
	} else if !errors.Is(err, vend.ErrNotFound) {
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
	}
	amount, _ := vend.FromSats(int64(priceSats))
	p, err := b.tl.ClaimToken(ctx, id, vend.NewPayment{
		Backend:   vend.BackendCashu,
		Kind:      vend.KindToken,
		Ref:       ref,
		MintURL:   mint,
		Amount:    amount,
		ExpiresAt: b.now().Add(5 * time.Minute),
	}, claims)
	if errors.Is(err, vend.ErrProofSpent) || errors.Is(err, vend.ErrDuplicatePayment) {
		return vend.TokenReceipt{}, ErrTokenReplayed
	}
	if err != nil {
		return vend.TokenReceipt{}, fmt.Errorf("cashu: accept token: %w", err)
	}
	return b.swapToken(ctx, p, tok, priceSats, fee)
}

// proofY is a proof's Y = hash_to_curve(secret), hex: its public id at the
// mint (NUT-00), what NUT-07 state checks ask by.
func proofY(secret string) (string, error) {
	y, err := crypto.HashToCurve([]byte(secret))
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(y.SerializeCompressed()), nil
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
	ids := make([]string, len(proofs))
	for i, p := range proofs {
		ids[i] = p.Id
	}
	return b.inputFeeIDs(ctx, mint, ids)
}

// inputFeeIDs is inputFee for proofs of the keysets ids (one per proof).
func (b *Backend) inputFeeIDs(ctx context.Context, mint string, ids []string) (uint64, error) {
	b.feeMu.Lock()
	known := b.fees[mint]
	b.feeMu.Unlock()
	for refreshed := false; ; refreshed = true {
		var ppk uint64
		missing := ""
		for _, id := range ids {
			v, ok := known[id]
			if !ok {
				missing = id
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
	for i, p := range proofs {
		y, err := proofY(p.Secret)
		if err != nil {
			return nil, err
		}
		ys[i] = y
	}
	return b.statesByY(ctx, mint, ys)
}

// statesByY asks the mint for the state of the proofs whose Ys (hex) are
// given (NUT-07), in order. A mint that cannot be reached gives an error
// matching ErrMintUnavailable; one that answers with an error, a mintError.
func (b *Backend) statesByY(ctx context.Context, mint string, ys []string) ([]nut07.State, error) {
	at := make(map[string]int, len(ys))
	for i, y := range ys {
		at[y] = i
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
	states := make([]nut07.State, len(ys))
	seen := 0
	for _, s := range resp.States {
		if i, ok := at[s.Y]; ok {
			states[i] = s.State
			seen++
		}
	}
	if seen != len(ys) {
		return nil, fmt.Errorf("mint answered %d of %d proof states", seen, len(ys))
	}
	return states, nil
}
