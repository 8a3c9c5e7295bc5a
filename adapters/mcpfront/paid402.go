package mcpfront

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/capvend/capvend/vend"
)

// MPP and x402 on the HTTP 402, and x402's MCP binding (docs/PAYING.md
// has the wire for people). Both are read into the vend.CallRequest and
// judged by vend (scheme_mpp.go, scheme_x402.go); this file only
// translates.
//
// MPP (draft-lightning-charge-00, as @getalby/lightning-tools 9.0.1 reads
// it): a 402 carries
//
//	WWW-Authenticate: Payment id="…", realm="capvend", method="lightning", intent="charge", request="…", expires="…"
//
// and the retry Authorization: Payment <base64url credential>, which
// becomes CallRequest.MPP. fetchWithMpp reads the joined WWW-Authenticate
// only when it starts with "Payment": the challenge is written where
// Config.HTTP402Schemes lists "mpp" (first, for those clients).
//
// x402 (v2, exact on Lightning): a 402 carries PAYMENT-REQUIRED, base64
// of a PaymentRequired object whose accepts hold the invoice's
// requirements, and the retry PAYMENT-SIGNATURE, base64 of the payment
// payload, which becomes CallRequest.X402. On MCP (any transport) the
// payload may come in _meta["x402/payment"] instead. A call an x402
// payload paid answers with the SettlementResponse: the PAYMENT-RESPONSE
// header over HTTP when the response has not started, and always
// _meta["x402/payment-response"] in the result.

// x402's HTTP headers.
const (
	HeaderX402Required = "PAYMENT-REQUIRED"
	HeaderX402Payment  = "PAYMENT-SIGNATURE"
	HeaderX402Response = "PAYMENT-RESPONSE"
	// HeaderMPPReceipt is MPP's receipt of a paid call.
	HeaderMPPReceipt = "Payment-Receipt"
)

// errBadPayment: a PAYMENT-SIGNATURE that is not base64 JSON, or an
// Authorization: Payment with no token.
var errBadPayment = errors.New("malformed payment credential: want Authorization: Payment <base64url> or PAYMENT-SIGNATURE: <base64 JSON>")

func isMPPScheme(s string) bool { return strings.EqualFold(s, "Payment") }

// readPaymentHeaders fills cr's MPP and x402 credentials from the
// request's headers h; a malformed one is an error the caller answers
// (401). An x402 payload in _meta (readMeta) wins over the header.
func readPaymentHeaders(cr *vend.CallRequest, h http.Header) error {
	for _, v := range h.Values("Authorization") {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		if !isMPPScheme(scheme) {
			continue
		}
		if rest = strings.TrimSpace(rest); rest == "" {
			return errBadPayment
		}
		cr.MPP = rest
		break
	}
	sig := strings.TrimSpace(h.Get(HeaderX402Payment))
	if sig == "" || len(cr.X402) > 0 {
		return nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(sig); err == nil && json.Valid(b) {
			cr.X402 = b
			return nil
		}
	}
	return errBadPayment
}

// challengeMPP writes the MPP Lightning charge challenge of e, as
// lightning-tools' makeMppWwwAuthenticateHeader writes it.
func challengeMPP(_ *Server, h http.Header, _ *vend.CallRequest, e *vend.PaymentRequiredError) bool {
	c := e.MPP
	if c == nil {
		return false
	}
	v := `Payment id="` + c.ID + `", realm="` + c.Realm + `", method="` + c.Method + `", intent="` + c.Intent + `", request="` + c.Request + `"`
	if c.Expires != "" {
		v += `, expires="` + c.Expires + `"`
	}
	h.Add("WWW-Authenticate", v)
	return true
}

// x402Required is x402 v2's PaymentRequired object.
type x402Required struct {
	X402Version int                     `json:"x402Version"`
	Error       string                  `json:"error"`
	Resource    x402Resource            `json:"resource"`
	Accepts     []vend.X402Requirements `json:"accepts"`
}

type x402Resource struct {
	URL         string `json:"url"`
	Description string `json:"description,omitempty"`
	MimeType    string `json:"mimeType"`
}

// x402RequiredOf is the PaymentRequired object of e for cr, nil when e
// carries no x402 requirements.
func x402RequiredOf(cr *vend.CallRequest, e *vend.PaymentRequiredError) *x402Required {
	if e.X402 == nil {
		return nil
	}
	_, url, _ := itemWhat(cr)
	desc := ""
	if len(e.Options) > 0 {
		desc = e.Options[0].Description
	}
	return &x402Required{X402Version: vend.X402Version, Error: "payment required", Accepts: []vend.X402Requirements{*e.X402},
		Resource: x402Resource{URL: url, Description: desc, MimeType: "application/json"}}
}

// challengeX402 writes PAYMENT-REQUIRED: base64 of the PaymentRequired
// object of e.
func challengeX402(_ *Server, h http.Header, cr *vend.CallRequest, e *vend.PaymentRequiredError) bool {
	req := x402RequiredOf(cr, e)
	if req == nil {
		return false
	}
	b, _ := json.Marshal(req)
	h.Set(HeaderX402Required, base64.StdEncoding.EncodeToString(b))
	return true
}

// x402Error is the MCP binding's payment-required wrapper
// (structuredContent["x402/error"]).
type x402Error struct {
	Code    int           `json:"code"`
	Message string        `json:"message"`
	Data    *x402Required `json:"data"`
}

// x402Settlement returns the SettlementResponse of cr's call when an
// x402 payload paid it and it answered: ok=false otherwise.
func x402Settlement(cr *vend.CallRequest, err error) (vend.X402Settlement, bool) {
	if len(cr.X402) == 0 || err != nil {
		return vend.X402Settlement{}, false
	}
	p, perr := vend.ParseX402(cr.X402)
	if perr != nil {
		return vend.X402Settlement{}, false
	}
	return p.SettlementOf(), true
}

// paidHeaders sets, over HTTP and while the response has not started, the
// receipt headers of a call an MPP credential or x402 payload paid:
// Payment-Receipt (MPP) or PAYMENT-RESPONSE (x402).
func paidHeaders(ctx context.Context, cr *vend.CallRequest, err error) {
	rw, _ := ctx.Value(keyHTTPWriter).(*rewriteWriter)
	if rw == nil || err != nil {
		return
	}
	var name, value string
	if set, ok := x402Settlement(cr, err); ok {
		b, _ := json.Marshal(set)
		name, value = HeaderX402Response, base64.StdEncoding.EncodeToString(b)
	} else if cr.MPP != "" {
		if id, ref, ok := mppReceiptOf(cr.MPP); ok {
			b, _ := json.Marshal(map[string]string{"method": vend.MPPMethod, "challengeId": id, "reference": ref,
				"status": "success", "timestamp": time.Now().UTC().Format(time.RFC3339)})
			name, value = HeaderMPPReceipt, base64.RawURLEncoding.EncodeToString(b)
		}
	}
	if name == "" {
		return
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.wroteHeader {
		rw.w.Header().Set(name, value)
	}
}

// mppReceiptOf reads an MPP credential's challenge id and payment hash
// (the receipt's reference: never the preimage). vend verified it.
func mppReceiptOf(token string) (id, ref string, ok bool) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(token, "="))
	if err != nil {
		return "", "", false
	}
	var c struct {
		Challenge vend.MPPChallenge `json:"challenge"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return "", "", false
	}
	rb, _ := base64.RawURLEncoding.DecodeString(c.Challenge.Request)
	var req struct {
		MethodDetails struct {
			PaymentHash string `json:"paymentHash"`
		} `json:"methodDetails"`
	}
	if json.Unmarshal(rb, &req) != nil {
		return "", "", false
	}
	return c.Challenge.ID, req.MethodDetails.PaymentHash, true
}

// withX402Response returns a tool result body with the settlement of the
// x402 payload that paid it in _meta["x402/payment-response"].
func withX402Response(body json.RawMessage, set vend.X402Settlement) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := m["_meta"]; ok {
		_ = json.Unmarshal(raw, &meta)
	}
	meta[vend.MetaX402Response], _ = json.Marshal(set)
	m["_meta"], _ = json.Marshal(meta)
	b, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return b
}
