package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elnosh/gonuts/cashu"
	"github.com/elnosh/gonuts/cashu/nuts/nut04"
	"github.com/elnosh/gonuts/wallet"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/mcpprobe"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// The tools the soak's capvend sells (example-tools).
const (
	freeTool  = "word_count" // free, no daily quota: a free call writes nothing to the ledger
	paidTool  = "sha256"     // 21 sats
	paidSats  = 21
	topUpSats = 2100 // a credit top-up: 100 calls
)

// kind is a latency series.
type kind int

const (
	kFree   kind = iota // free calls, MCP HTTP and Nostr
	kPaid               // calls paid per call (LND over HTTP and Nostr, Cashu), the payment included
	kCredit             // calls drawn on prepaid credit
	nKinds
)

var kindNames = [nKinds]string{"free", "paid", "credit"}

// recorder collects the current interval's latencies and failures; the
// sampler takes them at each sample.
type recorder struct {
	mu   sync.Mutex
	lat  [nKinds][]time.Duration
	errs [nKinds]int
	log  io.Writer // one line per failure
}

func (r *recorder) ok(k kind, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lat[k] = append(r.lat[k], d)
}

func (r *recorder) fail(k kind, what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[k]++
	fmt.Fprintf(r.log, "%s %s %s: %v\n", time.Now().Format(time.TimeOnly), kindNames[k], what, err)
}

// take returns the interval's latencies and failures and starts a new
// interval.
func (r *recorder) take() ([nKinds][]time.Duration, [nKinds]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lat, errs := r.lat, r.errs
	r.lat, r.errs = [nKinds][]time.Duration{}, [nKinds]int{}
	return lat, errs
}

// counts are the calls done since the start, by way.
type counts struct {
	freeHTTP, freeNostr, paidHTTP, paidNostr, cashu, credit, topUps atomic.Int64
	unpaidHTTP, unpaidNostr                                         atomic.Int64
}

// done is every call served: free, paid, credit (top-ups not counted).
func (c *counts) done() int64 {
	return c.freeHTTP.Load() + c.freeNostr.Load() + c.paidHTTP.Load() + c.paidNostr.Load() + c.cashu.Load() + c.credit.Load()
}

// priced is every call that writes to the ledger: paid, credit, top-ups
// and unpaid quotes (free calls without a quota write nothing).
func (c *counts) priced() int64 {
	return c.paidHTTP.Load() + c.paidNostr.Load() + c.cashu.Load() + c.credit.Load() + c.topUps.Load() + c.unpaidHTTP.Load() + c.unpaidNostr.Load()
}

// load is the customers and the flood.
type load struct {
	st     *testnet.Stack
	mcpURL string
	relay  string // the stack's relay
	server string // capvend's Nostr pubkey
	dir    string // the run's directory (the customer's Cashu wallet)
	rec    *recorder
	n      counts

	outcomes mcpprobe.Tally // the unpaid flood's answers, by kind
	seq      atomic.Int64
}

// callTimeout bounds one call (a paid one includes its payment).
const callTimeout = time.Minute

// run starts every worker at o's rates and returns when ctx ends and they
// all have stopped.
func (l *load) run(ctx context.Context, o options) {
	var wg sync.WaitGroup
	start := func(rate float64, f func(context.Context, float64)) {
		if rate <= 0 {
			return
		}
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx, rate) }()
	}
	// Free calls over HTTP from two sessions: a slow answer on one does
	// not stop the other.
	start(o.freeRate/2, l.freeHTTP)
	start(o.freeRate/2, l.freeHTTP)
	start(o.nostrFreeRate, l.freeNostr)
	start(o.paidRate, l.paidHTTP)
	start(o.paidRate, l.paidNostr)
	start(o.cashuRate, l.cashuPaid)
	start(o.creditRate, l.credit)
	start(o.unpaidRate*2/3, l.unpaidNostr)
	start(o.unpaidRate/3, l.unpaidHTTP)
	wg.Wait()
}

// pace calls f rate times a second until ctx ends; a slow f runs back to
// back (the ticks it missed are dropped).
func pace(ctx context.Context, rate float64, f func()) {
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

func (l *load) text(what string) string {
	return fmt.Sprintf("soak %s %d %d", what, l.seq.Add(1), time.Now().UnixNano())
}

// mcpClient is an MCP Streamable HTTP session that declares the
// capvend/payments capability; each payment_required's invoice goes to
// bills.
type mcpClient struct {
	*client.Client
	bills chan string
}

func (l *load) dialMCP(ctx context.Context) (*mcpClient, error) {
	c, err := client.NewStreamableHttpClient(l.mcpURL)
	if err != nil {
		return nil, err
	}
	mc := &mcpClient{Client: c, bills: make(chan string, 4)}
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method != vend.NotifyPaymentRequired {
			return
		}
		if pr, _ := n.Params.AdditionalFields["pay_req"].(string); pr != "" {
			select {
			case mc.bills <- pr:
			default:
			}
		}
	})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	var init mcp.InitializeRequest
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "capvend-soak", Version: "1"}
	init.Params.Capabilities.Experimental = map[string]any{mcpfront.CapabilityPayments: map[string]any{}}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		return nil, err
	}
	return mc, nil
}

// call calls tool with a fresh text and meta, paying every invoice that
// comes meanwhile from the customer node (pay false: an invoice is a
// failure). It returns the result and how long it took.
func (l *load) call(ctx context.Context, mc *mcpClient, tool string, meta map[string]any, pay bool) (*mcp.CallToolResult, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	for len(mc.bills) > 0 { // a late invoice of an earlier call
		<-mc.bills
	}
	p := mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": l.text(tool)}}
	if meta != nil {
		p.Meta = &mcp.Meta{AdditionalFields: meta}
	}
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	ans := make(chan answer, 1)
	start := time.Now()
	go func() { res, err := mc.CallTool(ctx, mcp.CallToolRequest{Params: p}); ans <- answer{res, err} }()
	paid := make(chan error, 1)
	for {
		select {
		case pr := <-mc.bills:
			if !pay {
				return nil, 0, errors.New("asked to pay")
			}
			go func() { _, err := l.st.Pay(ctx, pr); paid <- err }()
		case err := <-paid:
			if err != nil {
				return nil, 0, fmt.Errorf("paying: %w", err)
			}
		case a := <-ans:
			if a.err != nil {
				return nil, 0, a.err
			}
			if a.res.IsError {
				return a.res, 0, fmt.Errorf("tool error: %s", resultText(a.res))
			}
			return a.res, time.Since(start), nil
		}
	}
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// session keeps one MCP session, dialling it again after failures.
type session struct {
	l     *load
	mc    *mcpClient
	fails int
}

func (s *session) get(ctx context.Context) (*mcpClient, error) {
	if s.mc != nil && s.fails < 3 {
		return s.mc, nil
	}
	s.close()
	mc, err := s.l.dialMCP(ctx)
	if err != nil {
		return nil, err
	}
	s.mc, s.fails = mc, 0
	return mc, nil
}

func (s *session) result(err error) {
	if err != nil {
		s.fails++
	} else {
		s.fails = 0
	}
}

func (s *session) close() {
	if s.mc != nil {
		s.mc.Close()
		s.mc = nil
	}
}

func (l *load) freeHTTP(ctx context.Context, rate float64) {
	l.httpCalls(ctx, rate, kFree, freeTool, false, "http", &l.n.freeHTTP)
}

func (l *load) paidHTTP(ctx context.Context, rate float64) {
	l.httpCalls(ctx, rate, kPaid, paidTool, true, "lnd http", &l.n.paidHTTP)
}

// httpCalls calls tool over one MCP HTTP session at rate, paying if
// paid, and records each outcome as k (failures labelled what), done
// calls in n.
func (l *load) httpCalls(ctx context.Context, rate float64, k kind, tool string, paid bool, what string, n *atomic.Int64) {
	s := &session{l: l}
	defer s.close()
	pace(ctx, rate, func() {
		mc, err := s.get(ctx)
		if err != nil {
			l.rec.fail(k, "http session", err)
			return
		}
		_, d, err := l.call(ctx, mc, tool, nil, paid)
		s.result(err)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.rec.fail(k, what, err)
			return
		}
		l.rec.ok(k, d)
		n.Add(1)
	})
}

// nostrSession keeps one ContextVM client, dialling it again after a
// failure (the relay's outage breaks its connection).
type nostrSession struct {
	l *load
	c *ctxvmclient.Client
}

func (s *nostrSession) get(ctx context.Context) (*ctxvmclient.Client, error) {
	if s.c != nil {
		return s.c, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := ctxvmclient.Dial(dctx, s.l.relay, s.l.server, ctxvmclient.Options{Kinds: []int{ctxvmclient.KindMessage}, AssumeValid: true})
	if err != nil {
		return nil, err
	}
	s.c = c
	return c, nil
}

func (s *nostrSession) result(err error) {
	if err != nil && s.c != nil {
		s.c.Close()
		s.c = nil
	}
}

func (s *nostrSession) close() { s.result(errors.New("closing")) }

// nostrCall sends tools/call of tool over c, paying the invoice of its
// payment_required from the customer node, and returns how long it took.
func (l *load) nostrCall(ctx context.Context, c *ctxvmclient.Client, tool string) (time.Duration, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, callTimeout, errors.New("no answer in time"))
	defer cancel()
	ctx, failed := context.WithCancelCause(ctx)
	defer failed(nil)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": l.seq.Add(1), "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": map[string]any{"text": l.text(tool)}}})
	ev := nostr.Event{Kind: ctxvmclient.KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", c.Server}, {"pmi", vend.PMILightning}}, Content: string(body)}
	if err := c.Sign(&ev); err != nil {
		return 0, err
	}
	start := time.Now()
	m, _, err := c.Roundtrip(ctx, &ev, nil, func(m ctxvmclient.Message) error {
		if m.Method != vend.NotifyPaymentRequired {
			return nil
		}
		var p struct {
			PayReq string `json:"pay_req"`
		}
		json.Unmarshal(m.Params, &p)
		go func() {
			if _, err := l.st.Pay(ctx, p.PayReq); err != nil {
				failed(fmt.Errorf("paying: %w", err))
			}
		}()
		return nil
	})
	switch {
	case ctx.Err() != nil:
		return 0, context.Cause(ctx)
	case err != nil:
		return 0, err
	case m.Error != nil:
		return 0, m.Error
	}
	return time.Since(start), nil
}

func (l *load) nostrWorker(ctx context.Context, rate float64, k kind, tool, what string, n *atomic.Int64) {
	s := &nostrSession{l: l}
	defer s.close()
	pace(ctx, rate, func() {
		c, err := s.get(ctx)
		if err != nil {
			if ctx.Err() == nil {
				l.rec.fail(k, what+" dial", err)
			}
			return
		}
		d, err := l.nostrCall(ctx, c, tool)
		s.result(err)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.rec.fail(k, what, err)
			return
		}
		l.rec.ok(k, d)
		n.Add(1)
	})
}

func (l *load) freeNostr(ctx context.Context, rate float64) {
	l.nostrWorker(ctx, rate, kFree, freeTool, "nostr", &l.n.freeNostr)
}

func (l *load) paidNostr(ctx context.Context, rate float64) {
	l.nostrWorker(ctx, rate, kPaid, paidTool, "lnd nostr", &l.n.paidNostr)
}

// cashuPaid pays calls with Cashu tokens (_meta capvend/cashu) of exactly
// the price, split off a customer wallet that the customer node funds at
// the stack's mint.
func (l *load) cashuPaid(ctx context.Context, rate float64) {
	w, err := wallet.LoadWallet(wallet.Config{WalletPath: filepath.Join(l.dir, "customer-wallet"), CurrentMintURL: l.st.MintURL})
	if err != nil {
		l.rec.fail(kPaid, "cashu wallet", err)
		return
	}
	defer w.Shutdown()
	s := &session{l: l}
	defer s.close()
	pace(ctx, rate, func() {
		if w.GetBalance() < 10*paidSats {
			if err := l.fundWallet(ctx, w, 100*paidSats); err != nil {
				if ctx.Err() == nil {
					l.rec.fail(kPaid, "cashu funding", err)
				}
				return
			}
		}
		mc, err := s.get(ctx)
		if err != nil {
			l.rec.fail(kPaid, "http session", err)
			return
		}
		start := time.Now() // splitting the token off is part of paying
		proofs, err := w.Send(paidSats, l.st.MintURL, false)
		if err != nil {
			l.rec.fail(kPaid, "cashu send", err)
			return
		}
		tok, err := cashu.NewTokenV4(proofs, l.st.MintURL, cashu.Sat, false)
		if err != nil {
			l.rec.fail(kPaid, "cashu token", err)
			return
		}
		str, err := tok.Serialize()
		if err != nil {
			l.rec.fail(kPaid, "cashu token", err)
			return
		}
		_, _, err = l.call(ctx, mc, paidTool, map[string]any{vend.MetaCashuToken: str}, false)
		s.result(err)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.rec.fail(kPaid, "cashu", err)
			return
		}
		l.rec.ok(kPaid, time.Since(start))
		l.n.cashu.Add(1)
	})
}

// fundWallet has the customer node buy sats of ecash into w.
func (l *load) fundWallet(ctx context.Context, w *wallet.Wallet, sats uint64) error {
	q, err := w.RequestMint(sats, l.st.MintURL)
	if err != nil {
		return fmt.Errorf("mint quote: %w", err)
	}
	if _, err := l.st.Pay(ctx, q.Request); err != nil {
		return err
	}
	for i := 0; ; i++ {
		st, err := w.MintQuoteState(q.Quote)
		if err == nil && (st.State == nut04.Paid || st.State == nut04.Issued) {
			break
		}
		if i == 300 || ctx.Err() != nil {
			return fmt.Errorf("mint quote never paid: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = w.MintTokens(q.Quote)
	return err
}

// credit tops up prepaid credit over MCP HTTP (an invoice of the mint,
// paid by the customer node: the ecash lands in capvend's wallet), draws
// calls on it until it is exhausted, and tops up again.
func (l *load) credit(ctx context.Context, rate float64) {
	s := &session{l: l}
	defer s.close()
	var token string
	pace(ctx, rate, func() {
		mc, err := s.get(ctx)
		if err != nil {
			l.rec.fail(kCredit, "http session", err)
			return
		}
		if token == "" {
			res, _, err := l.callTool(ctx, mc, vend.TopUpTool, map[string]any{"sats": topUpSats}, map[string]any{vend.MetaInvoiceFrom: "cashu"})
			s.result(err)
			if err != nil {
				if ctx.Err() == nil {
					l.rec.fail(kCredit, "top-up", err)
				}
				return
			}
			if token = creditToken(res); token == "" {
				l.rec.fail(kCredit, "top-up", errors.New("no credit token in the answer"))
				return
			}
			l.n.topUps.Add(1)
		}
		_, d, err := l.call(ctx, mc, paidTool, map[string]any{vend.MetaCredit: token}, false)
		if err != nil && strings.Contains(err.Error(), "Credit exhausted") {
			token = "" // the next tick tops up
			return
		}
		s.result(err)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.rec.fail(kCredit, "draw", err)
			return
		}
		l.rec.ok(kCredit, d)
		l.n.credit.Add(1)
	})
}

// callTool is call with arguments of the caller's, paying what is asked.
func (l *load) callTool(ctx context.Context, mc *mcpClient, tool string, args, meta map[string]any) (*mcp.CallToolResult, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	for len(mc.bills) > 0 {
		<-mc.bills
	}
	p := mcp.CallToolParams{Name: tool, Arguments: args, Meta: &mcp.Meta{AdditionalFields: meta}}
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	ans := make(chan answer, 1)
	start := time.Now()
	go func() { res, err := mc.CallTool(ctx, mcp.CallToolRequest{Params: p}); ans <- answer{res, err} }()
	paid := make(chan error, 1)
	for {
		select {
		case pr := <-mc.bills:
			go func() { _, err := l.st.Pay(ctx, pr); paid <- err }()
		case err := <-paid:
			if err != nil {
				return nil, 0, fmt.Errorf("paying: %w", err)
			}
		case a := <-ans:
			if a.err == nil && a.res.IsError {
				a.err = fmt.Errorf("tool error: %s", resultText(a.res))
			}
			return a.res, time.Since(start), a.err
		}
	}
}

// creditToken is the credit token of a top-up's answer
// (_meta["capvend/credit"].token), "" if none.
func creditToken(r *mcp.CallToolResult) string {
	if r == nil || r.Meta == nil {
		return ""
	}
	b, _ := json.Marshal(r.Meta.AdditionalFields[vend.MetaCredit])
	var info vend.CreditInfo
	json.Unmarshal(b, &info)
	return info.Token
}

// unpaidNostr asks for priced calls from a fresh key each time and never
// pays: the flood's Nostr half.
func (l *load) unpaidNostr(ctx context.Context, rate float64) {
	var r *nostr.Relay
	defer func() {
		if r != nil {
			r.Close()
		}
	}()
	pace(ctx, rate, func() {
		if r == nil {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var err error
			r, err = nostr.RelayConnect(dctx, l.relay)
			cancel()
			if err != nil {
				r = nil
				l.outcomes.Add("nostr: relay down")
				return
			}
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": map[string]any{"name": paidTool, "arguments": map[string]any{"text": l.text("unpaid")}}})
		ev := nostr.Event{Kind: ctxvmclient.KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", l.server}}, Content: string(body)}
		ev.Sign(nostr.GeneratePrivateKey())
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.Publish(pctx, ev)
		cancel()
		if err != nil {
			r.Close()
			r = nil
			l.outcomes.Add("nostr: publish failed")
			return
		}
		l.outcomes.Add("nostr: published")
		l.n.unpaidNostr.Add(1)
	})
}

// floodSources is how many loopback addresses the HTTP flood comes from
// (127.0.0.2 ...): each is a client of its own to capvend's limits.
const floodSources = 8

// unpaidHTTP opens a fresh MCP session (a stock host: no
// capvend/payments, so the quote comes back at once as a payment-required
// tool result), asks for one priced call and abandons the session: the
// flood's HTTP half.
func (l *load) unpaidHTTP(ctx context.Context, rate float64) {
	var i int
	pace(ctx, rate, func() {
		src := fmt.Sprintf("127.0.0.%d", 2+i%floodSources)
		i++
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		c := &http.Client{Timeout: 10 * time.Second, Transport: tr}
		sid, kind := mcpprobe.Post(ctx, c, l.mcpURL, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"soak-flood","version":"1"}}}`)
		if sid == "" {
			l.outcomes.Add("http initialize: " + kind)
			return
		}
		mcpprobe.Post(ctx, c, l.mcpURL, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		_, kind = mcpprobe.Post(ctx, c, l.mcpURL, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":{"text":%q}}}`, paidTool, l.text("unpaid")))
		l.outcomes.Add("http: " + kind)
		if kind == "payment_required result" {
			l.n.unpaidHTTP.Add(1)
		}
	})
}

// pct is the p-th percentile of ds (nearest rank), 0 if empty.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(float64(len(s)) * p / 100))
	return s[max(i-1, 0)]
}

// errLog opens the run's log of failed calls.
func errLog(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, "failures.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}
