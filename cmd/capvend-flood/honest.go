package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip13"

	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/testnet"
	"github.com/capvend/capvend/vend"
)

// callTimeout bounds one honest paid call: past it the call counts as not
// served (-call-timeout).
var callTimeout = 2 * time.Minute

// honestNostr buys o.honest calls over ContextVM with one key, paying
// each invoice from the stack's customer node. It returns the latency of
// each served call (request sent to result received) and how many were
// not served.
func honestNostr(ctx context.Context, st *testnet.Stack, tg *target, o *options, label string) ([]time.Duration, int, error) {
	sk := nostr.GeneratePrivateKey()
	if o.returning {
		if o.customerKey == "" {
			o.customerKey = sk
		}
		sk = o.customerKey
	}
	c, err := ctxvmclient.Dial(ctx, tg.relay, tg.serverPK, ctxvmclient.Options{SecretKey: sk, Kinds: []int{ctxvmclient.KindMessage}})
	if err != nil {
		return nil, 0, fmt.Errorf("honest nostr customer: %w", err)
	}
	defer c.Close()
	var lat []time.Duration
	fails := 0
	for i := 0; i < o.honest && ctx.Err() == nil; i++ {
		d, err := nostrCall(ctx, st, c, o.pow, o.tool, fmt.Sprintf("honest nostr %s %d %d", label, i, time.Now().UnixNano()))
		if err != nil {
			fails++
			say("  nostr customer, call %d: not served: %v", i+1, err)
			continue
		}
		lat = append(lat, d)
	}
	return lat, fails, nil
}

func nostrCall(ctx context.Context, st *testnet.Stack, c *ctxvmclient.Client, pow int, tool, text string) (time.Duration, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, callTimeout, errors.New("no answer in time"))
	defer cancel()
	// A failed payment ends the wait at once.
	ctx, failed := context.WithCancelCause(ctx)
	defer failed(nil)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": map[string]any{"text": text}}})
	start := time.Now() // mining is part of the customer's wait
	ev := nostr.Event{Kind: ctxvmclient.KindMessage, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", c.Server}, {"pmi", vend.PMILightning}}, Content: string(body)}
	if pow > 0 {
		ev.PubKey = c.PublicKey
		tag, err := nip13.DoWork(ctx, ev, pow)
		if err != nil {
			return 0, fmt.Errorf("mining: %w", err)
		}
		ev.Tags = append(ev.Tags, tag)
	}
	if err := c.Sign(&ev); err != nil {
		return 0, err
	}
	var quoted time.Duration // when the invoice came
	m, _, err := c.Roundtrip(ctx, &ev, nil, func(m ctxvmclient.Message) error {
		if m.Method != vend.NotifyPaymentRequired {
			return nil
		}
		quoted = time.Since(start)
		var p struct {
			PayReq string `json:"pay_req"`
		}
		json.Unmarshal(m.Params, &p)
		go func() {
			if _, err := st.Pay(ctx, p.PayReq); err != nil {
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
	d := time.Since(start)
	slowCall("nostr", text, d, quoted)
	return d, nil
}

// honestHTTP buys o.honest calls over MCP Streamable HTTP from 127.0.0.1
// (one session), paying from the customer node.
func honestHTTP(ctx context.Context, st *testnet.Stack, tg *target, o *options, label string) ([]time.Duration, int, error) {
	c, err := client.NewStreamableHttpClient(tg.mcpURL)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	bills := make(chan string, 4)
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method != vend.NotifyPaymentRequired {
			return
		}
		if pr, _ := n.Params.AdditionalFields["pay_req"].(string); pr != "" {
			bills <- pr
		}
	})
	if err := c.Start(ctx); err != nil {
		return nil, 0, fmt.Errorf("honest http customer: %w", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "capvend-flood-customer", Version: "1"}
	init.Params.Capabilities.Experimental = map[string]any{"capvend/payments": map[string]any{}} // it reads payment_required
	if _, err := c.Initialize(ctx, init); err != nil {
		return nil, 0, fmt.Errorf("honest http customer: initialize: %w", err)
	}
	var lat []time.Duration
	fails := 0
	for i := 0; i < o.honest && ctx.Err() == nil; i++ {
		d, err := httpCall(ctx, st, c, bills, o.tool, fmt.Sprintf("honest http %s %d %d", label, i, time.Now().UnixNano()))
		if err != nil {
			fails++
			say("  http customer, call %d: not served: %v", i+1, err)
			continue
		}
		lat = append(lat, d)
	}
	return lat, fails, nil
}

func httpCall(ctx context.Context, st *testnet.Stack, c *client.Client, bills chan string, tool, text string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = map[string]any{"text": text}
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	ans := make(chan answer, 1)
	start := time.Now()
	go func() { res, err := c.CallTool(ctx, req); ans <- answer{res, err} }()
	paid := make(chan error, 1)
	var quoted time.Duration // when the invoice came
	for {
		select {
		case pr := <-bills:
			quoted = time.Since(start)
			go func() { _, err := st.Pay(ctx, pr); paid <- err }()
		case err := <-paid:
			if err != nil {
				return 0, fmt.Errorf("paying: %w", err)
			}
		case a := <-ans:
			if a.err != nil {
				return 0, a.err
			}
			if a.res.IsError {
				return 0, errors.New("tool error")
			}
			d := time.Since(start)
			slowCall("http", text, d, quoted)
			return d, nil
		}
	}
}

// slowAfter is the latency past which slowCall reports a call (-slow).
var slowAfter = time.Second

// slowCall says where a paid call that took over slowAfter spent its time:
// until its invoice came (capvend admitting, recording and issuing it),
// and from there to the result (paying, capvend settling and running it).
func slowCall(front, text string, d, quoted time.Duration) {
	if d < slowAfter {
		return
	}
	say("  %s customer, slow call (%s): %v = %v to the invoice + %v paying and running", front, text,
		d.Round(time.Millisecond), quoted.Round(time.Millisecond), (d - quoted).Round(time.Millisecond))
}
