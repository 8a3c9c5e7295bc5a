package mcpfront

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"rsc.io/qr"

	"github.com/capvend/capvend/vend"
)

// The pay page: GET /pay/{token} on the HTTP listener (PayPagePath). A
// person pays a call there: its tool, the amount, a QR code of the
// invoice (rendered here, inline SVG: no CDN, no build step), a
// lightning: link, the expiry, and a live status that turns to "paid: go
// back to your chat" when the payment settles: server-sent events from
// GET /pay/{token}/events, and without JavaScript a meta refresh.
//
// The token is vend's view-only page token (vend/paypage.go), never the
// payment token: a URL ends up in history, logs and Referers, and the
// page token releases nothing. The page shows nothing that releases the
// call (no payment token, macaroon, challenge id or preimage), is not
// cached, sends no Referer and may not be framed.
//
// The explicit-gating tool result links to it (pay_url), and a client
// that declared URL-mode elicitation (MCP 2025-11-25) is sent
// elicitation/create (mode "url") pointing at it while its call waits for
// the payment: the answer comes once it is paid, with no retry. On
// protocol 2026-07-28 the same ask is an input_required result, and the
// client's retry waits for the payment (askPayPage).

// PayPagePath is where the HTTP listener serves pay pages.
const PayPagePath = "/pay/"

// PayPager is a Vendor that shows pay pages (*vend.Vendor).
type PayPager interface {
	// PayPage returns what the page of token shows now, or an error
	// matching vend.ErrPayPageUnknown.
	PayPage(ctx context.Context, token string) (vend.PayPage, error)
}

// payURL is the pay page URL of token, "" when the front has no public
// base URL (Config.PayBaseURL) or token is empty.
func (s *Server) payURL(token string) string {
	if s.cfg.PayBaseURL == "" || token == "" {
		return ""
	}
	return strings.TrimRight(s.cfg.PayBaseURL, "/") + PayPagePath + token
}

// PayPage returns the handler of PayPagePath: the page, and its events.
// GET and HEAD only. Like the discovery document it passes no bearer
// token check: whoever has the link may pay.
func (s *Server) PayPage() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		pp, ok := s.cfg.Vendor.(PayPager)
		rest := strings.TrimPrefix(r.URL.Path, PayPagePath)
		token, events := strings.CutSuffix(rest, "/events")
		if !ok || token == "" || strings.Contains(token, "/") {
			http.NotFound(w, r)
			return
		}
		page, err := pp.PayPage(r.Context(), token)
		if errors.Is(err, vend.ErrPayPageUnknown) {
			http.NotFound(w, r)
			return
		}
		if err != nil {
			s.log.Error("pay page", logKeyErr, err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Content-Type-Options", "nosniff")
		if events {
			s.payEvents(w, r, pp, token, page)
			return
		}
		nonce := randomNonce()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "+
			"script-src 'nonce-"+nonce+"'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Type", "text/html; charset=utf-8")
		if err := payTemplate.Execute(w, payView(page, nonce)); err != nil {
			s.log.Warn("pay page not written", logKeyErr, err)
		}
	})
}

// payEvents streams the page's status as server-sent events ("status":
// open, paid, expired, canceled, or owed: paid for a canceled call) until
// it is no longer open, or the browser leaves. It reads the ledger once a second: the page waits on nothing
// the call itself waits on.
func (s *Server) payEvents(w http.ResponseWriter, r *http.Request, pp PayPager, token string, page vend.PayPage) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	last, quiet := "", 0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	bound := time.NewTimer(time.Until(page.ExpiresAt) + time.Minute)
	defer bound.Stop()
	for {
		st := payStatus(page)
		if st != last || quiet >= 15 {
			// Each write gets its own deadline (the listener's write
			// timeout is per write); a comment keeps quiet streams open.
			_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			msg := ": waiting\n\n"
			if st != last {
				msg = "event: status\ndata: " + st + "\n\n"
			}
			if _, err := io.WriteString(w, msg); err != nil {
				return
			}
			fl.Flush()
			last, quiet = st, 0
		}
		quiet++
		if st != "open" {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-bound.C:
			return
		case <-tick.C:
		}
		cur, err := pp.PayPage(r.Context(), token)
		if err != nil {
			return
		}
		page = cur
	}
}

func payStatus(p vend.PayPage) string {
	switch {
	case p.Canceled && p.Paid:
		return "owed"
	case p.Canceled:
		return "canceled"
	case p.Paid:
		return "paid"
	case p.Expired:
		return "expired"
	}
	return "open"
}

// payPageView is what the template shows.
type payPageView struct {
	vend.PayPage
	Sats    int64
	Status  string
	Expires string // RFC 3339, UTC
	QR      template.HTML
	Link    template.URL
	Nonce   string
}

func payView(p vend.PayPage, nonce string) payPageView {
	v := payPageView{PayPage: p, Sats: p.Amount.SatsCeil(), Status: payStatus(p), Expires: p.ExpiresAt.UTC().Format(time.RFC3339),
		Nonce: nonce, Link: template.URL("lightning:" + p.Invoice)}
	v.QR = qrSVG(p.Invoice)
	return v
}

// qrSVG renders text as a QR code (level M), inline SVG with a quiet zone
// of four modules; "" if it does not fit.
func qrSVG(text string) template.HTML {
	c, err := qr.Encode(text, qr.M)
	if err != nil {
		return ""
	}
	const quiet = 4
	n := c.Size + 2*quiet
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="qr" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" shape-rendering="crispEdges" role="img" aria-label="QR code of the invoice">`,
		n, n, n*6, n*6)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/><path fill="#000" d="`, n, n)
	for y := 0; y < c.Size; y++ {
		for x := 0; x < c.Size; x++ {
			if c.Black(x, y) {
				fmt.Fprintf(&b, "M%d %dh1v1h-1z", x+quiet, y+quiet)
			}
		}
	}
	b.WriteString(`"/></svg>`)
	return template.HTML(b.String())
}

func randomNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawStdEncoding.EncodeToString(b[:])
}

var payTemplate = template.Must(template.New("pay").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
{{if eq .Status "open"}}<noscript><meta http-equiv="refresh" content="5"></noscript>{{end}}
<title>Pay {{.Sats}} sats: {{.Tool}}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:34rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}
#qr{display:block;margin:1rem 0;max-width:100%;height:auto}
code{display:block;word-break:break-all;font-size:.8rem;background:#f4f4f4;padding:.5rem}
#status{font-weight:bold;padding:.6rem;border-radius:.3rem;background:#fff4d6}
#status.paid{background:#d9f7d9}#status.expired,#status.canceled,#status.owed{background:#f7d9d9}
a.pay{display:inline-block;padding:.6rem 1rem;background:#f7931a;color:#fff;text-decoration:none;border-radius:.3rem}
</style>
</head>
<body>
<h1>Pay {{.Sats}} sats to call {{.Tool}}</h1>
{{with .Description}}<p id="what">{{.}}</p>{{end}}
<p id="status" class="{{.Status}}">{{if eq .Status "paid"}}paid: go back to your chat{{else if eq .Status "expired"}}expired: ask for the call again{{else if eq .Status "canceled"}}{{template "canceled"}}{{else if eq .Status "owed"}}{{template "owed"}}{{else}}waiting for payment{{end}}</p>
{{if eq .Status "open"}}
<div id="qrbox">{{.QR}}</div>
<p><a class="pay" id="link" href="{{.Link}}">Open in your wallet</a></p>
<p>Or copy the invoice:</p>
<code id="invoice">{{.Invoice}}</code>
<p>It expires at <time id="expires" datetime="{{.Expires}}">{{.Expires}}</time>.</p>
{{end}}
<script nonce="{{.Nonce}}">
(function () {
  var st = document.getElementById("status");
  if (!window.EventSource || st.className !== "open") return;
  var es = new EventSource(location.pathname.replace(/\/$/, "") + "/events");
  es.addEventListener("status", function (e) {
    if (e.data === "open") return;
    st.className = e.data;
    st.textContent = {paid: "paid: go back to your chat", canceled: "{{template "canceled"}}", owed: "{{template "owed"}}"}[e.data] || "expired: ask for the call again";
    ["qrbox", "link", "invoice"].forEach(function (id) { var el = document.getElementById(id); if (el) el.style.opacity = "0.3"; });
    es.close();
  });
})();
</script>
</body>
</html>
{{define "canceled"}}this call was canceled: do not pay, ask for the call again{{end}}
{{define "owed"}}paid, but this call was canceled: it never runs, and what you paid is owed back (ask the seller){{end}}
`))

// clientCanElicitURL reports whether the client of ctx declared URL-mode
// elicitation: per request from protocol 2026-07-28 (the request's _meta
// capabilities; it is then asked with an input_required result, see
// askPayPage), per session before.
func clientCanElicitURL(ctx context.Context) bool {
	if info := server.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		c := info.ClientCapabilities
		return c != nil && c.Elicitation != nil && c.Elicitation.URL != nil
	}
	sess, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo)
	if !ok {
		return false
	}
	el := sess.GetClientCapabilities().Elicitation
	return el != nil && el.URL != nil
}

// urlElicit is a call paid through URL-mode elicitation: the id of the
// elicitation sent, once it is.
type urlElicit struct {
	id chan string // buffered 1: the id, once sent
}

// elicitPayPage returns the vend.CallRequest.PayPage of a call whose
// client declared URL-mode elicitation: it sends elicitation/create
// (mode "url") with the pay page, from a goroutine of its own (vend must
// not wait), and cancels the call (cancel) if the person declines. The
// call's answer is its result once paid.
func (s *Server) elicitPayPage(ctx context.Context, cr *vend.CallRequest, cancel context.CancelFunc, ue *urlElicit) func(string) {
	tool := cr.Name
	return func(token string) {
		url := s.payURL(token)
		sess := server.ClientSessionFromContext(ctx)
		if url == "" || sess == nil {
			return
		}
		id := "capvend-pay-" + randomNonce()
		select {
		case ue.id <- id:
		default:
			return // asked already (a repeat of the same wait)
		}
		go func() {
			res, err := s.mcp.RequestURLElicitation(ctx, sess, id, url, fmt.Sprintf("Pay for %s: open the page, pay the invoice, and the answer follows.", tool))
			switch {
			case err != nil:
				s.log.Info("pay page elicitation not answered", logKeyTool, tool, logKeyErr, err)
			case res.Action != mcp.ElicitationResponseActionAccept:
				s.log.Info("pay page declined: the call ends unpaid", logKeyTool, tool, "action", res.Action)
				cancel()
			}
		}()
	}
}

// elicitComplete sends notifications/elicitation/complete for the
// elicitation of ue, if one was sent, on the call's own stream.
func (s *Server) elicitComplete(ctx context.Context, ue *urlElicit) {
	select {
	case id := <-ue.id:
		params, _ := json.Marshal(map[string]string{"elicitationId": id})
		s.notifier(ctx)(string(mcp.MethodNotificationElicitationComplete), json.RawMessage(params))
	default:
	}
}

// askPayPage returns the vend.CallRequest.PayPage of c, a call of a client
// on protocol 2026-07-28 that declared URL-mode elicitation: there are no
// server-initiated requests, so it hands c an ask of its own, an
// elicitation/create (mode "url") of the pay page, which await parks and
// returns as an input_required result (as it does an upstream's). The
// client's retry (same tool and canonical arguments, the requestState,
// inputResponses) answers it and waits for the call's result: "accept"
// leaves the call waiting for its payment; "decline" or "cancel" cancels
// it unpaid, as does the ask's expiry with the invoice (the page then says
// "expired"), which frees its slot. It asks once per call, from a
// goroutine of its own (vend must not wait), which ends with the call.
//
// The requestState is no credential in vend's sense (vend.Schemes): the
// call is released by its invoice being paid (vend.SchemeInvoice, on the
// Vendor call that has waited since the first round, recorded for that
// request's transport and client), whether or not a retry comes. What
// the requestState gives is that call's answer, and the power to end it
// unpaid; so resume gives it only to the client it was handed to (its
// MCP client and, an anonymous one, its Source): see resume.
func (s *Server) askPayPage(ctx context.Context, c *vcall) func(string) {
	var asked atomic.Bool
	tool := c.cr.Name
	return func(token string) {
		url := s.payURL(token)
		if url == "" || !asked.CompareAndSwap(false, true) {
			return
		}
		go func() {
			var until time.Time
			if pp, ok := s.cfg.Vendor.(PayPager); ok {
				if page, err := pp.PayPage(ctx, token); err == nil {
					until = page.ExpiresAt
				}
			}
			params, err := json.Marshal(mcp.ElicitationParams{Mode: mcp.ElicitationModeURL, ElicitationID: "capvend-pay-" + randomNonce(),
				URL: url, Message: fmt.Sprintf("Pay for %s: open the page, pay the invoice, and the answer follows.", tool)})
			if err != nil {
				return
			}
			ans, err := c.elicitUntil(ctx, params, until)
			if err != nil {
				return // the call ended
			}
			var r mcp.ElicitationResponse
			if json.Unmarshal(ans, &r) != nil || r.Action != mcp.ElicitationResponseActionAccept {
				s.log.Info("pay page declined or not answered: the call ends unpaid", logKeyTool, tool, "action", r.Action)
				c.cancel()
			}
		}()
	}
}
