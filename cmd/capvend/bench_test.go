package main

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/lightningnetwork/lnd/lnrpc"
	"github.com/lightningnetwork/lnd/lnrpc/routerrpc"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/testnet"
)

func p50(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// BenchmarkFreeCall measures the p50 latency of a free tools/call through
// capvend (MCP HTTP front -> upstream over MCP HTTP) against calling the
// same upstream directly, interleaved in the same run. Target: <= 1.3x.
func BenchmarkFreeCall(b *testing.B) {
	s := needStack(b) // for the example-tools binary and a configuration
	url, _ := serving(b, s, serveOpts{})
	pc := newPayingClient(b, s, url)
	waitTools(b, pc)
	ctx := context.Background()
	// The direct client talks to the same HTTP upstream capvend uses.
	direct, err := client.NewStreamableHttpClient("http://" + lastHTTPUpstream + "/mcp")
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	if err := direct.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := direct.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		b.Fatal(err)
	}
	args := map[string]any{"text": "the quick brown fox"}
	var ours, theirs []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := direct.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "word_count", Arguments: args}}); err != nil {
			b.Fatal(err)
		}
		theirs = append(theirs, time.Since(start))
		start = time.Now()
		if _, err := pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "w_word_count", Arguments: args}}); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(start))
	}
	b.StopTimer()
	o, d := p50(ours), p50(theirs)
	b.ReportMetric(float64(o.Microseconds())/1000, "capvend-p50-ms")
	b.ReportMetric(float64(d.Microseconds())/1000, "direct-p50-ms")
	b.ReportMetric(float64(o)/float64(d), "x_direct")
}

// BenchmarkPaidCalls measures paid calls per second end to end on regtest
// (client -> capvend -> LND invoice -> customer pays over routerrpc ->
// settlement -> upstream -> result), next to a raw loop of AddInvoice on the
// vendor and SendPaymentV2 from the customer in the same run. Target:
// >= 0.85x the raw loop.
func BenchmarkPaidCalls(b *testing.B) {
	s := needStack(b)
	url, _ := serving(b, s, serveOpts{})
	pc := newPayingClient(b, s, url)
	waitTools(b, pc)
	ctx := context.Background()
	args := map[string]any{"text": "paid"}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_sha256", Arguments: args}}); err != nil {
			b.Fatal(err)
		}
		if err := <-pc.paid; err != nil {
			b.Fatal(err)
		}
	}
	ours := time.Since(start)
	b.StopTimer()

	vc, err := s.Conn(testnet.Vendor)
	if err != nil {
		b.Fatal(err)
	}
	cc, err := s.Conn(testnet.Customer)
	if err != nil {
		b.Fatal(err)
	}
	vendor, router := lnrpc.NewLightningClient(vc), routerrpc.NewRouterClient(cc)
	start = time.Now()
	for i := 0; i < b.N; i++ {
		inv, err := vendor.AddInvoice(ctx, &lnrpc.Invoice{ValueMsat: 21_000, Memo: "raw", Expiry: 600})
		if err != nil {
			b.Fatal(err)
		}
		stream, err := router.SendPaymentV2(ctx, &routerrpc.SendPaymentRequest{PaymentRequest: inv.PaymentRequest,
			TimeoutSeconds: 60, FeeLimitSat: 1000, NoInflightUpdates: true})
		if err != nil {
			b.Fatal(err)
		}
		for {
			p, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if p.Status == lnrpc.Payment_SUCCEEDED {
				break
			}
			if p.Status == lnrpc.Payment_FAILED {
				b.Fatal(p.FailureReason)
			}
		}
	}
	raw := time.Since(start)
	b.ReportMetric(float64(b.N)/ours.Seconds(), "paid-calls/s")
	b.ReportMetric(float64(b.N)/raw.Seconds(), "raw-pay/s")
	b.ReportMetric(raw.Seconds()/ours.Seconds(), "x_raw")
}
