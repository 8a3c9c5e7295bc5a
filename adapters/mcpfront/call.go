package mcpfront

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// Log attribute keys.
const (
	logKeyTool      = "tool"
	logKeyTransport = "transport"
	logKeyCode      = "code"
	logKeyErr       = "err"
	logKeyMethod    = "method"
)

// wireError is a JSON-RPC error as it must reach the client.
type wireError = rpcerr.Error

// toWire maps a Vendor error (or the front's own request-state errors) to
// the JSON-RPC error sent to the client.
func toWire(err error, tool string) wireError {
	switch {
	case errors.Is(err, errRequestState):
		return wireError{Code: rpcerr.CodeInvalidParams, Message: "Unknown or expired request state"}
	case errors.Is(err, errInputResponse):
		return wireError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params: " + errInputResponse.Error()}
	}
	return rpcerr.FromVend(err, tool)
}

// markedError is what the handler returns to mcp-go: its text is the
// marker the writers replace with the wire error.
//
// mcp-go (v1.2.1) turns every tool-handler error into -32603 with the
// error's text as message, and has no way to set a code or data. So the
// handler returns an error whose text is a marker (a per-Server random
// nonce plus the encoded error), and the writers under mcp-go (the
// http.ResponseWriter given to its handler, rewriteWriter; the io.Writer
// given to its stdio server, lineWriter) replace such a message with the
// real error. Results are passed the same way (placeholder), so that
// mcp-go never re-encodes them. Nothing else is touched.
type markedError struct {
	text string
	err  error // the Vendor's error, for mcp-go's hooks and logs
}

func (e *markedError) Error() string { return e.text }
func (e *markedError) Unwrap() error { return e.err }

func (s *Server) errPrefix() string { return "capvend-error " + s.nonce + " " }

func (s *Server) markError(err error, tool string) error {
	return s.markWire(toWire(err, tool), err)
}

// unmarkError returns the wire error a marked message stands for.
func (s *Server) unmarkError(msg string) (json.RawMessage, bool) {
	rest, ok := strings.CutPrefix(msg, s.errPrefix())
	if !ok {
		return nil, false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || !json.Valid(b) {
		return nil, false
	}
	return b, true
}

// metaVerbatim is the placeholder result's _meta key; its value is the nonce.
const metaVerbatim = "capvend/verbatim"

// placeholder carries body through mcp-go, to be put back by the writers.
func (s *Server) placeholder(body json.RawMessage, isError bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Result:  mcp.Result{Meta: &mcp.Meta{AdditionalFields: map[string]any{metaVerbatim: s.nonce}}},
		Content: []mcp.Content{mcp.NewTextContent(string(body))},
		IsError: isError,
	}
}

// handleCall is the mcp-go handler of every tool. The call becomes a
// vend.CallRequest:
//
//   - Transport "mcp-http" or "mcp-stdio";
//   - Client the MCP session id (HTTP before protocol 2026-07-28), the
//     Config.ClientID of the HTTP request, or "stdio"; an HTTP request
//     with neither is Anonymous, Client "anonymous". Client makes request
//     ids unique: a repeated request of the same session is a replay,
//     while an anonymous client's request ids are never matched across
//     requests and its explicit-gating grant is released only by its
//     preimage or its payment token;
//   - Source, over HTTP, who the request counts as for the Vendor's
//     limits, unpaid quotes and free quotas, and for parked elicitations
//     (see source);
//   - RequestID the JSON-RPC id as JSON text (1 and "1" differ);
//   - Arguments the raw arguments object ({} when absent);
//   - from params._meta (readMeta): ProgressToken progressToken as JSON,
//     CashuToken "capvend/cashu", PMIs "capvend/pmi" (array of strings),
//     PaymentToken "capvend/payment" (vend takes the capvend_payment
//     argument out of Arguments itself), Credit "capvend/credit", else the
//     Capvend-Credit request header (vend takes a capvend_credit argument
//     itself);
//   - Explicit when _meta["capvend/payment_interaction"] is
//     "explicit_gating", Config.ExplicitGating is set, or the client did
//     not declare CapabilityPayments (gate); PaymentTokens unless
//     Config.LegacyGatingCode;
//   - Notify sends a notification on the call's own stream (notifier).
//
// A result is returned as the Vendor gave it (its JSON values byte for
// byte; with protocol 2026-07-28 mcp-go's resultType and _meta.serverInfo
// are added when the body lacks them); an error becomes the JSON-RPC
// error of toWire. Over HTTP an answer that reports a credit balance sets
// the Capvend-Credit response header to it, in msat, when the response
// has not started streaming (creditHeader).
func (s *Server) handleCall(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	cr := vend.CallRequest{
		Name:      req.Params.Name,
		RequestID: req.Header.Get(rpcIDHeader),
		Arguments: req.Params.RawArguments,
		Explicit:  s.cfg.ExplicitGating,
	}
	cr.Transport, _ = ctx.Value(keyTransport).(string)
	cr.Client, _ = ctx.Value(keyClient).(string)
	cr.Anonymous = cr.Client == anonClient
	cr.Source, _ = ctx.Value(keySource).(string)
	if len(cr.Arguments) == 0 || string(cr.Arguments) == "null" {
		if req.Params.Arguments != nil {
			cr.Arguments, _ = json.Marshal(req.Params.Arguments)
		} else {
			cr.Arguments = json.RawMessage(`{}`)
		}
	}
	readMeta(&cr, req.Params.Meta)
	readCreditHeader(&cr, req.Header)
	s.gate(ctx, &cr)
	s.payOverHTTP(ctx, &cr)
	cr.Notify = s.notifier(ctx)
	if _, isHTTP := ctx.Value(keyHTTPWriter).(*rewriteWriter); isHTTP {
		if err := s.readL402(&cr, req.Header); err != nil && s.answerHTTP(ctx, &cr, err) {
			return answeredOverHTTP, nil
		}
	}

	if req.Params.RequestState != "" {
		return s.resume(ctx, req, cr)
	}
	if s.paysByURL(ctx, &cr, req.Params.Meta) {
		if mcp.IsModernProtocol(server.RequestProtocolVersion(ctx)) {
			// The pay page is asked for as an input_required result;
			// the retry waits for the payment (askPayPage).
			return s.await(ctx, s.startCall(ctx, cr, true))
		}
		// The call waits for its payment while the person pays on the
		// pay page the client opens (paypage.go).
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ue := &urlElicit{id: make(chan string, 1)}
		cr.PayPage = s.elicitPayPage(cctx, &cr, cancel, ue)
		res, err := s.await(cctx, s.startCall(cctx, cr, false))
		s.elicitComplete(ctx, ue)
		return res, err
	}
	return s.await(ctx, s.startCall(ctx, cr, false))
}

// answeredOverHTTP is the handler's result for a request answerHTTP
// answered: mcp-go's response to it is dropped by the writer.
var answeredOverHTTP = &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent("answered over HTTP")}, IsError: true}

// readMeta fills cr from a request's _meta: progress token, Cashu token,
// payment proof, invoice backend, refund invoice, explicit gating, payment
// methods.
func readMeta(cr *vend.CallRequest, m *mcp.Meta) {
	if m == nil {
		return
	}
	if m.ProgressToken != nil {
		cr.ProgressToken, _ = json.Marshal(m.ProgressToken)
	}
	if tok, ok := m.AdditionalFields[vend.MetaCashuToken].(string); ok {
		cr.CashuToken = tok
	}
	if proof, ok := m.AdditionalFields[vend.MetaPaymentProof].(string); ok {
		cr.PaymentProof = proof
	}
	if tok, ok := m.AdditionalFields[vend.MetaPaymentToken].(string); ok {
		cr.PaymentToken = tok
	}
	if from, ok := m.AdditionalFields[vend.MetaInvoiceFrom].(string); ok {
		cr.InvoiceFrom = vend.Backend(from)
	}
	if inv, ok := m.AdditionalFields[vend.MetaRefundInvoice].(string); ok {
		cr.RefundInvoice = inv
	}
	if tok, ok := m.AdditionalFields[vend.MetaCredit].(string); ok {
		cr.Credit = tok
	}
	if p, ok := m.AdditionalFields[vend.MetaX402Payment].(map[string]any); ok {
		cr.X402, _ = json.Marshal(p) // x402's MCP binding (paid402.go)
	}
	if v, ok := m.AdditionalFields[MetaPaymentInteraction].(string); ok && v == ExplicitGating {
		cr.Explicit = true
	}
	if list, ok := m.AdditionalFields[MetaPMI].([]any); ok {
		for _, p := range list {
			if str, ok := p.(string); ok {
				cr.PMIs = append(cr.PMIs, str)
			}
		}
	}
}

// itemRequest is the vend.CallRequest of a priced prompts/get or
// resources/read: like a tools/call's (see handleCall), without
// elicitation (prompts and resources do not ask). Over HTTP it reads the
// L402 credential too; a malformed one is the error sell answers (401).
func (s *Server) itemRequest(ctx context.Context, kind vend.ItemKind, name string, args json.RawMessage, h http.Header,
	meta *mcp.Meta) (vend.CallRequest, error) {
	cr := vend.CallRequest{Kind: kind, Name: name, RequestID: h.Get(rpcIDHeader), Arguments: args, Explicit: s.cfg.ExplicitGating}
	cr.Transport, _ = ctx.Value(keyTransport).(string)
	cr.Client, _ = ctx.Value(keyClient).(string)
	cr.Anonymous = cr.Client == anonClient
	cr.Source, _ = ctx.Value(keySource).(string)
	readMeta(&cr, meta)
	readCreditHeader(&cr, h)
	s.gate(ctx, &cr)
	s.payOverHTTP(ctx, &cr)
	cr.Notify = s.notifier(ctx)
	if _, isHTTP := ctx.Value(keyHTTPWriter).(*rewriteWriter); isHTTP {
		return cr, s.readL402(&cr, h)
	}
	return cr, nil
}

// readCreditHeader takes a credit token from the HeaderCredit request
// header when _meta named none.
func readCreditHeader(cr *vend.CallRequest, h http.Header) {
	if tok := h.Get(vend.HeaderCredit); tok != "" && cr.Credit == "" {
		cr.Credit = tok
	}
}

// creditHeader sets the HeaderCredit response header to the balance (msat)
// an answer reports (_meta[vend.MetaCredit], or a credit-exhausted error)
// on MCP HTTP, if the response has not started (a call that streamed
// notifications reports it in _meta only).
func creditHeader(ctx context.Context, res vend.CallResult, err error) {
	rw, _ := ctx.Value(keyHTTPWriter).(*rewriteWriter)
	if rw == nil {
		return
	}
	var bal int64 = -1
	if ce, ok := errors.AsType[*vend.CreditExhaustedError](err); ok {
		bal = int64(ce.Balance)
	} else if err == nil && bytes.Contains(res.Body, []byte(vend.MetaCredit)) {
		var b struct {
			Meta map[string]vend.CreditInfo `json:"_meta"`
		}
		if json.Unmarshal(res.Body, &b) == nil {
			if info, ok := b.Meta[vend.MetaCredit]; ok {
				bal = info.BalanceMsat
			}
		}
	}
	if bal < 0 {
		return
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.wroteHeader {
		rw.w.Header().Set(vend.HeaderCredit, strconv.FormatInt(bal, 10))
	}
}

// priced returns the listed price of a prompt or resource, 0 when the
// Vendor sells none.
func (s *Server) priced(kind vend.ItemKind, name string) (lo, hi vend.Msat) {
	if ip, ok := s.cfg.Vendor.(ItemPricer); ok {
		return ip.ItemPrice(kind, name)
	}
	return 0, 0
}

// answer turns the Vendor's outcome of cr into the handler's return.
func (s *Server) answer(ctx context.Context, cr vend.CallRequest, res vend.CallResult, err error) (*mcp.CallToolResult, error) {
	creditHeader(ctx, res, err)
	paidHeaders(ctx, &cr, err)
	if set, ok := x402Settlement(&cr, err); ok {
		res.Body = withX402Response(res.Body, set)
	}
	if s.answerHTTP(ctx, &cr, err) {
		return answeredOverHTTP, nil
	}
	if res := s.gatingResult(&cr, err); res != nil {
		s.log.Debug("tool call answered: payment required", logKeyTool, cr.Name, logKeyTransport, cr.Transport, logKeyErr, err)
		return res, nil
	}
	if err != nil {
		s.logCallError(ctx, cr, err)
		return nil, s.markError(err, cr.Name)
	}
	if !json.Valid(res.Body) {
		s.log.Error("vendor returned an invalid result body", logKeyTool, cr.Name)
		return nil, s.markError(fmt.Errorf("invalid result body"), cr.Name)
	}
	return s.placeholder(res.Body, res.IsError), nil
}

// notifier returns the Notify function of a call: it writes the
// notification on the call's own stream (stdio: the output; HTTP: the
// POST's response, upgraded to SSE, and mcp-go's session told to finish
// as SSE), before the call's result. mcp-go's SendNotificationToClient is
// not used: in v1.2.1 it drops a "_meta" member of params, its POST
// forwarder can drop a notification queued just before the handler
// returns (seen in tests), and before protocol 2026-07-28 a session's GET
// and POST streams read the same queue, so a notification may go out on
// either.
func (s *Server) notifier(ctx context.Context) func(method string, params any) {
	encode := s.encodeNotification
	if w, ok := ctx.Value(keyStdioOut).(*lineWriter); ok {
		return func(method string, params any) {
			if msg := encode(method, params); msg != nil {
				_, _ = w.Write(append(msg, '\n'))
			}
		}
	}
	rw, _ := ctx.Value(keyHTTPWriter).(*rewriteWriter)
	sess, _ := server.ClientSessionFromContext(ctx).(server.SessionWithStreamableHTTPConfig)
	return func(method string, params any) {
		if rw == nil || sess == nil {
			return
		}
		msg := encode(method, params)
		if msg == nil {
			return
		}
		// mcp-go must end this response as SSE too.
		sess.UpgradeToSSEWhenReceiveNotification()
		if !rw.notify(msg) {
			s.log.Debug("notification not sent: response finished", logKeyMethod, method)
		}
	}
}

// encodeNotification is a JSON-RPC notification of method with params;
// nil (and a warning) if params cannot be encoded.
func (s *Server) encodeNotification(method string, params any) []byte {
	msg, err := json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params,omitempty"`
	}{mcp.JSONRPC_VERSION, method, params})
	if err != nil {
		s.log.Warn("notification not encodable", logKeyMethod, method, logKeyErr, err)
		return nil
	}
	return msg
}

// logCallError logs a call answered with err, and returns err on the
// wire: at the level its code calls for, at info when the client hung up.
func (s *Server) logCallError(ctx context.Context, cr vend.CallRequest, err error) wireError {
	w := toWire(err, cr.Name)
	lvl := rpcerr.LogLevel(w.Code)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		lvl = slog.LevelInfo // the client hung up: nothing went wrong here
	}
	s.log.Log(ctx, lvl, "tool call answered with an error", logKeyTool, cr.Name, logKeyTransport, cr.Transport, logKeyCode, w.Code, logKeyErr, err)
	return w
}
