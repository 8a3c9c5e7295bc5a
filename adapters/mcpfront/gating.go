package mcpfront

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// CapabilityPayments is the experimental client capability
// (capabilities.experimental["capvend/payments"], any value) by which a
// client declares that it handles capvend's payment notifications
// (notifications/payment_required and the rest). A client that did not
// declare it gets explicit gating: see docs/PAYING.md, Buying from any
// MCP host.
const CapabilityPayments = "capvend/payments"

// CodePaymentRequired402 is the JSON-RPC code of a payment-required (or
// pending) answer to a priced prompts/get or resources/read, which has no
// tool result to carry it: outside the range MCP reserves, the code x402's
// MCP binding uses.
const CodePaymentRequired402 = 402

// clientHandlesPayments reports whether the client of ctx declared
// CapabilityPayments: per request from protocol 2026-07-28, per session
// (its initialize) before, over HTTP and stdio alike.
func clientHandlesPayments(ctx context.Context) bool {
	if info := server.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		return info.ClientCapabilities != nil && hasPayments(info.ClientCapabilities.Experimental)
	}
	if sess, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
		return hasPayments(sess.GetClientCapabilities().Experimental)
	}
	return false
}

func hasPayments(exp map[string]any) bool {
	_, ok := exp[CapabilityPayments]
	return ok
}

// gate decides how cr is paid: a client that declared CapabilityPayments
// (or asked for explicit gating in _meta) keeps what it asked for; any
// other gets explicit gating answered as a tool result, with a payment
// token. With Config.LegacyGatingCode nothing changes here: explicit
// gating only when asked (or Config.ExplicitGating), no tokens.
func (s *Server) gate(ctx context.Context, cr *vend.CallRequest) {
	s.gateAs(cr, clientHandlesPayments(ctx))
}

// paysByURL reports whether cr, gated as explicit for a client that did
// not declare CapabilityPayments, is paid by URL-mode elicitation
// instead: the client declared it, the request asked for nothing else
// (explicit gating in _meta, HTTP 402, a credential), and pay pages have
// a public URL. It then turns cr back into a call that waits for its
// payment.
func (s *Server) paysByURL(ctx context.Context, cr *vend.CallRequest, meta *mcp.Meta) bool {
	if s.cfg.PayBaseURL == "" || s.cfg.LegacyGatingCode || s.cfg.ExplicitGating || cr.L402 || !cr.Explicit ||
		cr.PaymentToken != "" || cr.PaymentProof != "" || cr.CashuToken != "" || cr.Credit != "" || len(cr.X402) > 0 ||
		clientHandlesPayments(ctx) || !clientCanElicitURL(ctx) {
		return false
	}
	if meta != nil {
		if v, ok := meta.AdditionalFields[MetaPaymentInteraction].(string); ok && v == ExplicitGating {
			return false
		}
	}
	cr.Explicit = false
	return true
}

// gateAs is gate for a client that declared CapabilityPayments or not
// (the fast path of free calls knows it from the request).
func (s *Server) gateAs(cr *vend.CallRequest, handlesPayments bool) {
	if s.cfg.LegacyGatingCode {
		return
	}
	cr.PaymentTokens = true
	if !cr.Explicit && !handlesPayments {
		cr.Explicit = true
	}
}

// paymentAnswer is the structuredContent of a payment-required or
// payment-pending tool result (and the data of the 402 error of a prompt
// or resource), modeled on the x402 MCP transport's PaymentRequired: what
// is sold (resource), the ways to pay (accepts), and for the common case
// the first option's fields at the top, with how to retry.
type paymentAnswer struct {
	Error    string         `json:"error"` // "payment_required" or "payment_pending"
	Message  string         `json:"message"`
	Resource answerResource `json:"resource"`
	// Amount in sats (rounded up), AmountMsat exactly.
	Amount     int64  `json:"amount,omitempty"`
	AmountMsat int64  `json:"amount_msat,omitempty"`
	Unit       string `json:"unit,omitempty"`
	PMI        string `json:"pmi,omitempty"`
	Invoice    string `json:"invoice,omitempty"`
	PaymentURI string `json:"payment_uri,omitempty"` // lightning:<bolt11>
	ExpiresAt  string `json:"expires_at,omitempty"`  // RFC 3339, UTC
	RetryAfter int64  `json:"retry_after,omitempty"` // seconds (pending)
	// Accepts are the ways to pay (vend's PaymentOption: amount in sats,
	// pay_req, pmi, description, ttl).
	Accepts []vend.PaymentOption `json:"accepts,omitempty"`
	// PaymentToken is the value of capvend_payment for the retry.
	PaymentToken string      `json:"capvend_payment,omitempty"`
	Retry        answerRetry `json:"retry"`
	// PayURL is the call's pay page (paypage.go), when the front has a
	// public URL.
	PayURL string `json:"pay_url,omitempty"`
	// X402 is x402's MCP binding of the same answer (its
	// PaymentRequired, wrapped as transports-v2/mcp.md has clients look
	// for it), when vend gave x402 requirements.
	X402 *x402Error `json:"x402/error,omitempty"`
}

type answerResource struct {
	URL         string `json:"url"` // mcp://tool/<name>, mcp://prompt/<name>, or the resource's URI
	Description string `json:"description,omitempty"`
}

// answerRetry says how to repeat the call: the same method and name with
// the same arguments, plus Arguments (tools) or Meta (prompts, resources).
type answerRetry struct {
	Method       string            `json:"method"`
	Name         string            `json:"name"`
	Arguments    map[string]string `json:"arguments,omitempty"`
	Meta         map[string]string `json:"_meta,omitempty"`
	Instructions string            `json:"instructions"`
}

// gatingAnswer renders explicit gating's err (a *vend.PaymentRequiredError
// or *vend.PaymentPendingError) for cr; ok=false for any other error, or
// with Config.LegacyGatingCode (the -32042/-32043 errors).
func (s *Server) gatingAnswer(cr *vend.CallRequest, err error) (a paymentAnswer, text string, ok bool) {
	if s.cfg.LegacyGatingCode {
		return a, "", false
	}
	pr, isReq := errors.AsType[*vend.PaymentRequiredError](err)
	pp, isPend := errors.AsType[*vend.PaymentPendingError](err)
	if !isReq && !isPend {
		return a, "", false
	}
	what, url, method := itemWhat(cr)
	a.Retry = answerRetry{Method: method, Name: cr.Name}
	a.Resource.URL = url
	token := ""
	var expires time.Time
	var b strings.Builder
	if isReq {
		a.Error = "payment_required"
		token, expires = pr.Token, pr.ExpiresAt
		if pr.Amount > 0 {
			a.AmountMsat, a.Amount = int64(pr.Amount), pr.Amount.SatsCeil()
		}
		a.Unit, a.PMI, a.Invoice = "sat", vend.PMILightning, pr.Invoice
		for _, o := range pr.Options { // a Vendor that gave only options
			if o.PMI == vend.PMILightning && a.Invoice == "" {
				a.Invoice = o.PayReq
			}
			if a.Amount == 0 {
				a.Amount = o.Amount
			}
		}
		if a.Invoice != "" {
			a.PaymentURI = "lightning:" + a.Invoice
		}
		a.Accepts = pr.Options
		a.PayURL = s.payURL(pr.PayPage)
		if req := x402RequiredOf(cr, pr); req != nil {
			a.X402 = &x402Error{Code: CodePaymentRequired402, Message: "Payment required", Data: req}
		}
		if len(pr.Options) > 0 {
			a.Resource.Description = pr.Options[0].Description
		}
		a.Message = fmt.Sprintf("Payment required: %d sats to %s.", a.Amount, what)
		fmt.Fprintf(&b, "%s\n\nPay this Lightning invoice", a.Message)
	} else {
		a.Error = "payment_pending"
		token, expires = pp.Token, pp.ExpiresAt
		a.RetryAfter = pp.RetryAfter
		a.Message = fmt.Sprintf("Payment not received yet: try again in %d seconds.", pp.RetryAfter)
		fmt.Fprintf(&b, "%s", a.Message)
	}
	if !expires.IsZero() {
		a.ExpiresAt = expires.UTC().Format(time.RFC3339)
	}
	if isReq && a.Invoice != "" {
		if a.ExpiresAt != "" {
			fmt.Fprintf(&b, " (it expires at %s)", a.ExpiresAt)
		}
		fmt.Fprintf(&b, ":\n\n%s\n\n%s\n\n", a.Invoice, a.PaymentURI)
		if a.PayURL != "" {
			fmt.Fprintf(&b, "Or pay on this page (a QR code; it says when the payment arrived): %s\n\n", a.PayURL)
		}
	} else if isReq {
		b.WriteString(".\n\n")
	} else if a.ExpiresAt != "" {
		fmt.Fprintf(&b, " The invoice stays payable until %s.\n\n", a.ExpiresAt)
	} else {
		b.WriteString("\n\n")
	}
	switch {
	case token != "" && cr.Kind.Or() == vend.ItemTool:
		a.PaymentToken = token
		a.Retry.Arguments = map[string]string{vend.PaymentArg: token}
		a.Retry.Instructions = fmt.Sprintf("After paying, call %s again with the same arguments plus %s: %s", cr.Name, vend.PaymentArg, token)
	case token != "":
		a.PaymentToken = token
		a.Retry.Meta = map[string]string{vend.MetaPaymentToken: token}
		a.Retry.Instructions = fmt.Sprintf("After paying, send the same %s request again with _meta[%q]: %s", a.Retry.Method, vend.MetaPaymentToken, token)
	default:
		a.Retry.Instructions = fmt.Sprintf("After paying, send the same %s request again.", a.Retry.Method)
	}
	if isPend {
		a.Retry.Instructions = strings.Replace(a.Retry.Instructions, "After paying, ", "Once paid, ", 1)
	}
	b.WriteString(a.Retry.Instructions)
	return a, b.String(), true
}

// itemWhat says what cr buys, for people ("call t"), as a URL
// ("mcp://tool/t") and as the method that buys it again.
func itemWhat(cr *vend.CallRequest) (what, url, method string) {
	switch cr.Kind {
	case vend.ItemPrompt:
		return "get the prompt " + cr.Name, "mcp://prompt/" + cr.Name, "prompts/get"
	case vend.ItemResource:
		return "read " + cr.Name, cr.Name, "resources/read"
	}
	return "call " + cr.Name, "mcp://tool/" + cr.Name, "tools/call"
}

// gatingResult is the tool result of explicit gating's err: isError,
// content[0].text for people and models, structuredContent for machines;
// nil if err is not one (see gatingAnswer).
func (s *Server) gatingResult(cr *vend.CallRequest, err error) *mcp.CallToolResult {
	a, text, ok := s.gatingAnswer(cr, err)
	if !ok {
		return nil
	}
	body, merr := json.Marshal(struct {
		Content           []mcp.TextContent `json:"content"`
		StructuredContent paymentAnswer     `json:"structuredContent"`
		IsError           bool              `json:"isError"`
	}{[]mcp.TextContent{mcp.NewTextContent(text)}, a, true})
	if merr != nil {
		return nil
	}
	return s.placeholder(body, true)
}

// gatingError is explicit gating's err for a priced prompts/get or
// resources/read: JSON-RPC 402 "Payment Required" (or "Payment Pending")
// whose data is the structuredContent a tool would get, plus the text
// under "text". ok=false if err is not one.
func (s *Server) gatingError(cr *vend.CallRequest, err error) (wireError, bool) {
	a, text, ok := s.gatingAnswer(cr, err)
	if !ok {
		return wireError{}, false
	}
	msg := "Payment Required"
	if a.Error == "payment_pending" {
		msg = "Payment Pending"
	}
	return wireError{Code: CodePaymentRequired402, Message: msg, Data: struct {
		paymentAnswer
		Text string `json:"text"`
	}{a, text}}, true
}

// markWire returns w marked for the writers (see markError).
func (s *Server) markWire(w wireError, err error) error {
	b, _ := json.Marshal(w)
	return &markedError{text: s.errPrefix() + base64.RawURLEncoding.EncodeToString(b), err: err}
}

// withPaymentArg returns a priced tool's input schema with the optional
// string property capvend_payment (vend.PaymentArg) added, and with credit
// capvend_credit (vend.CreditArg), telling the model what to pass: schema
// unchanged if it is not a JSON object.
func withPaymentArg(schema json.RawMessage, credit bool) json.RawMessage {
	var fields map[string]json.RawMessage
	if json.Unmarshal(schema, &fields) != nil || fields == nil {
		return schema
	}
	var props map[string]json.RawMessage
	if raw, ok := fields["properties"]; ok {
		if json.Unmarshal(raw, &props) != nil || props == nil {
			return schema
		}
	} else {
		props = map[string]json.RawMessage{}
	}
	props[vend.PaymentArg] = paymentArgSchema
	if credit {
		props[vend.CreditArg] = creditArgSchema
	}
	fields["properties"], _ = json.Marshal(props)
	out, err := json.Marshal(fields)
	if err != nil {
		return schema
	}
	return out
}

// creditArgSchema is the schema of capvend_credit in a priced tool's
// inputSchema when the server sells credit.
var creditArgSchema = json.RawMessage(`{"type":"string","description":"Optional: a prepaid credit token (cvc_...) ` +
	`from a ` + vend.TopUpTool + ` answer. With it the call is paid from that credit at once, with no invoice."}`)

// paymentArgSchema is the schema of capvend_payment in a priced tool's
// inputSchema.
var paymentArgSchema = json.RawMessage(`{"type":"string","description":"Leave out on the first call. ` +
	`This tool is paid: an unpaid call answers with a Lightning invoice and a payment token. ` +
	`After the invoice is paid, call the tool again with the same arguments and this set to that payment token."}`)
