package redteam

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/testnet"
)

// Issue 11, holes 1 and 3, and "What must hold": a request key that comes
// back with a different method, kind, tool or canonical argument hash is
// refused (-32600); it never attaches to, waits on, or replays another
// call, and execution uses the call's stored arguments.

// codeReused is the JSON-RPC error the issue asks for a reused request
// key: -32600 "request id reused with different parameters".
const codeReused = -32600

// expensive is what the attacker wants hashed for the price of a 1-sat
// call.
const expensive = "EXPENSIVE"

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// payAsync pays bolt11 from the customer node; the channel gets the
// outcome (a hold invoice's payment ends only when capvend settles or
// cancels it).
func payAsync(s *testnet.Stack, bolt11 string) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := s.Pay(ctx, bolt11)
		done <- err
	}()
	return done
}

// TestReusedIDOtherTool is hole 1 over MCP HTTP: tools/call id 7
// slow_count {"n":1} gets a 1-sat invoice; the client drops the stream
// and sends id 7 again as sha256 {"text":"EXPENSIVE"}. capvend must refuse
// it (-32600), not hand out the 1-sat invoice again and hash EXPENSIVE
// when it is paid.
func TestReusedIDOtherTool(t *testing.T) {
	t.Parallel()
	t.Run("mcp-http", func(t *testing.T) {
		sh := startShop(t, shopOpts{})
		c := newHTTPClient(t, sh)
		sess := c.initialize()

		first, err := c.postRaw(sess, request(7, "tools/call", callParams("slow_count", map[string]any{"n": 1}, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		cheap := untilNote(t, first, notePaymentRequired).payReq()
		first.close() // the client drops the stream

		second, err := c.postRaw(sess, request(7, "tools/call", callParams("sha256", map[string]any{"text": expensive}, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer second.close()
		m, ok := second.next(time.Minute)
		if !ok {
			t.Fatal("no answer to the reused id")
		}
		if m.Method == notePaymentRequired {
			if m.payReq() == cheap {
				// The hole: paying the slow_count invoice buys sha256.
				paid := payAsync(sh.s, cheap)
				res, _ := untilResponse(t, second, nil)
				<-paid
				if strings.Contains(string(res.Result), sha256Hex(expensive)) {
					t.Errorf("hole 1: the reused id got the 1-sat slow_count invoice, and paying it returned sha256(%q)", expensive)
				}
			}
			t.Fatalf("the reused id with another tool was quoted (%s), want error %d", m, codeReused)
		}
		if m.Error == nil || m.Error.Code != codeReused {
			t.Fatalf("reused id with another tool: %s, want error %d", m, codeReused)
		}
		// The first call is still its own: repeated and paid, it runs
		// slow_count.
		third, err := c.postRaw(sess, request(7, "tools/call", callParams("slow_count", map[string]any{"n": 1}, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer third.close()
		var paid <-chan error
		res, _ := untilResponse(t, third, func(b string) { paid = payAsync(sh.s, b) })
		if paid == nil {
			t.Fatalf("the repeated call was not asked to pay: %s", res)
		}
		if err := <-paid; err != nil {
			t.Fatalf("paying the slow_count invoice: %v", err)
		}
		if got := resultText(res.Result); got != "counted to 1" {
			t.Fatalf("the original call: %s", res)
		}
	})
}

// TestReusedIDOtherToolStdio is hole 1 over stdio: the client cancels id 7
// (notifications/cancelled) while it waits for payment, then sends id 7
// again with another tool.
func TestReusedIDOtherToolStdio(t *testing.T) {
	t.Parallel()
	sh, c := startStdioShop(t, shopOpts{})
	c.send(request(7, "tools/call", callParams("slow_count", map[string]any{"n": 1}, nil)))
	var cheap string
	for cheap == "" {
		m, ok := c.next(time.Minute)
		if !ok {
			t.Fatal("no payment_required for slow_count")
		}
		if m.Method == notePaymentRequired {
			cheap = m.payReq()
		}
	}
	c.send(request(nil, "notifications/cancelled", map[string]any{"requestId": 7, "reason": "redteam"}))
	// capvend answers the canceled call too (an error): that answer, also
	// of id 7, must not be taken for the answer to the reused id. It may
	// come after the ping's: wait for it (bounded; if capvend ever stops
	// answering canceled requests, as MCP allows, this costs the wait).
	c.send(request("sync", "ping", nil))
	canceledAnswered := false
	c.untilResponse("sync", func(m rpcMessage) { canceledAnswered = canceledAnswered || (m.Method == "" && string(m.ID) == "7") })
	for deadline := time.Now().Add(10 * time.Second); !canceledAnswered && time.Now().Before(deadline); {
		if m, ok := c.next(time.Until(deadline)); ok && m.Method == "" && string(m.ID) == "7" {
			canceledAnswered = true
		}
	}

	c.send(request(7, "tools/call", callParams("sha256", map[string]any{"text": expensive}, nil)))
	var paid <-chan error
	res := c.untilResponse(7, func(m rpcMessage) {
		if m.Method == notePaymentRequired && m.payReq() == cheap && paid == nil {
			paid = payAsync(sh.s, cheap) // the attacker pays the 1-sat invoice
		}
	})
	if paid != nil {
		<-paid
		if strings.Contains(string(res.Result), sha256Hex(expensive)) {
			t.Errorf("hole 1 over stdio: paying the 1-sat slow_count invoice returned sha256(%q)", expensive)
		}
	}
	if res.Error == nil || res.Error.Code != codeReused {
		t.Fatalf("reused id with another tool over stdio: %s, want error %d", res, codeReused)
	}
}

// TestReusedIDFreeQuota is hole 3: with free_per_day 1, the same request
// id with three different texts must not get three free answers. The
// first is free; the others are refused (-32600), never run free.
func TestReusedIDFreeQuota(t *testing.T) {
	t.Parallel()
	texts := []string{"one free call", "two free calls", "three free calls"}
	check := func(t *testing.T, answers []rpcMessage) {
		t.Helper()
		if answers[0].Error != nil || !strings.Contains(resultText(answers[0].Result), "words") {
			t.Fatalf("the first call (free): %s", answers[0])
		}
		for i, m := range answers[1:] {
			if m.Error == nil {
				t.Errorf("hole 3: the same id with text %q was answered %s (free again)", texts[i+1], resultText(m.Result))
				continue
			}
			if m.Error.Code != codeReused {
				t.Errorf("the same id with text %q: error %d %q, want %d", texts[i+1], m.Error.Code, m.Error.Message, codeReused)
			}
		}
	}
	t.Run("mcp-http", func(t *testing.T) {
		t.Parallel()
		sh := startShop(t, shopOpts{})
		c := newHTTPClient(t, sh)
		sess := c.initialize()
		var answers []rpcMessage
		for _, text := range texts {
			m, err := c.tryRPC(sess, 9, "tools/call", callParams("word_count", map[string]any{"text": text}, explicit()), nil)
			if err != nil {
				t.Fatal(err)
			}
			answers = append(answers, m)
		}
		check(t, answers)
	})
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		_, c := startStdioShop(t, shopOpts{})
		var answers []rpcMessage
		for _, text := range texts {
			answers = append(answers, c.rpc(9, "tools/call", callParams("word_count", map[string]any{"text": text}, explicit())))
		}
		check(t, answers)
	})
}

// TestReusedIDOtherToolNostr is hole 1 on every Nostr dialect. A Nostr
// request's key is its event id, which covers its content: a second event
// reusing the JSON-RPC id 7 with another tool is another request, and
// must get its own quote (21 sats, its own invoice); paying the first
// call's 1-sat invoice runs slow_count only.
func TestReusedIDOtherToolNostr(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			sh := startShop(t, shopOpts{nostr: true})
			c := dialNostr(t, sh)
			c.waitReady()
			first := c.send(d, 7, "tools/call", callParams("slow_count", map[string]any{"n": 1}, nil))
			m, ok := c.next(first, 2*time.Minute)
			if !ok || m.Method != notePaymentRequired || m.payReq == "" {
				t.Fatalf("slow_count: %v %v, want payment_required", m, ok)
			}
			cheap := m.payReq
			second := c.send(d, 7, "tools/call", callParams("sha256", map[string]any{"text": expensive}, nil))
			m, ok = c.next(second, 2*time.Minute)
			if !ok {
				t.Fatal("no answer to the second request")
			}
			switch {
			case m.Method == notePaymentRequired && m.payReq == cheap:
				t.Errorf("hole 1: the second request got the first one's 1-sat invoice")
			case m.Method == notePaymentRequired:
			case m.Error != nil && m.Error.Code == codeReused:
			default:
				t.Fatalf("the second request: %v, want its own payment_required or error %d", m, codeReused)
			}
			paid := payAsync(sh.s, cheap)
			res := c.untilResponse(first, nil)
			if err := <-paid; err != nil {
				t.Fatalf("paying slow_count: %v", err)
			}
			if got := resultText(res.Result); got != "counted to 1" {
				t.Fatalf("slow_count paid: %v", res)
			}
		})
	}
}

// TestReusedIDFreeQuotaNostr is hole 3 on every Nostr dialect: three
// word_count requests from one key (the same JSON-RPC id where the
// dialect has one) with different texts. One is free; the others are
// priced (explicit gating: -32042 at once), never free.
func TestReusedIDFreeQuotaNostr(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			sh := startShop(t, shopOpts{nostr: true})
			c := dialNostr(t, sh)
			c.waitReady()
			free := 0
			for _, text := range []string{"one free call", "two free calls", "three free calls"} {
				id := c.send(d, 9, "tools/call", callParams("word_count", map[string]any{"text": text}, explicit()), explicitTag())
				m := c.untilResponse(id, nil)
				if m.Error == nil && strings.Contains(resultText(m.Result), "words") {
					free++
				}
			}
			if free != 1 {
				t.Fatalf("%d free answers from one key with free_per_day 1, want 1", free)
			}
		})
	}
}
