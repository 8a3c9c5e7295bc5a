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
	r, err := nostr.RelayConnect(ctx, tg.relay)
	if err != nil {
		return nil, 0, fmt.Errorf("honest nostr customer: %w", err)
	}
	defer r.Close()
	sk := nostr.GeneratePrivateKey()
	if o.returning {
		if o.customerKey == "" {
			o.customerKey = sk
		}
		sk = o.customerKey
	}
	pk, _ := nostr.GetPublicKey(sk)
	since := nostr.Now()
	sub, err := r.Subscribe(ctx, nostr.Filters{{Kinds: []int{25910}, Tags: nostr.TagMap{"p": {pk}}, Since: &since}})
	if err != nil {
		return nil, 0, fmt.Errorf("honest nostr customer: %w", err)
	}
	defer sub.Unsub()
	var lat []time.Duration
	fails := 0
	for i := 0; i < o.honest && ctx.Err() == nil; i++ {
		d, err := nostrCall(ctx, st, r, sub, sk, o.pow, tg.serverPK, o.tool, fmt.Sprintf("honest nostr %s %d %d", label, i, time.Now().UnixNano()))
		if err != nil {
			fails++
			say("  nostr customer, call %d: not served: %v", i+1, err)
			continue
		}
		lat = append(lat, d)
	}
	return lat, fails, nil
}

func nostrCall(ctx context.Context, st *testnet.Stack, r *nostr.Relay, sub *nostr.Subscription, sk string, pow int, server, tool, text string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": map[string]any{"text": text}}})
	start := time.Now() // mining is part of the customer's wait
	ev := nostr.Event{Kind: 25910, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"p", server}, {"pmi", vend.PMILightning}}, Content: string(body)}
	if pow > 0 {
		ev.PubKey, _ = nostr.GetPublicKey(sk)
		tag, err := nip13.DoWork(ctx, ev, pow)
		if err != nil {
			return 0, fmt.Errorf("mining: %w", err)
		}
		ev.Tags = append(ev.Tags, tag)
	}
	if err := ev.Sign(sk); err != nil {
		return 0, err
	}
	if err := r.Publish(ctx, ev); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	paid := make(chan error, 1)
	var quoted time.Duration // when the invoice came
	for {
		select {
		case in, ok := <-sub.Events:
			if !ok {
				return 0, errors.New("subscription closed")
			}
			if in.PubKey != server || in.Tags.FindWithValue("e", ev.ID) == nil {
				continue
			}
			var m struct {
				Method string `json:"method"`
				Params struct {
					PayReq string `json:"pay_req"`
				} `json:"params"`
				Result json.RawMessage `json:"result"`
				Error  *struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(in.Content), &m); err != nil {
				return 0, err
			}
			switch {
			case m.Method == vend.NotifyPaymentRequired:
				quoted = time.Since(start)
				go func() { _, err := st.Pay(ctx, m.Params.PayReq); paid <- err }()
			case m.Method != "":
			case m.Error != nil:
				return 0, fmt.Errorf("error %d %s", m.Error.Code, m.Error.Message)
			default:
				d := time.Since(start)
				slowCall("nostr", text, d, quoted)
				return d, nil
			}
		case err := <-paid:
			if err != nil {
				return 0, fmt.Errorf("paying: %w", err)
			}
		case <-ctx.Done():
			return 0, errors.New("no answer in time")
		}
	}
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
