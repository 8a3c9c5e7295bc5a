package mcpfront

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/capvend/capvend/internal/nut18"
	"github.com/capvend/capvend/vend"
)

// Cashu NUT-24 over Streamable HTTP: HTTP 402 with X-Cashu.
//
// An unpaid priced tools/call that wants HTTP 402 answers (http402.go's
// wants402: Config.HTTP402, an Accept header naming L402 or "cashu" -- a
// media range "cashu", "application/cashu" or any "*/cashu", next to the
// media types MCP requires -- or a request presenting X-Cashu or an L402
// credential) gets HTTP 402 with every challenge that applies. A repeat
// finding its call's invoice still unpaid gets the 402 again (vend
// answers such an L402 request payment-required, not pending), so it can
// still pay with Cashu. challengeCashu adds, with Config.CashuMints:
//
//	X-Cashu: creqA...
//
// a NUT-18 payment request (internal/nut18): amount the price in sats
// (rounded up), unit "sat", the mints, single use, a random id, a
// description, no transport (the payment comes in-band).
//
// The client pays by repeating the same HTTP request with
//
//	X-Cashu: cashuB... (or cashuA...)
//
// which becomes the call's vend.CallRequest.CashuToken (a token in
// _meta["capvend/cashu"] wins over the header): vend takes it through its
// Cashu backend (mint, unit, amount and the mint's input fees, spent or
// not, all checked before the proofs are swapped) and runs the call once.
// The retry may repeat the JSON-RPC id of the request that got the 402:
// the request id a call is recorded under gets "#x-cashu:" and a hash of
// the token appended, so that a retry with a token is a new call rather
// than a replay of the unpaid one, and a retry of that retry (the same
// token, the same session) replays the paid call instead of paying twice
// (a client without a session is Anonymous: its repeat is a new call, and
// the spent token is refused).
//
// A token vend refuses (wrong mint, unit other than sat, less than the
// price plus the mint's input fees, spent or received before, malformed or
// locked, or a server without a Cashu backend) is answered by answerHTTP
// with HTTP 400 and the JSON-RPC error -32051 "Payment failed: <reason>"
// (-32052 when the server takes no tokens); nothing was swapped, the
// proofs are still the client's, nothing ran. A mint that could not be
// reached is answered as before, 200 (the same token may be sent again).
//
// A token worth more than the price (plus fees) pays the call; what is
// left over is split off at the mint and handed back, as vend does on
// every front: a cashuB token in _meta.change of the
// notifications/payment_accepted the response streams (as SSE) before
// the result. It is the client's, never booked as income.
//
// A priced prompts/get or resources/read takes an X-Cashu token too, but
// http402.go answers only tools/call: there a refusal is the JSON-RPC
// error, status 200, and an unpaid one gets no 402.
//
// Like every answerHTTP status, it is set only while the response has not
// started: an answer that already streamed notifications (SSE) stays 200.

// HeaderCashu is NUT-24's header: a payment request on a 402, a token on
// the retry.
const HeaderCashu = "X-Cashu"

// xcashuSuffix marks the request id of a call paid through X-Cashu.
const xcashuSuffix = "#x-cashu:"

// acceptsCashu reports whether the Accept header of h names cashu: a media
// range "cashu" or "<anything>/cashu".
func acceptsCashu(h http.Header) bool {
	for _, v := range h.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, ok := bareMediaType(part)
			if !ok {
				var err error
				if mt, _, err = mime.ParseMediaType(strings.TrimSpace(part)); err != nil {
					mt = strings.ToLower(strings.TrimSpace(part))
				}
			}
			if mt == "cashu" || strings.HasSuffix(mt, "/cashu") {
				return true
			}
		}
	}
	return false
}

// payOverHTTP hands the X-Cashu token of cr's HTTP request, if any, to
// the Vendor as the call's Cashu token (a token in _meta wins), under a
// request id of its own (see above). Whether the request wants 402
// answers is readL402's (wants402), for tools/call.
func (s *Server) payOverHTTP(ctx context.Context, cr *vend.CallRequest) {
	rw, _ := ctx.Value(keyHTTPWriter).(*rewriteWriter)
	if rw == nil || rw.xcashu == "" || cr.CashuToken != "" {
		return
	}
	cr.CashuToken = rw.xcashu
	sum := sha256.Sum256([]byte(rw.xcashu))
	cr.RequestID += xcashuSuffix + hex.EncodeToString(sum[:8])
}

// refusedXCashu reports whether err refuses the X-Cashu token that cr
// paid with (NUT-24's 400), as answerHTTP writes it.
func refusedXCashu(ctx context.Context, cr *vend.CallRequest, err error) bool {
	rw, _ := ctx.Value(keyHTTPWriter).(*rewriteWriter)
	return rw != nil && rw.xcashu != "" && cr.CashuToken == rw.xcashu && tokenRefused(err)
}

// tokenRefused reports whether err refuses a Cashu token for what it is
// (NUT-24's 400): not for a mint that could not be reached.
func tokenRefused(err error) bool {
	if errors.Is(err, vend.ErrNoPaymentMethod) {
		return true
	}
	if !errors.Is(err, vend.ErrPaymentFailed) || errors.Is(err, vend.ErrMintUnavailable) {
		return false
	}
	return errors.Is(err, vend.ErrForeignMint) || errors.Is(err, vend.ErrBadToken) ||
		errors.Is(err, vend.ErrUnderpaid) || errors.Is(err, vend.ErrProofSpent)
}

// challengeCashu adds X-Cashu, the NUT-18 request of e (see above), to
// the headers h of the 402 answering a payment required for cr, and
// reports whether it did: not without Config.CashuMints (or an amount).
// It is one of http402.go's challengers.
func challengeCashu(s *Server, h http.Header, cr *vend.CallRequest, e *vend.PaymentRequiredError) bool {
	if len(s.cfg.CashuMints) == 0 {
		return false
	}
	sats := e.Amount.SatsCeil()
	for _, o := range e.Options { // a Vendor that gave only options
		if sats == 0 {
			sats = o.Amount
		}
	}
	if sats <= 0 {
		return false
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	what, _, _ := itemWhat(cr)
	creq, err := nut18.Encode(nut18.Request{
		ID: hex.EncodeToString(id[:]), Amount: uint64(sats), Unit: "sat", SingleUse: true,
		Mints:       s.cfg.CashuMints,
		Description: fmt.Sprintf("%d sats (plus the mint's input fees) to %s", sats, what),
	})
	if err != nil { // an empty mint URL: Validate refuses it first
		s.log.Warn("no X-Cashu payment request", logKeyTool, cr.Name, logKeyErr, err)
		return false
	}
	h.Set(HeaderCashu, creq)
	return true
}

// bareMediaType returns part of an Accept header, trimmed, if it is a
// bare "type/subtype" of lower-case token characters: then it is what
// mime.ParseMediaType returns for it, with no parameters, and the
// parser (which allocates) is not needed. false: use the parser.
func bareMediaType(part string) (string, bool) {
	part = strings.TrimSpace(part)
	slash := strings.IndexByte(part, '/')
	if slash <= 0 || slash == len(part)-1 {
		return "", false
	}
	for i := 0; i < len(part); i++ {
		c := part[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '+', c == '.':
		case c == '/' && i == slash:
		default:
			return "", false
		}
	}
	return part, true
}
