package ctxvmclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"go.uber.org/goleak"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/racesupp"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// echo sells "echo" (free) and "paid" (notifies payment_required, then
// answers).
type echo struct{}

func (echo) Tools() []vend.Item {
	return []vend.Item{{Name: "echo"}, {Name: "paid", Price: 21_000}}
}

func (echo) ListedPrice(t vend.Item) (lo, hi vend.Msat) { return t.Price, t.Price }

func (echo) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	switch r.Name {
	case "echo":
	case "paid":
		r.Notify(vend.NotifyPaymentRequired, vend.PaymentOption{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, TTL: 600})
	default:
		return vend.CallResult{}, vend.ErrUnknownTool
	}
	return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":` + string(r.Arguments) + `}]}`)}, nil
}

// serve runs a ContextVM server over echo on a fresh relay until the test
// ends, and returns the relay and the server's pubkey.
func serve(t *testing.T) (relay, server string) {
	t.Helper()
	relay = testkit.Relay(t)
	s, err := ctxvm.New(ctxvm.Config{Vendor: echo{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{relay},
		FirstAnswerDelay: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return relay, s.PublicKey()
}

func dial(t *testing.T, relay, server string, opts ctxvmclient.Options) *ctxvmclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a deadlock guard
	defer cancel()
	c, err := ctxvmclient.Dial(ctx, relay, server, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// Plaintext and gift-wrapped requests, concurrent, each get their own
// answer, the paid call's payment_required first; a JSON-RPC error is an
// *Error; Names lists.
func TestClient(t *testing.T) {
	relay, server := serve(t)
	c := dial(t, relay, server, ctxvmclient.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadlock guard
	defer cancel()

	names, err := c.Names(ctx, "tools/list", ctxvmclient.Request{})
	if err != nil || !slices.Equal(names, []string{"echo", "paid"}) {
		t.Fatalf("tools/list: %v %v", names, err)
	}
	if _, _, err := c.Call(ctx, "tools/call", map[string]any{"name": "nope"}, ctxvmclient.Request{}); !errors.As(err, new(*ctxvmclient.Error)) {
		t.Fatalf("unknown tool: %v", err)
	}

	var wg sync.WaitGroup
	for i, wrap := range []int{0, ctxvmclient.KindGiftWrap, ctxvmclient.KindEphemeralGiftWrap, 0, ctxvmclient.KindGiftWrap} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var notes []string
			m, r, err := c.Request(ctx, "tools/call", map[string]any{"name": "paid", "arguments": map[string]any{"i": i}},
				ctxvmclient.Request{Wrap: wrap, OnNote: func(m ctxvmclient.Message) error { notes = append(notes, m.Method); return nil }})
			switch {
			case err != nil:
				t.Errorf("call %d: %v", i, err)
			case m.Error != nil || string(m.Result) != `{"content":[{"type":"text","text":{"i":`+string(rune('0'+i))+`}}]}`:
				t.Errorf("call %d answered %s %v", i, m.Result, m.Error)
			case !slices.Equal(notes, []string{vend.NotifyPaymentRequired}):
				t.Errorf("call %d: notifications %v", i, notes)
			case (wrap != 0) != (r.Wrapped != 0) || r.Event.PubKey != server:
				t.Errorf("call %d (wrap %d): answer wrapped %d by %s", i, wrap, r.Wrapped, r.Event.PubKey)
			}
		}()
	}
	wg.Wait()
}

// With Options.Events, what no waiter claims arrives in order, as it
// came.
func TestClientEvents(t *testing.T) {
	relay, server := serve(t)
	c := dial(t, relay, server, ctxvmclient.Options{Events: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadlock guard
	defer cancel()
	for i := range 3 {
		ev, err := c.Event(ctxvmclient.KindMessage, `{"jsonrpc":"2.0","id":`+string(rune('0'+i))+`,"method":"ping"}`)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-c.Events():
			if got.Tags.FindWithValue("e", ev.ID) == nil {
				t.Fatalf("event %d: %v", i, got)
			}
		case <-ctx.Done():
			t.Fatal("no answer")
		}
	}
}

// TestMain runs the tests with the race detector's suppressions of known
// races inside go-nostr and khatru (see package racesupp), and fails if a
// goroutine outlives them: a closed Client leaves none behind. (khatru's
// expiration manager, one per test relay, cannot be stopped.)
func TestMain(m *testing.M) {
	racesupp.Reexec()
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/fiatjaf/khatru.(*expirationManager).start"))
}
