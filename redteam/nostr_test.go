package redteam

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip13"
	"github.com/nbd-wtf/go-nostr/nip44"
)

// dialect is a Nostr wire form capvend serves.
type dialect string

const (
	ctxvmPlain   dialect = "contextvm"      // kind 25910, JSON-RPC, no method tag
	ctxvmWrapped dialect = "contextvm-wrap" // the same, gift wrapped (kind 1059, NIP-44)
	dvmcpRev1    dialect = "dvmcp-rev1"     // kind 25910 with a method tag
	dvmcpRev11   dialect = "dvmcp-rev1.1"   // kind 25910, {method, params} without jsonrpc
	nip90        dialect = "nip90"          // kind 5910 job, c tag
)

var dialects = []dialect{ctxvmPlain, ctxvmWrapped, dvmcpRev1, dvmcpRev11, nip90}

// Event kinds of the answers.
const (
	kindMessage      = 25910
	kindDVMCPResp    = 26910
	kindDVMCPNote    = 21316
	kindJobRequest   = 5910
	kindJobResult    = 6910
	kindJobFeedback  = 7000
	kindGiftWrap     = 1059
	kindEphemeralGW  = 21059
	explicitTagValue = "explicit_gating"
)

// nostrClient is one Nostr identity talking to a shop's server on the
// stack's relay.
type nostrClient struct {
	t      testing.TB
	sk, pk string
	server string
	relay  *nostr.Relay
	events chan *nostr.Event
}

// dialNostr connects a fresh key to the relay, subscribed to every answer
// kind addressed to it.
func dialNostr(t testing.TB, sh *shop) *nostrClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	r, err := nostr.RelayConnect(cctx, sh.s.RelayURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	sub, err := r.Subscribe(ctx, nostr.Filters{{
		Kinds: []int{kindMessage, kindDVMCPResp, kindDVMCPNote, kindJobResult, kindJobFeedback, kindGiftWrap, kindEphemeralGW},
		Tags:  nostr.TagMap{"p": {pk}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.EndOfStoredEvents:
	case <-time.After(30 * time.Second):
		t.Fatal("no EOSE from the relay")
	}
	return &nostrClient{t: t, sk: sk, pk: pk, server: sh.serverPK, relay: r, events: sub.Events}
}

// nostrMsg is an answer from the server, in any dialect, as JSON-RPC:
// a notification (Method set; payReq for payment_required) or the
// response (Result or Error; NIP-90 errors have code 0).
type nostrMsg struct {
	rpcMessage
	payReq string
	kind   int
	tags   nostr.Tags // the event's (inside its wrap)
}

// build makes the request event for method and params in dialect d
// (id: the JSON-RPC id where the dialect has one), with extra tags, signed
// by the client. It does not publish it.
func (c *nostrClient) build(d dialect, id any, method string, params any, tags ...nostr.Tag) *nostr.Event {
	c.t.Helper()
	ev := c.draft(d, id, method, params, tags...)
	if err := ev.Sign(c.sk); err != nil {
		c.t.Fatal(err)
	}
	return ev
}

// buildPoW is build with NIP-13 proof of work of bits difficulty.
func (c *nostrClient) buildPoW(d dialect, bits int, id any, method string, params any, tags ...nostr.Tag) *nostr.Event {
	c.t.Helper()
	ev := c.draft(d, id, method, params, tags...)
	ev.PubKey = c.pk
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nonce, err := nip13.DoWork(ctx, *ev, bits)
	if err != nil {
		c.t.Fatal(err)
	}
	ev.Tags = append(ev.Tags, nonce)
	if err := ev.Sign(c.sk); err != nil {
		c.t.Fatal(err)
	}
	return ev
}

// draft is build's unsigned event.
func (c *nostrClient) draft(d dialect, id any, method string, params any, tags ...nostr.Tag) *nostr.Event {
	c.t.Helper()
	ev := &nostr.Event{Kind: kindMessage, CreatedAt: nostr.Now(), Tags: append(nostr.Tags{{"p", c.server}}, tags...)}
	switch d {
	case ctxvmPlain, ctxvmWrapped:
		ev.Content = request(id, method, params)
	case dvmcpRev1:
		ev.Content = request(id, method, params)
		ev.Tags = append(ev.Tags, nostr.Tag{"method", method})
	case dvmcpRev11:
		b, _ := json.Marshal(map[string]any{"method": method, "params": params})
		ev.Content = string(b)
		ev.Tags = append(ev.Tags, nostr.Tag{"method", method})
	case nip90:
		ev.Kind = kindJobRequest
		switch method {
		case "tools/list":
			ev.Tags = append(ev.Tags, nostr.Tag{"c", "list-tools"})
		case "tools/call":
			p, _ := params.(map[string]any)
			job := map[string]any{"name": p["name"], "parameters": p["arguments"]}
			if m, ok := p["_meta"]; ok {
				job["_meta"] = m
			}
			b, _ := json.Marshal(job)
			ev.Content = string(b)
			ev.Tags = append(ev.Tags, nostr.Tag{"c", "execute-tool"})
		default:
			c.t.Fatalf("NIP-90 has no form for %s", method)
		}
	}
	return ev
}

// publish sends ev (gift wrapped for ctxvmWrapped) and returns ev's id:
// the request key the server answers to.
func (c *nostrClient) publish(d dialect, ev *nostr.Event) string {
	c.t.Helper()
	out := *ev
	if d == ctxvmWrapped {
		out = c.wrap(ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.relay.Publish(ctx, out); err != nil {
		c.t.Fatalf("publish: %v", err)
	}
	return ev.ID
}

// tryPublish publishes ev as it is; the relay refuses it while nobody
// (the server) listens.
func (c *nostrClient) tryPublish(ev *nostr.Event) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.relay.Publish(ctx, *ev)
}

// send builds and publishes a request and returns its event id.
func (c *nostrClient) send(d dialect, id any, method string, params any, tags ...nostr.Tag) string {
	c.t.Helper()
	return c.publish(d, c.build(d, id, method, params, tags...))
}

// wrap gift wraps ev for the server the ContextVM way: the signed event
// itself, NIP-44 encrypted from a one-time key, in a kind 1059.
func (c *nostrClient) wrap(ev *nostr.Event) nostr.Event {
	c.t.Helper()
	once := nostr.GeneratePrivateKey()
	ck, err := nip44.GenerateConversationKey(c.server, once)
	if err != nil {
		c.t.Fatal(err)
	}
	inner, _ := json.Marshal(ev)
	ct, err := nip44.Encrypt(string(inner), ck)
	if err != nil {
		c.t.Fatal(err)
	}
	w := nostr.Event{Kind: kindGiftWrap, CreatedAt: nostr.Now(), Content: ct, Tags: nostr.Tags{{"p", c.server}}}
	if err := w.Sign(once); err != nil {
		c.t.Fatal(err)
	}
	return w
}

// next returns the next answer about request reqID, or false after wait.
func (c *nostrClient) next(reqID string, wait time.Duration) (nostrMsg, bool) {
	c.t.Helper()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case ev := <-c.events:
			if ev.Kind == kindGiftWrap || ev.Kind == kindEphemeralGW {
				ck, err := nip44.GenerateConversationKey(ev.PubKey, c.sk)
				if err != nil {
					continue
				}
				plain, err := nip44.Decrypt(ev.Content, ck)
				if err != nil {
					continue
				}
				var inner nostr.Event
				if json.Unmarshal([]byte(plain), &inner) != nil {
					continue
				}
				ev = &inner
			}
			if ev.PubKey != c.server || ev.Tags.FindWithValue("e", reqID) == nil {
				continue
			}
			if ok, _ := ev.CheckSignature(); !ok {
				c.t.Fatal("a server event is badly signed")
			}
			return decodeAnswer(c.t, ev), true
		case <-timer.C:
			return nostrMsg{}, false
		}
	}
}

// decodeAnswer reads a server event in its dialect.
func decodeAnswer(t testing.TB, ev *nostr.Event) nostrMsg {
	m := nostrMsg{kind: ev.Kind, tags: ev.Tags}
	status := ev.Tags.Find("status")
	switch ev.Kind {
	case kindMessage:
		json.Unmarshal([]byte(ev.Content), &m.rpcMessage)
		if m.Method == notePaymentRequired {
			m.payReq = m.rpcMessage.payReq()
		}
	case kindDVMCPResp:
		if strings.Contains(ev.Content, `"jsonrpc"`) {
			json.Unmarshal([]byte(ev.Content), &m.rpcMessage)
		} else { // rev1.1: the result at the root, or {"error": ...}
			var e struct {
				Error *rpcError `json:"error"`
			}
			if json.Unmarshal([]byte(ev.Content), &e) == nil && e.Error != nil {
				m.Error = e.Error
			} else {
				m.Result = json.RawMessage(ev.Content)
			}
		}
	case kindDVMCPNote:
		switch {
		case len(status) >= 2 && status[1] == "payment-required":
			m.Method = notePaymentRequired
			if inv := ev.Tags.Find("invoice"); len(inv) >= 2 {
				m.payReq = inv[1]
			}
		case len(status) >= 2 && status[1] == "payment-accepted":
			m.Method = notePaymentAccepted
		case len(status) >= 2:
			m.Method = "notifications/status-" + status[1]
		default:
			json.Unmarshal([]byte(ev.Content), &m.rpcMessage)
			if m.Method == "" {
				m.Method = "notifications/unknown"
			}
		}
	case kindJobFeedback:
		switch {
		case len(status) >= 2 && status[1] == "payment-required":
			m.Method = notePaymentRequired
			if a := ev.Tags.Find("amount"); len(a) >= 3 {
				m.payReq = a[2]
			}
		case len(status) >= 2:
			m.Method = "notifications/status-" + status[1]
			if len(status) >= 3 {
				m.Params, _ = json.Marshal(status[2])
			}
		}
	case kindJobResult:
		if s := ev.Tags.Find("status"); len(s) >= 2 && s[1] == "error" {
			m.Error = &rpcError{Message: resultText(json.RawMessage(ev.Content))}
		} else {
			m.Result = json.RawMessage(ev.Content)
		}
	default:
		t.Fatalf("unexpected answer kind %d", ev.Kind)
	}
	return m
}

// untilResponse reads the answers about reqID up to the response,
// passing notifications to note.
func (c *nostrClient) untilResponse(reqID string, note func(nostrMsg)) nostrMsg {
	c.t.Helper()
	for {
		m, ok := c.next(reqID, 3*time.Minute) // a hang guard
		if !ok {
			c.t.Fatalf("no answer to %.12s…", reqID)
		}
		if m.Method == "" {
			return m
		}
		if note != nil {
			note(m)
		}
	}
}

// waitReady pings until the server answers: it subscribes after starting,
// and the relay refuses events nobody listens to.
func (c *nostrClient) waitReady() {
	c.t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a hang guard
	for time.Now().Before(deadline) {
		ev := c.build(ctxvmPlain, "ready", "ping", nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.relay.Publish(ctx, *ev)
		cancel()
		if err != nil {
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if _, ok := c.next(ev.ID, time.Second); ok {
			return
		}
	}
	c.t.Fatal("the Nostr front did not answer a ping within 2 minutes")
}

// explicitTag asks for explicit gating on Nostr.
func explicitTag() nostr.Tag { return nostr.Tag{"payment_interaction", explicitTagValue} }

// errorCode renders an answer's error for messages.
func (m nostrMsg) String() string {
	if m.Error != nil {
		return "error " + strconv.Itoa(m.Error.Code) + " " + m.Error.Message
	}
	if m.Method != "" {
		return m.Method
	}
	return string(m.Result)
}
