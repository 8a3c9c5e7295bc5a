package capvendtest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// PayingClient is an MCP client that pays every payment_required it gets
// from the customer node.
type PayingClient struct {
	*client.Client
	mu    sync.Mutex
	notes []mcp.JSONRPCNotification
	// Paid gets the outcome of each payment NewPayingClient made.
	Paid chan error
}

func NewPayingClient(t testing.TB, s *testnet.Stack, url string) *PayingClient {
	t.Helper()
	paid := make(chan error, 16)
	pc := NewPayingClientWith(t, url, func(payReq string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := s.Pay(ctx, payReq)
		paid <- err
	})
	pc.Paid = paid
	return pc
}

// NewPayingClientWith is NewPayingClient with pay, run in a goroutine of
// its own, paying each payment_required's bolt11 (pc.Paid is nil).
func NewPayingClientWith(t testing.TB, url string, pay func(payReq string)) *PayingClient {
	t.Helper()
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	pc := &PayingClient{Client: c}
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		pc.mu.Lock()
		pc.notes = append(pc.notes, n)
		pc.mu.Unlock()
		if n.Method != "notifications/payment_required" {
			return
		}
		b, _ := json.Marshal(n.Params.AdditionalFields)
		var p struct {
			PayReq string `json:"pay_req"`
		}
		json.Unmarshal(b, &p)
		go pay(p.PayReq)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, PayingInit()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return pc
}

func (pc *PayingClient) Methods() []string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var out []string
	for _, n := range pc.notes {
		out = append(out, n.Method)
	}
	return out
}

func (pc *PayingClient) Call(t testing.TB, tool string, args map[string]any) (*mcp.CallToolResult, error) {
	t.Helper()
	return pc.CallMeta(t, tool, args, nil)
}

func (pc *PayingClient) CallMeta(t testing.TB, tool string, args, meta map[string]any) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p := mcp.CallToolParams{Name: tool, Arguments: args}
	if meta != nil {
		p.Meta = &mcp.Meta{AdditionalFields: meta}
	}
	return pc.CallTool(ctx, mcp.CallToolRequest{Params: p})
}

// CreditMeta is an answer's _meta["capvend/credit"].
func CreditMeta(t testing.TB, r *mcp.CallToolResult) vend.CreditInfo {
	t.Helper()
	var info vend.CreditInfo
	if r.Meta != nil {
		b, _ := json.Marshal(r.Meta.AdditionalFields[vend.MetaCredit])
		json.Unmarshal(b, &info)
	}
	if info.Account == "" {
		t.Fatalf("no _meta[%q] in the answer: %+v", vend.MetaCredit, r)
	}
	return info
}

// WaitTools waits until the tools c lists are done (listed.Count,
// listed.All): the upstreams may still be connecting.
func WaitTools(t testing.TB, c *client.Client, done func(names []string) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // upstreams connecting under load: a deadlock guard
	defer cancel()
	if _, err := listed.Until(ctx, func(ctx context.Context) ([]string, error) {
		list, err := c.ListTools(ctx, mcp.ListToolsRequest{})
		if err != nil {
			return nil, err
		}
		var names []string
		for _, tl := range list.Tools {
			names = append(names, tl.Name)
		}
		return names, nil
	}, done); err != nil {
		t.Fatalf("tools: %v", err)
	}
}

// BuyCredit tops up sats over pc (paid by the customer node through a mint
// quote, so the ecash lands in capvend's wallet) and returns the credit.
func BuyCredit(t testing.TB, pc *PayingClient, sats int, token string) vend.CreditInfo {
	t.Helper()
	meta := map[string]any{vend.MetaInvoiceFrom: "cashu"}
	if token != "" {
		meta[vend.MetaCredit] = token
	}
	res, err := pc.CallMeta(t, vend.TopUpTool, map[string]any{"sats": sats}, meta)
	if err != nil || res.IsError {
		t.Fatalf("top-up: %+v %v", res, err)
	}
	if err := <-pc.Paid; err != nil {
		t.Fatalf("paying the top-up: %v", err)
	}
	return CreditMeta(t, res)
}
