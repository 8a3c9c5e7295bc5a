package vend

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Prepaid credit: the design (accounts, tokens, the top-up and the draw
// in the ledger's transactions) is in docs/ARCHITECTURE.md, Credit
// accounts; the wire in docs/PAYING.md, Prepaid credit. In this package:
// TopUpTool is sold like any priced tool and the ledger's Deliver credits
// the account; a credit token is an HMAC under CreditLedger.CreditKey;
// CallRequest.Credit or CreditSelf names the account; a priced call's
// price is drawn in the transaction that records and claims it
// (CreditLedger.RecordCreditCall), *CreditExhaustedError when the balance
// does not cover it; every answer to a request naming an account carries
// its CreditInfo in _meta[MetaCredit]; Run expires balances
// (Credit.ExpiresAfter) to income:credit_expired.

// The names of credit on the wire.
const (
	// TopUpTool is the tool clients call to buy credit: arguments
	// {"sats": N}. It is listed with the upstreams' tools when credit is
	// on (Config.Credit.Enabled) and sold like any priced tool.
	TopUpTool = "capvend_topup"
	// CreditServer is the server name top-ups are recorded under (the
	// tool's upstream name is "topup"); no upstream may use it.
	CreditServer = "capvend"
	// MetaCredit is the _meta key of credit: in a request, the credit
	// token to pay with (a string), or true for a Nostr client's own
	// account; in an answer, the account's CreditInfo.
	MetaCredit = "capvend/credit"
	// CreditArg is the tool argument that may carry a credit token (for
	// a client that can set neither _meta nor a header). vend strips it
	// like PaymentArg: it is never priced, hashed or sent upstream.
	CreditArg = "capvend_credit"
	// HeaderCredit is the HTTP header of credit on MCP HTTP: the token in
	// a request, the balance in msat in a response.
	HeaderCredit = "Capvend-Credit"
	// creditTokenPrefix starts every credit token.
	creditTokenPrefix = "cvc_"
	// topUpUpstream is the top-up tool's name under CreditServer.
	topUpUpstream = "topup"
)

// BackendCredit and KindCredit name a call paid from credit in logs and
// in the Payment a credit call carries in memory (never in the ledger's
// payments).
const (
	BackendCredit Backend     = "credit"
	KindCredit    PaymentKind = "credit"
)

// Errors of credit. Nothing runs and nothing is charged.
var (
	// ErrCreditToken: the credit token is malformed or was not issued by
	// this ledger (JSON-RPC -32602).
	ErrCreditToken = errors.New("invalid credit token")
	// ErrCreditOff: the server sells no credit.
	ErrCreditOff = errors.New("this server sells no prepaid credit")
)

// CreditConfig turns prepaid credit on and bounds it.
type CreditConfig struct {
	// Enabled lists TopUpTool and accepts credit tokens; it needs a
	// ledger with the CreditLedger ability.
	Enabled bool
	// MaxTopUp bounds one top-up (default DefaultMaxTopUp).
	MaxTopUp Msat
	// ExpiresAfter, if > 0, expires an account's balance that long after
	// its last top-up: Run books it to income (CreditLedger.ExpireCredit)
	// within ExpirySweep of that moment. 0: credit never expires.
	ExpiresAfter time.Duration
	// ExpirySweep is how often Run looks for expired credit (default 1 min).
	ExpirySweep time.Duration
}

// DefaultMaxTopUp is the largest top-up by default: 1,000,000 sats.
const DefaultMaxTopUp Msat = 1_000_000 * MsatPerSat

// CreditPayout is how (part of) the rest of a credit account was paid
// back to its client.
type CreditPayout struct {
	Method  RefundMethod // a Cashu token, or a bolt11 paid by a melt of the wallet's ecash or an NWC wallet
	MintURL string       // the mint whose ecash paid it
	NWC     Backend      // or the NWC connection whose wallet paid it
	// Paid is what the client got (at most the balance); Fee what paying
	// cost beyond it (an expense).
	Paid Msat
	Fee  Msat
}

// CreditInfo is what a client learns of its credit: the JSON object of
// _meta[MetaCredit] in an answer.
type CreditInfo struct {
	Account     string `json:"account"`
	Balance     int64  `json:"balance"` // whole sats (rounded down)
	BalanceMsat int64  `json:"balance_msat"`
	// Token is the account's credit token, in the answer to a top-up
	// only: present it with later calls.
	Token string `json:"token,omitempty"`
}

// CreditExhaustedError is the answer to a call paid from credit whose
// balance does not cover its price: nothing ran, nothing was charged. The
// client tops up (TopUpTool) and repeats the call with a new request id.
type CreditExhaustedError struct {
	Account string
	Balance Msat
	Price   Msat
}

func (e *CreditExhaustedError) Error() string {
	return fmt.Sprintf("credit exhausted: balance %d msat, the call costs %d msat; top up with %s {\"sats\": N}",
		int64(e.Balance), int64(e.Price), TopUpTool)
}

// TopUpSats is the least top-up, in sats, that covers the call.
func (e *CreditExhaustedError) TopUpSats() int64 { return (e.Price - e.Balance).SatsCeil() }

// CreditToken returns the credit token of account under key: "cvc_",
// the account id, "_", and 128 bits of HMAC-SHA256(key, account id). The
// ledger never stores a token; whoever holds the key (the ledger) can
// make it again, so a client that lost an answer gets it again with a
// replay.
func CreditToken(key []byte, account string) string {
	return creditTokenPrefix + account + "_" + creditMAC(key, account)
}

func creditMAC(key []byte, account string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("capvend credit token\x00" + account))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// accountOfToken checks a credit token against key and returns its
// account, or ErrCreditToken. A Nostr key's account has no token: one
// naming it is refused, whatever its mac (earlier versions handed such
// tokens out, and they spent the account without the key).
func accountOfToken(key []byte, token string) (string, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(token), creditTokenPrefix)
	i := strings.LastIndexByte(rest, '_')
	if !ok || i < 0 || !validAccount(rest[:i]) {
		return "", ErrCreditToken
	}
	account, mac := rest[:i], rest[i+1:]
	if isKeyAccount(account) {
		return "", fmt.Errorf("%w: a Nostr key's account is spent only by requests signed by its key (_meta[%q] = true)", ErrCreditToken, MetaCredit)
	}
	if !hmac.Equal([]byte(mac), []byte(creditMAC(key, account))) {
		return "", ErrCreditToken
	}
	return account, nil
}

// validAccount reports whether id is a credit account id: "t" and 24 hex
// digits, or "nostr-" and a 64-hex pubkey (the ledger's schema checks the
// same).
func validAccount(id string) bool {
	hexOf := func(s string, n int) bool {
		if len(s) != n {
			return false
		}
		_, err := hex.DecodeString(s)
		return err == nil && strings.ToLower(s) == s
	}
	if s, ok := strings.CutPrefix(id, "nostr-"); ok {
		return hexOf(s, 64)
	}
	s, ok := strings.CutPrefix(id, "t")
	return ok && hexOf(s, 24)
}

// isKeyAccount reports whether account is a Nostr key's own account.
func isKeyAccount(account string) bool { return strings.HasPrefix(account, "nostr-") }

// NostrAccount is the credit account of a Nostr pubkey (hex).
func NostrAccount(pubkey string) string { return "nostr-" + strings.ToLower(pubkey) }

// creditLedger is the ledger's credit role, and whether credit is on.
func (v *Vendor) creditLedger() (CreditLedger, bool) {
	return v.cfg.Ledger, v.cfg.Credit.Enabled
}

// topUpTool is the built-in tool that sells credit.
func (v *Vendor) topUpTool() Item {
	max := v.cfg.Credit.MaxTopUp.SatsCeil()
	return Item{Name: TopUpTool, Server: CreditServer, UpstreamName: topUpUpstream, Title: "Buy prepaid credit",
		Description: fmt.Sprintf("Buy N sats of prepaid credit for this server's priced tools (1 to %d sats). "+
			"Pay the invoice like any priced call; the answer gives your credit token and balance. Then send the token "+
			"in _meta[%q], the %s HTTP header or the %s argument with each call: it is paid from your balance at once.",
			max, MetaCredit, HeaderCredit, CreditArg),
		InputSchema: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"sats":{"type":"integer","minimum":1,"maximum":%d,`+
			`"description":"how many sats of credit to buy"}},"required":["sats"],"additionalProperties":false}`, max)),
		Idempotent: true, // crediting runs in the ledger, once (Deliver)
	}
}

func isTopUp(t *Item) bool { return t.Server == CreditServer && t.UpstreamName == topUpUpstream }

// topUpQuote prices a top-up: its sats, within bounds.
func (v *Vendor) topUpQuote(args json.RawMessage) (Quote, error) {
	var a struct {
		Sats int64 `json:"sats"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return Quote{}, fmt.Errorf("sats must be an integer")
	}
	price, err := FromSats(a.Sats)
	if err != nil || price <= 0 || price > v.cfg.Credit.MaxTopUp {
		return Quote{}, fmt.Errorf("sats must be 1 to %d", v.cfg.Credit.MaxTopUp.SatsCeil())
	}
	return Quote{Price: price, Idempotent: true, Description: fmt.Sprintf("%d sats of prepaid credit", a.Sats)}, nil
}

// withBalance is withCredit for the answer of a call drawn from account
// leaving balance: a delivered call's answer carries that balance with no
// ledger read (delivering moves nothing of the account); any other
// answer is withCredit's.
func (v *Vendor) withBalance(ctx context.Context, account string, balance Msat, res CallResult, err error) (CallResult, error) {
	if err != nil || res.Body == nil || res.IsError {
		return v.withCredit(ctx, account, false, res, err)
	}
	res.Body = withMeta(res.Body, MetaCredit, CreditInfo{Account: account, Balance: int64(balance / MsatPerSat), BalanceMsat: int64(balance)})
	return res, nil
}

// withCredit adds account's balance (and, for a top-up's answer, its
// token) to the answer in _meta[MetaCredit]: a result's _meta, or a
// *RefundError's or *CreditExhaustedError's data is left to the front.
// An answer that is no JSON object is returned as it is.
func (v *Vendor) withCredit(ctx context.Context, account string, topUp bool, res CallResult, err error) (CallResult, error) {
	if account == "" || err != nil || res.Body == nil {
		return res, err
	}
	info, ierr := v.CreditInfo(ctx, account, topUp)
	if ierr != nil {
		v.cfg.Log.Warn("vend: reading a credit balance", "err", ierr)
		return res, err
	}
	res.Body = withMeta(res.Body, MetaCredit, info)
	switch {
	case topUp && info.Token != "":
		res.Body = withText(res.Body, fmt.Sprintf("Your credit token is %s (balance %d sats). Keep it: send it in _meta[%q], "+
			"the %s HTTP header or the %s argument of a priced tool to pay from your balance.", info.Token, info.Balance,
			MetaCredit, HeaderCredit, CreditArg))
	case topUp:
		res.Body = withText(res.Body, fmt.Sprintf("Your balance is %d sats. Pay from it with _meta[%q] = true in requests signed by "+
			"this Nostr key: no token spends it without the key.", info.Balance, MetaCredit))
	}
	return res, err
}

// CreditInfo returns account's balance, with its token if withToken and
// the account has one: a Nostr key's account has none (it is spent only
// by requests signed by its key). ErrCreditOff without credit; an account
// never topped up has balance 0.
func (v *Vendor) CreditInfo(ctx context.Context, account string, withToken bool) (CreditInfo, error) {
	cl, ok := v.creditLedger()
	if !ok {
		return CreditInfo{}, ErrCreditOff
	}
	bal, err := cl.CreditBalance(ctx, account)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return CreditInfo{}, err
	}
	info := CreditInfo{Account: account, Balance: int64(bal / MsatPerSat), BalanceMsat: int64(bal)}
	if withToken && !isKeyAccount(account) {
		key, err := cl.CreditKey(ctx)
		if err != nil {
			return CreditInfo{}, err
		}
		info.Token = CreditToken(key, account)
	}
	return info, nil
}

// CreditAccountOf returns the account a credit token names (ErrCreditToken
// if none): for fronts that report a balance outside a call.
func (v *Vendor) CreditAccountOf(ctx context.Context, token string) (string, error) {
	return v.creditAccount(ctx, &CallRequest{Credit: token})
}

// expireCredit runs CreditLedger.ExpireCredit every ExpirySweep until ctx
// ends, when credit expires.
func (v *Vendor) expireCredit(ctx context.Context) {
	cl, ok := v.creditLedger()
	if !ok || v.cfg.Credit.ExpiresAfter <= 0 {
		return
	}
	tick := time.NewTicker(v.cfg.Credit.ExpirySweep)
	defer tick.Stop()
	for {
		if n, err := cl.ExpireCredit(ctx, v.cfg.Credit.ExpiresAfter); err != nil && ctx.Err() == nil {
			v.cfg.Log.Error("vend: expiring credit", "err", err)
		} else if n > 0 {
			v.cfg.Log.Info("vend: credit expired", "accounts", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// withMeta sets _meta[key] of a JSON object body to v; a body that is no
// JSON object is returned unchanged.
func withMeta(body json.RawMessage, key string, v any) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil || obj == nil {
		return body
	}
	meta := map[string]json.RawMessage{}
	if m, ok := obj["_meta"]; ok {
		if json.Unmarshal(m, &meta) != nil || meta == nil {
			meta = map[string]json.RawMessage{}
		}
	}
	meta[key] = mustJSON(v)
	obj["_meta"] = mustJSON(meta)
	out, err := json.Marshal(obj)
	if err != nil {
		return body
	}
	return out
}

// withText appends a text content item to a CallToolResult body.
func withText(body json.RawMessage, text string) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil || obj == nil {
		return body
	}
	var content []json.RawMessage
	json.Unmarshal(obj["content"], &content)
	content = append(content, mustJSON(map[string]string{"type": "text", "text": text}))
	obj["content"] = mustJSON(content)
	out, err := json.Marshal(obj)
	if err != nil {
		return body
	}
	return out
}

// topUpResult is what running a top-up returns: the stored answer (the
// credit itself is booked by the ledger's Deliver).
func topUpResult(price Msat) json.RawMessage {
	return mustJSON(map[string]any{"content": []map[string]string{{"type": "text",
		"text": fmt.Sprintf("Credited %d sats of prepaid credit.", price.SatsCeil())}}})
}

// creditPayment is the Payment a call paid from account's credit carries
// in memory: settled, of BackendCredit (the ledger has no payment row).
func creditPayment(c Call, account string) Payment {
	return Payment{NewPayment: NewPayment{Backend: BackendCredit, Kind: KindCredit, Ref: "credit:" + account, Amount: c.Price},
		CallID: c.ID, State: PaymentSettled}
}

// TopUpRequest is a top-up through TopUp.
type TopUpRequest struct {
	Transport, Client, RequestID string // the request key, as for CallRequest
	// Token is the credit token of the account to credit; "" opens a
	// new token account (the answer carries its token).
	Token string
	Sats  int64
	// PaymentProof (an invoice's preimage, hex) or PaymentToken pays the
	// top-up quoted before; CashuToken pays at once.
	PaymentProof, PaymentToken, CashuToken string
	// Macaroon, with PaymentProof, is the L402 credit macaroon of the
	// top-up (CallRequest.Macaroon): the top-up it names, and no other,
	// is credited.
	Macaroon []byte
}

// TopUp is the entry point of payment fronts that are not MCP (L402):
// credit an account with Sats, paid by a payment. It is CallTool of
// TopUpTool with explicit gating, so it has every guarantee of a priced
// call: the first request (no proof) returns *PaymentRequiredError with
// the invoice (its payment hash is PaymentRequiredError's invoice's); the
// repeat with the invoice's preimage (PaymentProof) or PaymentToken, or a
// request with a CashuToken, credits the account once and returns its
// balance and token; a repeat after that is refused (the grant is used).
func (v *Vendor) TopUp(ctx context.Context, t TopUpRequest) (CreditInfo, error) {
	res, err := v.CallItem(ctx, CallRequest{Transport: t.Transport, Client: t.Client, RequestID: t.RequestID, Name: TopUpTool,
		Arguments: mustJSON(map[string]int64{"sats": t.Sats}), Explicit: true, Credit: t.Token, PaymentProof: t.PaymentProof,
		PaymentToken: t.PaymentToken, CashuToken: t.CashuToken, Macaroon: t.Macaroon, L402: t.Macaroon != nil})
	if err != nil {
		return CreditInfo{}, err
	}
	if res.IsError {
		return CreditInfo{}, fmt.Errorf("%w: the top-up failed", ErrPaymentFailed)
	}
	var b struct {
		Meta map[string]CreditInfo `json:"_meta"`
	}
	if err := json.Unmarshal(res.Body, &b); err != nil {
		return CreditInfo{}, err
	}
	info, ok := b.Meta[MetaCredit]
	if !ok {
		return CreditInfo{}, errors.New("top-up answer without credit")
	}
	return info, nil
}
