package mcpfront

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strings"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// HTTP 402 on MCP Streamable HTTP (docs/PAYING.md's "Paying from any
// HTTP client" says it for users).
//
// When: an unpaid priced tools/call (or prompts/get, resources/read: see
// sell) over HTTP is answered with HTTP 402 Payment Required, instead of
// the explicit-gating tool result, when the request's Accept header
// names L402 (a media range or parameter
// containing "l402" or "lsat", case-insensitive, e.g.
// "application/json, text/event-stream, application/vnd.l402"), or always
// with Config.HTTP402 (payments.http_402: true), for HTTP clients whose
// L402 support sends no such Accept (@getalby/lightning-tools'
// fetchWithL402 does not). An Accept naming cashu asks too (xcashu.go),
// and a request that presents a credential (Authorization: L402/LSAT)
// or an X-Cashu token is one that wants them. Only when at least one
// challenge header can be written (a challenger below adds one: L402's,
// and X-Cashu with Config.CashuMints) and nothing of the response was
// written yet (no notification upgraded it to SSE); otherwise the tool
// result answers, as before.
//
// What: status 402, the challenge headers, and a JSON-RPC error response
// to the request (same id): code 402 "Payment Required", data the
// structuredContent a tool result would carry (amount, invoice,
// payment token, how to retry) plus its text.
//
// A credential that does not release the call (ErrL402Invalid: not
// capvend's, malformed, expired, revoked, the wrong preimage, another
// call's; ErrTokenMismatch, ErrTokenUsed, ErrTokenExpired) is answered
// 401 Unauthorized with the JSON-RPC error saying why, and no challenge:
// an automatic L402 client must not pay again for a refused credential.

// challenger adds its payment scheme's challenge to the headers h of the
// 402 answering e (a payment required for cr) and reports whether it
// added one. Challengers run in order (challengers); a scheme is added by
// appending one (Cashu NUT-24's X-Cashu, xcashu.go, is the second).
type challenger func(s *Server, h http.Header, cr *vend.CallRequest, e *vend.PaymentRequiredError) bool

// challengers are the HTTP 402 challenges capvend can write, by the
// names Config.HTTP402Schemes lists them in.
var challengers = map[string]challenger{
	SchemeL402: challengeL402, SchemeMPP: challengeMPP, SchemeX402: challengeX402, SchemeCashu: challengeCashu,
}

// Names of the HTTP 402 challenges (Config.HTTP402Schemes).
const (
	SchemeL402  = "l402"  // WWW-Authenticate: L402 (and LSAT)
	SchemeMPP   = "mpp"   // WWW-Authenticate: Payment (draft-lightning-charge-00)
	SchemeX402  = "x402"  // PAYMENT-REQUIRED (x402 v2, exact on Lightning)
	SchemeCashu = "cashu" // X-Cashu (NUT-24)
)

// DefaultHTTP402Schemes is the order of the challenges of a 402 when
// Config.HTTP402Schemes is empty: L402's first (its clients read the
// first WWW-Authenticate), no MPP challenge (fetchWithMpp reads only a
// WWW-Authenticate that starts with Payment: list "mpp" first for it).
var DefaultHTTP402Schemes = []string{SchemeL402, SchemeX402, SchemeCashu}

// schemes402 is the order of the challenges this server writes.
func (s *Server) schemes402() []string {
	if len(s.cfg.HTTP402Schemes) > 0 {
		return s.cfg.HTTP402Schemes
	}
	return DefaultHTTP402Schemes
}

// challengeL402 writes the L402 challenges (bLIP-0026) of e's macaroon and
// invoice: the current form, Aperture's (macaroon=), that of
// @getalby/lightning-tools' newer servers (token=), and the legacy LSAT
// scheme, in that order (clients take the first they understand).
func challengeL402(_ *Server, h http.Header, _ *vend.CallRequest, e *vend.PaymentRequiredError) bool {
	if e.Macaroon == nil || e.Invoice == "" {
		return false
	}
	mac := base64.StdEncoding.EncodeToString(e.Macaroon)
	h.Add("WWW-Authenticate", `L402 macaroon="`+mac+`", invoice="`+e.Invoice+`"`)
	h.Add("WWW-Authenticate", `L402 token="`+mac+`", invoice="`+e.Invoice+`"`)
	h.Add("WWW-Authenticate", `LSAT macaroon="`+mac+`", invoice="`+e.Invoice+`"`)
	return true
}

// wants402 reports whether an HTTP request with headers h is answered
// with HTTP 402 when it must pay (see above).
func (s *Server) wants402(h http.Header) bool {
	if s.cfg.HTTP402 || acceptsCashu(h) || strings.TrimSpace(h.Get(HeaderCashu)) != "" || strings.TrimSpace(h.Get(HeaderX402Payment)) != "" {
		return true
	}
	if strings.TrimSpace(h.Get("Authorization")) != "" {
		if scheme, _, _ := strings.Cut(strings.TrimSpace(h.Get("Authorization")), " "); isL402Scheme(scheme) || isMPPScheme(scheme) {
			return true
		}
	}
	for _, v := range h.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, ok := bareMediaType(part); ok {
				if namesL402(mt) {
					return true
				}
				continue
			}
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			if namesL402(mt) {
				return true
			}
			for k, pv := range params {
				if namesL402(k) || namesL402(pv) {
					return true
				}
			}
		}
	}
	return false
}

func namesL402(s string) bool {
	s = strings.ToLower(s)
	return strings.Contains(s, "l402") || strings.Contains(s, "lsat")
}

func isL402Scheme(s string) bool { return strings.EqualFold(s, "L402") || strings.EqualFold(s, "LSAT") }

// errBadCredential: an Authorization header of scheme L402 or LSAT that is
// not "<base64 macaroon>:<hex preimage>".
var errBadCredential = errors.New("malformed L402 credential: want Authorization: L402 <base64 macaroon>:<hex preimage>")

// l402Credential reads an L402 credential from h: the first Authorization
// value of scheme L402 or LSAT, "<macaroon>:<preimage>" (base64, standard
// or URL alphabet, padded or not; 64 hex digits). ok=false if there is
// none; err if there is one that is malformed.
func l402Credential(h http.Header) (mac []byte, preimage string, ok bool, err error) {
	for _, v := range h.Values("Authorization") {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		if !isL402Scheme(scheme) {
			continue
		}
		m, pre, found := strings.Cut(strings.TrimSpace(rest), ":")
		if !found {
			return nil, "", true, errBadCredential
		}
		if b, err := hex.DecodeString(pre); err != nil || len(b) != 32 {
			return nil, "", true, errBadCredential
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			if mac, err = enc.DecodeString(m); err == nil && len(mac) > 0 {
				return mac, pre, true, nil
			}
		}
		return nil, "", true, errBadCredential
	}
	return nil, "", false, nil
}

// readL402 fills cr for an HTTP request with headers h: L402 asked for
// when the request wants 402 answers, and the credential it presents. A
// malformed credential is an error the caller answers (401).
func (s *Server) readL402(cr *vend.CallRequest, h http.Header) error {
	if !s.wants402(h) {
		return nil
	}
	cr.L402 = true
	mac, pre, ok, err := l402Credential(h)
	if err != nil {
		return err
	}
	if ok {
		cr.Macaroon, cr.PaymentProof = mac, pre
	}
	return readPaymentHeaders(cr, h)
}

// answerHTTP writes the HTTP answer of an L402 request's outcome, if it
// has one: 402 with the challenges for a payment required, 401 for a
// refused credential, 400 for a refused X-Cashu token (xcashu.go). It
// reports whether it wrote it; then mcp-go's own response to the request
// is dropped (rewriteWriter.replace).
func (s *Server) answerHTTP(ctx context.Context, cr *vend.CallRequest, err error) bool {
	rw, ok := ctx.Value(keyHTTPWriter).(*rewriteWriter)
	if !ok || !cr.L402 || err == nil {
		return false
	}
	h := http.Header{}
	var status int
	var w wireError
	if pr, isReq := errors.AsType[*vend.PaymentRequiredError](err); isReq {
		added := false
		for _, name := range s.schemes402() {
			if c := challengers[name]; c != nil {
				added = c(s, h, cr, pr) || added
			}
		}
		if !added {
			return false
		}
		// A challenge names a single-use invoice: never cached
		// (draft-lightning-charge-00 asks it of every 402).
		h.Set("Cache-Control", "no-store")
		status = http.StatusPaymentRequired
		if w, ok = s.gatingError(cr, err); !ok {
			w = rpcerr.FromVend(err, cr.Name)
		}
	} else if errors.Is(err, errBadCredential) || errors.Is(err, errBadPayment) {
		status = http.StatusUnauthorized
		w = wireError{Code: rpcerr.CodeInvalidRequest, Message: "Invalid Request: " + err.Error()}
	} else if refusedCredential(err) {
		status = http.StatusUnauthorized
		w = toWire(err, cr.Name)
	} else if refusedXCashu(ctx, cr, err) {
		status = http.StatusBadRequest // NUT-24: the token is refused
		w = toWire(err, cr.Name)
	} else {
		return false
	}
	rid, _, _ := strings.Cut(cr.RequestID, xcashuSuffix) // the request's own id (payOverHTTP)
	id := json.RawMessage(rid)
	if !json.Valid(id) {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(w)
	if !rw.replace(status, h, append(envelope(id, "error", b), '\n')) {
		return false
	}
	s.log.Info("tool call answered over HTTP", logKeyTool, cr.Name, "status", status, logKeyCode, w.Code)
	return true
}

// refusedCredential reports whether err refuses an L402, MPP or x402
// credential.
func refusedCredential(err error) bool {
	return errors.Is(err, vend.ErrL402Invalid) || errors.Is(err, vend.ErrMPPInvalid) || errors.Is(err, vend.ErrX402Invalid) || errors.Is(err, vend.ErrTokenMismatch) ||
		errors.Is(err, vend.ErrTokenUsed) || errors.Is(err, vend.ErrTokenExpired) || errors.Is(err, vend.ErrTokenCanceled)
}

// replace writes status, the headers h and body as the whole response, if
// nothing was written yet, and drops every later write of mcp-go's (its
// own answer to the request). It reports whether it wrote.
func (rw *rewriteWriter) replace(status int, h http.Header, body []byte) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.wroteHeader || rw.finished || rw.replaced {
		return false
	}
	dst := rw.w.Header()
	for k, vs := range h {
		dst[k] = vs
	}
	dst.Set("Content-Type", "application/json")
	rw.extend()
	rw.pending = 0
	rw.wroteHeader, rw.replaced = true, true
	rw.w.WriteHeader(status)
	_, _ = rw.w.Write(body)
	return true
}
