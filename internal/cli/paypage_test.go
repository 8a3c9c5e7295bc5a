package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	_ "image/png" // chromium's screenshots
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/makiuchi-d/gozxing"
	gozxingqr "github.com/makiuchi-d/gozxing/qrcode"

	"github.com/capvend/capvend/internal/capvendtest"
)

// stockGatedCall is a client that declared nothing (a stock MCP host)
// calling tool: it returns the explicit-gating answer's structuredContent.
func stockGatedCall(t *testing.T, url, tool, args string) map[string]any {
	t.Helper()
	all := func(json.RawMessage) bool { return true }
	sid := capvendtest.MCPPost(t, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"stock","version":"1"}}}`, all)
	capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, all)
	var res struct {
		Result struct {
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	var msg json.RawMessage // the answer's last message
	capvendtest.MCPPost(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+tool+`","arguments":`+args+`}}`,
		func(m json.RawMessage) bool { msg = m; return true })
	if err := json.Unmarshal(msg, &res); err != nil || res.Result.StructuredContent["pay_url"] == nil {
		t.Fatalf("explicit-gating answer: %s (%v)", msg, err)
	}
	return res.Result.StructuredContent
}

// TestPayPageInChromium (issue 29): the pay page an explicit-gating
// answer links, in Debian's chromium (headless): a screenshot, the QR
// code read back from it by a QR reader (gozxing) equals the invoice, and
// after the customer's LND pays it the status turns to "paid: go back to
// your chat" by itself (server-sent events). The page shows neither the
// payment token nor, once paid, the preimage.
func TestPayPageInChromium(t *testing.T) {
	s := needStack(t)
	pg := browser(t, nil)
	ctx := pg.ctx
	path, _ := writeServeConfig(t, s, serveOpts{})
	url := startCapvend(t, path).URL()
	sc := stockGatedCall(t, url, "t_sha256", `{"text":"pay page"}`)
	payURL, invoice, token := sc["pay_url"].(string), sc["invoice"].(string), sc["capvend_payment"].(string)
	if !strings.Contains(payURL, "/pay/cvv_") || invoice == "" || token == "" || strings.Contains(payURL, token) {
		t.Fatalf("answer %v", sc)
	}
	shots := t.TempDir()
	if d := os.Getenv("CAPVEND_SCREENSHOTS"); d != "" {
		shots = d
	}
	nav, stop := context.WithTimeout(ctx, time.Minute) // a hang guard
	err := chromedp.Run(nav, chromedp.Navigate(payURL), chromedp.WaitVisible("#qrbox"))
	stop()
	if err != nil {
		t.Fatal(err)
	}
	pg.screenshot(shots, "pay-page")
	// The QR code is read from a screenshot of its element as a pure
	// barcode: gozxing's finder-pattern detector, given the whole page,
	// misses about 2 % of valid codes (even ones drawn pixel-exact with no
	// page around them, whatever their mask), and the invoice is new on
	// every run.
	var shot []byte
	if err := chromedp.Run(ctx, chromedp.Screenshot("#qr", &shot, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	img, _, err := image.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	bmp, err := gozxing.NewBinaryBitmapFromImage(img)
	if err != nil {
		t.Fatal(err)
	}
	pure := map[gozxing.DecodeHintType]any{gozxing.DecodeHintType_PURE_BARCODE: true}
	read, err := gozxingqr.NewQRCodeReader().Decode(bmp, pure)
	if err != nil {
		t.Fatalf("no QR code read from the screenshot of #qr: %v", err)
	}
	if read.GetText() != invoice {
		t.Fatalf("the QR code says %q, the invoice is %q", read.GetText(), invoice)
	}
	var shown string
	pg.js(`document.getElementById("status").textContent + " | " + document.getElementById("invoice").textContent + " | " + document.getElementById("link").href`, &shown)
	if shown != "waiting for payment | "+invoice+" | lightning:"+invoice {
		t.Fatalf("page shows %q", shown)
	}

	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	paid, err := s.Pay(pctx, invoice)
	if err != nil {
		t.Fatal(err)
	}
	pg.waitJS("paid", `document.getElementById("status").textContent === "paid: go back to your chat"`)
	pg.screenshot(shots, "pay-page-paid")
	var html string
	pg.js(`document.documentElement.outerHTML`, &html)
	if strings.Contains(html, token) || strings.Contains(html, paid.Preimage) {
		t.Fatalf("the page shows the payment token or the preimage:\n%s", html)
	}
}
