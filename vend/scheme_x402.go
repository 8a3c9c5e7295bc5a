package vend

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/btcsuite/btcd/btcutil/bech32"
)

// x402 "exact" with Lightning (x402 v2's scheme_exact_lightning, as
// @getalby/lightning-tools' fetchWithX402 reads and writes it;
// docs/PAYING.md has the wire). An unpaid explicit-gating call of a
// request that asked for HTTP 402 answers (CallRequest.L402) carries the
// payment requirements of its invoice (PaymentRequiredError.X402): scheme
// "exact", the Bitcoin network (CAIP-2), the amount in msat, and in extra
// the payment method "lightning" and the invoice. The client pays the
// invoice and repeats the call with a payment payload naming it
// (CallRequest.X402: HTTP's PAYMENT-SIGNATURE header, or the MCP binding's
// _meta["x402/payment"]).

// schemeX402: an x402 payment payload. It carries the invoice and
// nothing else: no preimage, no secret of the client's. An invoice is
// learned by the payer's wallet (and any custodian or LSP it pays
// through) in the normal course of payment, so it is not a bearer
// credential: like a plain invoice's preimage (schemePreimage) it
// releases its call only to the client the call was quoted to (the same
// MCP session, stdio), once its payment is settled. An anonymous HTTP
// client (no session) is released nothing by it.
var schemeX402 = Scheme{Name: SchemeX402, Credential: "an x402 payment payload naming the paid invoice, from the quoted client",
	Releases: ReleasesCall, Private: true}

// x402 values capvend writes and reads.
const (
	X402Version       = 2
	X402Scheme        = "exact"
	X402PaymentMethod = "lightning"
	X402Asset         = "BTC"
	X402PayTo         = "anonymous"
	// MetaX402Payment and MetaX402Response are the MCP binding's _meta
	// keys (x402 specs/transports-v2/mcp.md): the payment payload in, the
	// settlement response out.
	MetaX402Payment  = "x402/payment"
	MetaX402Response = "x402/payment-response"
)

// X402Wait bounds how long a request presenting an x402 payload waits
// for the backend to report its invoice's payment: the payer's wallet
// reports success once it settled, so the report is due at once; a
// payload for an invoice still unpaid after that is answered pending.
const X402Wait = 30 * time.Second

// ErrX402Invalid refuses an x402 payment payload that does not verify:
// not version 2 exact Lightning, its invoices differ, not an invoice of
// this server, another amount or network, or expired. Fronts answer
// HTTP 401. Nothing runs and nothing is charged.
var ErrX402Invalid = errors.New("invalid x402 payment")

// X402Requirements is one x402 v2 PaymentRequirements object, exact on
// Lightning.
type X402Requirements struct {
	Scheme            string    `json:"scheme"`
	Network           string    `json:"network"`
	Amount            string    `json:"amount"` // msat, decimal
	Asset             string    `json:"asset"`
	PayTo             string    `json:"payTo"`
	MaxTimeoutSeconds int64     `json:"maxTimeoutSeconds"`
	Extra             X402Extra `json:"extra"`
}

// X402Extra is the Lightning part of the requirements. PaymentHash is
// capvend's (the invoice's, to find it without decoding it); clients echo
// it with the rest.
type X402Extra struct {
	PaymentMethod string `json:"paymentMethod"`
	Invoice       string `json:"invoice"`
	PaymentHash   string `json:"paymentHash,omitempty"`
}

// X402Payload is an x402 v2 PaymentPayload, exact on Lightning.
// lightning-tools also writes scheme and network at the top.
type X402Payload struct {
	X402Version int              `json:"x402Version"`
	Scheme      string           `json:"scheme,omitempty"`
	Network     string           `json:"network,omitempty"`
	Accepted    X402Requirements `json:"accepted"`
	Payload     struct {
		Invoice string `json:"invoice"`
	} `json:"payload"`
}

// X402Settlement is the SettlementResponse of a call an x402 payload paid.
type X402Settlement struct {
	Success     bool   `json:"success"`
	Transaction string `json:"transaction"` // the invoice
	Network     string `json:"network"`
	Payer       string `json:"payer"`
	Extra       struct {
		Invoice string `json:"invoice"`
	} `json:"extra"`
}

// SettlementOf returns the settlement response of a call p paid.
func (p *X402Payload) SettlementOf() X402Settlement {
	s := X402Settlement{Success: true, Transaction: p.Payload.Invoice, Network: p.Accepted.Network, Payer: X402PayTo}
	s.Extra.Invoice = p.Payload.Invoice
	return s
}

// x402Network is the CAIP-2 id of the Bitcoin network of a bolt11 (its
// genesis block hash, truncated): mainnet, testnet, signet, regtest.
func x402Network(bolt11 string) string {
	switch lightningNetwork(bolt11) {
	case "regtest":
		return "bip122:0f9188f13cb7b2c71f2a335e3a4fc328"
	case "signet":
		return "bip122:00000008819873e925422c1ff0f99f7c"
	case "testnet":
		return "bip122:000000000933ea01ad0ee984209779ba"
	}
	return "bip122:000000000019d6689c085ae165831e93"
}

// addX402 adds to e, the explicit-gating answer of c, the x402
// requirements of its invoice, on a private channel when the payment is
// an LND invoice: for HTTP 402 answers and for the MCP binding's
// payment-required tool result alike (they name no secret).
func (c *pending) addX402(e *PaymentRequiredError) {
	if !c.r.secretsAllowed() || c.pay.Kind != KindInvoice {
		return
	}
	e.X402 = &X402Requirements{Scheme: X402Scheme, Network: x402Network(c.pay.Bolt11), Amount: strconv.FormatInt(int64(c.pay.Amount), 10),
		Asset: X402Asset, PayTo: X402PayTo, MaxTimeoutSeconds: max(int64(time.Until(c.pay.ExpiresAt).Seconds()), 1),
		Extra: X402Extra{PaymentMethod: X402PaymentMethod, Invoice: c.pay.Bolt11, PaymentHash: c.pay.Ref}}
}

// ParseX402 decodes a payment payload (JSON) and checks its shape:
// version 2, exact, Lightning, the same invoice paid as accepted.
func ParseX402(raw []byte) (X402Payload, error) {
	var p X402Payload
	if err := json.Unmarshal(raw, &p); err != nil {
		return X402Payload{}, fmt.Errorf("%w: not a payment payload", ErrX402Invalid)
	}
	a := p.Accepted
	switch {
	case p.X402Version != X402Version:
		return X402Payload{}, fmt.Errorf("%w: x402Version %d, want %d", ErrX402Invalid, p.X402Version, X402Version)
	case a.Scheme != X402Scheme || a.Extra.PaymentMethod != X402PaymentMethod:
		return X402Payload{}, fmt.Errorf("%w: not exact on Lightning", ErrX402Invalid)
	case p.Payload.Invoice == "" || p.Payload.Invoice != a.Extra.Invoice:
		return X402Payload{}, fmt.Errorf("%w: the invoice paid is not the one accepted", ErrX402Invalid)
	}
	return p, nil
}

// grantByX402 verifies r's x402 payload for a call selling bind and
// returns the call it names: its invoice must be one this server issued,
// for the accepted amount and network, not expired; the call paid or
// awaiting that invoice. Whose call it is, released checks (bound).
func (v *Vendor) grantByX402(ctx context.Context, r *CallRequest, bind Binding) (Call, error) {
	p, err := ParseX402(r.X402)
	if err != nil {
		return Call{}, err
	}
	inv := p.Payload.Invoice
	hash := p.Accepted.Extra.PaymentHash
	if h, err := Bolt11PaymentHash(inv); err == nil {
		hash = h
	}
	pay, err := v.cfg.Ledger.Payment(ctx, hash)
	if errors.Is(err, ErrNotFound) || (err == nil && (pay.Kind != KindInvoice || pay.Bolt11 != inv)) {
		return Call{}, fmt.Errorf("%w: not an invoice of this server", ErrX402Invalid)
	}
	if err != nil {
		return Call{}, err
	}
	if p.Accepted.Amount != strconv.FormatInt(int64(pay.Amount), 10) || p.Accepted.Network != x402Network(inv) {
		return Call{}, fmt.Errorf("%w: another amount or network than the invoice's", ErrX402Invalid)
	}
	if pay.State == PaymentOpen && !time.Now().Before(pay.ExpiresAt) {
		return Call{}, ErrTokenExpired
	}
	return v.grantOfPayment(ctx, pay, bind, ErrX402Invalid)
}

// Bolt11PaymentHash returns the payment hash (hex) of a bolt11 invoice,
// read from its p field; the signature is not checked (the invoice is
// looked up among the server's own, and compared whole).
func Bolt11PaymentHash(bolt11 string) (string, error) {
	_, data, err := bech32.DecodeNoLimit(strings.ToLower(bolt11))
	if err != nil {
		return "", err
	}
	const timestamp, signature = 7, 104
	if len(data) < timestamp+signature {
		return "", errors.New("bolt11 too short")
	}
	fields := data[timestamp : len(data)-signature]
	for len(fields) >= 3 {
		typ, n := fields[0], int(fields[1])<<5|int(fields[2])
		if len(fields) < 3+n {
			break
		}
		if typ == 1 && n == 52 { // p: the payment hash, 256 bits in 52 groups
			b, err := bech32.ConvertBits(fields[3:3+n], 5, 8, false)
			if err != nil || len(b) != 32 {
				return "", errors.New("bolt11 payment hash malformed")
			}
			return hex.EncodeToString(b), nil
		}
		fields = fields[3+n:]
	}
	return "", errors.New("bolt11 has no payment hash")
}
