package cli

import (
	"context"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
	"github.com/capvend/capvend/testnet"
)

// BenchmarkPaidCallsNWC measures paid calls per second end to end on
// regtest through NWC (client -> capvend -> make_hold_invoice over the
// relay -> the wallet service -> LND; the customer pays; the
// hold_invoice_accepted notification -> upstream -> settle_hold_invoice
// -> result) and through LND (the same with LND's invoicesrpc) in the
// same run, both on the vendor node with hold invoices, in alternating
// rounds so that both see the same load. Target: NWC >= 0.5x LND.
func BenchmarkPaidCallsNWC(b *testing.B) {
	s := needStack(b)
	w := capvendtest.NWCWallet(b, s, s.RelayURL)
	path := capvendtest.URIFile(b, w, testnet.NWCReceive)
	sides := []*paidSide{{name: "lnd", opts: serveOpts{hold: true}}, {name: "nwc", opts: serveOpts{noLND: true, nwcURIFile: path}}}
	for _, sd := range sides {
		path, _ := writeServeConfig(b, s, sd.opts)
		url := startCapvend(b, path).URL()
		sd.pc = capvendtest.NewPayingClient(b, s, url)
		capvendtest.WaitTools(b, sd.pc.Client, listed.Count(serveTools))
	}
	ctx := context.Background()
	args := map[string]any{"text": "paid"}
	const rounds = 4
	per := max(b.N/rounds, 1)
	b.ResetTimer()
	for round := 0; round < rounds; round++ {
		for _, sd := range sides {
			start := time.Now()
			for i := 0; i < per; i++ {
				if _, err := sd.pc.CallTool(ctx, mcp.CallToolRequest{Params: mcp.CallToolParams{Name: "t_sha256", Arguments: args}}); err != nil {
					b.Fatal(err)
				}
				if err := <-sd.pc.Paid; err != nil {
					b.Fatal(err)
				}
			}
			sd.took += time.Since(start)
		}
	}
	b.StopTimer()
	n := float64(per * rounds)
	lnd, nwc := n/sides[0].took.Seconds(), n/sides[1].took.Seconds()
	b.ReportMetric(lnd, "lnd-paid-calls/s")
	b.ReportMetric(nwc, "nwc-paid-calls/s")
	b.ReportMetric(nwc/lnd, "nwc_x_lnd")
}

// paidSide is one backend BenchmarkPaidCallsNWC sells through.
type paidSide struct {
	name string
	opts serveOpts
	pc   *capvendtest.PayingClient
	took time.Duration
}
