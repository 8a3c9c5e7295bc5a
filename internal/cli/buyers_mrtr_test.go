package cli

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// pagePayer is an mcp-go elicitation handler acting as a person with a
// wallet: it opens the URL-mode elicitation's pay page, reads the invoice
// and pays it from the customer LND a moment after answering "accept".
type pagePayer struct {
	t    *testing.T
	s    *testnet.Stack
	mu   sync.Mutex
	asks []string
	hash string // of the payment, once made
	paid chan struct{}
}

func (p *pagePayer) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	p.mu.Lock()
	p.asks = append(p.asks, req.Params.Mode+" "+req.Params.URL)
	p.mu.Unlock()
	resp, err := http.Get(req.Params.URL)
	if err != nil {
		return nil, err
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, rest, _ := strings.Cut(string(page), `<code id="invoice">`)
	inv, _, _ := strings.Cut(rest, "</code>")
	go func() {
		defer close(p.paid)
		time.Sleep(500 * time.Millisecond) // the retry is waiting by then
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := p.s.Pay(ctx, inv)
		if err != nil {
			p.t.Errorf("paying the page's invoice: %v", err)
			return
		}
		p.mu.Lock()
		p.hash = r.PaymentHash
		p.mu.Unlock()
	}()
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept}}, nil
}

// TestURLElicitationPaysMRTR (issue 29): mcp-go's client on protocol
// 2026-07-28, declaring URL-mode elicitation in each request, calls
// t_sha256 on `capvend serve`. The first round answers input_required
// with an elicitation/create (mode url) of the call's pay page; the
// client's handler opens it, answers accept, and pays the page's invoice
// from the customer LND; the client's retry (the same call with the
// requestState) gets the tool's result. The customer paid exactly 21
// sats; the call ran once, released by its invoice (scheme invoice) to
// the first round's request; `ledger verify` passes. (The stock MCP
// TypeScript SDK, 1.32.2, speaks 2025-11-25 at most: it has no
// input_required rounds to test here.)
func TestURLElicitationPaysMRTR(t *testing.T) {
	s := needStack(t)
	path, _ := writeServeConfig(t, s, serveOpts{})
	sv := startCapvend(t, path)
	url, db := sv.URL(), sv.Ledger()
	tr, err := transport.NewStreamableHTTP(url)
	if err != nil {
		t.Fatal(err)
	}
	h := &pagePayer{t: t, s: s, paid: make(chan struct{})}
	c := client.NewClient(tr, client.WithClientCapabilities(mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{URL: &struct{}{}}}),
		client.WithElicitationHandler(h))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	if !mcp.IsModernProtocol(c.ProtocolVersion()) {
		t.Fatalf("protocol %s", c.ProtocolVersion())
	}
	capvendtest.WaitTools(t, c, listed.All("t_sha256"))
	text := "bought through input_required"
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = "t_sha256", map[string]any{"text": text}
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	<-h.paid
	h.mu.Lock()
	asks, hash := h.asks, h.hash
	h.mu.Unlock()
	want := fmt.Sprintf("%x", sha256.Sum256([]byte(text)))
	if len(res.Content) != 1 || res.IsError || !strings.Contains(fmt.Sprint(res.Content[0]), want) {
		t.Fatalf("result %+v", res)
	}
	if len(asks) != 1 || !strings.HasPrefix(asks[0], "url http://") || !strings.Contains(asks[0], "/pay/cvv_") || hash == "" {
		t.Fatalf("asked %q, paid %q", asks, hash)
	}
	if sent := capvendtest.CustomerPayment(t, s, hash); sent.Status != lnrpc.Payment_SUCCEEDED || sent.ValueMsat != 21_000 {
		t.Fatalf("the customer node paid %d msat (%s), want 21000", sent.ValueMsat, sent.Status)
	}
	l, err := ledger.Open(ctx, db, ledger.Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Payment(ctx, hash)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	call, err := l.Call(ctx, p.CallID)
	l.Close()
	if err != nil || call.State != vend.CallDelivered || call.Executions != 1 || p.Settled != 21_000 {
		t.Fatalf("call %+v payment %+v: %v", call, p, err)
	}
	if by := capvendtest.ReleasedBy(t, db, call.ID); by != string(vend.SchemeInvoice) {
		t.Fatalf("released by %q", by)
	}
	if stdout, stderr, code := run(t, nil, "ledger", "verify", "--config", filepath.Join(filepath.Dir(db), "capvend.yaml")); code != 0 {
		t.Fatalf("ledger verify: exit %d\n%s%s", code, stdout, stderr)
	}
}
