package cashu_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/billing/billingtest"
	"github.com/capvend/capvend/billing/cashu"
	"github.com/capvend/capvend/vend"
)

// events collects what a backend reports.
type events struct {
	mu sync.Mutex
	by map[string][]vend.PaymentState
	ch chan struct{}
}

func newEvents() *events {
	return &events{by: map[string][]vend.PaymentState{}, ch: make(chan struct{}, 1)}
}

func (e *events) report(ev vend.PaymentEvent) {
	e.mu.Lock()
	e.by[ev.Payment.Ref] = append(e.by[ev.Payment.Ref], ev.Payment.State)
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

func (e *events) wait(t *testing.T, ref string, st vend.PaymentState, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		e.mu.Lock()
		for _, s := range e.by[ref] {
			if s == st {
				e.mu.Unlock()
				return
			}
		}
		e.mu.Unlock()
		select {
		case <-e.ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s not reported %s within %s", ref, st, timeout)
		}
	}
}

func runBackend(t *testing.T, b *cashu.Backend, ev *events) {
	t.Cleanup(running(t, b, ev.report))
}

// running starts b.Run and returns its stop, which waits for Run to
// return (once; later calls do nothing).
func running(t *testing.T, b *cashu.Backend, report func(vend.PaymentEvent)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, report) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return")
			}
		})
	}
}

// TestNUT17DetectsPayment: with polling effectively off, only the NUT-17
// subscription can tell the backend the quote was paid.
func TestNUT17DetectsPayment(t *testing.T) {
	needStack(t)
	if !*nut17 {
		t.Skip("NUT-17 is opt-in: run with -cashu.nut17")
	}
	l := openLedger(t)
	b := newBackend(t, l, stack.MintURL, t.TempDir(), func(c *cashu.Config) {
		c.Websocket = true
		c.PollInterval = time.Hour
		c.SafetyPoll = time.Hour
	})
	ev := newEvents()
	runBackend(t, b, ev)
	c := priced(t, l, 6)
	p, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	until(t, 30*time.Second, "subscription acknowledged", func() bool { return b.Covered(p.Ref) })
	if err := pay(context.Background(), p.Bolt11); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, p.Ref, vend.PaymentSettled, 30*time.Second)
}

// TestStartsWithMintDown: capvend starts while the mint is unreachable
// (gonuts' LoadWallet needs it): Request fails cleanly, Run retries, and
// once the mint is back everything works.
func TestStartsWithMintDown(t *testing.T) {
	needStack(t)
	t.Parallel() // see "Parallel tests" in main_test.go
	proxy := billingtest.NewProxy(t, mintHostPort())
	proxy.Cut()
	l := openLedger(t)
	logs := newLogWatch()
	b := newBackend(t, l, "http://"+proxy.Addr(), t.TempDir(), func(c *cashu.Config) { c.Log = slog.New(logs) })
	ev := newEvents()
	runBackend(t, b, ev)
	c := priced(t, l, 4)
	_, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c.ID, Amount: c.Price, Expiry: 10 * time.Minute})
	if !errors.Is(err, cashu.ErrMintUnavailable) {
		t.Fatalf("request with the mint down: %v", err)
	}
	if cl, _ := l.Call(context.Background(), c.ID); cl.State != vend.CallQuoted {
		t.Fatalf("a failed request left the call %s", cl.State)
	}
	pt, _ := cashu.ParseToken(customerToken(t, 4))
	pt.Mint = "http://" + proxy.Addr()
	tok, _ := pt.Serialize()
	if _, err := b.AcceptToken(context.Background(), c.ID, c.Price, tok); !errors.Is(err, cashu.ErrMintUnavailable) {
		t.Fatalf("token with the mint down: %v", err)
	}
	logs.wait(t, "cashu wallet not loaded; retrying", 2, 30*time.Second) // Run fails to load, and retries
	proxy.Restore()
	logs.wait(t, "cashu wallet loaded", 1, 30*time.Second)
	c2 := priced(t, l, 4)
	p, err := b.Request(context.Background(), vend.PaymentRequest{CallID: c2.ID, Amount: c2.Price, Expiry: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(context.Background(), p.Bolt11); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, p.Ref, vend.PaymentSettled, 30*time.Second)
	// The token refused while the mint was down was not consumed.
	c3 := priced(t, l, 4)
	if _, err := b.AcceptToken(context.Background(), c3.ID, c3.Price, tok); err != nil {
		t.Fatalf("the token after the mint came back: %v", err)
	}
}

// logWatch is a slog.Handler that counts the backend's messages, so a test
// can wait for what the backend did instead of sleeping. With -cashu.log
// it also prints them.
type logWatch struct {
	mu     sync.Mutex
	counts map[string]int
	seen   chan struct{} // closed and replaced at each message
	print  slog.Handler
}

func newLogWatch() *logWatch {
	w := &logWatch{counts: map[string]int{}, seen: make(chan struct{})}
	if *verbose {
		w.print = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	return w
}

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }

func (w *logWatch) Handle(ctx context.Context, r slog.Record) error {
	w.mu.Lock()
	w.counts[r.Message]++
	close(w.seen)
	w.seen = make(chan struct{})
	w.mu.Unlock()
	if w.print != nil {
		return w.print.Handle(ctx, r)
	}
	return nil
}

func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *logWatch) WithGroup(string) slog.Handler      { return w }

// wait returns once msg was logged n times; it fails t after timeout.
func (w *logWatch) wait(t *testing.T, msg string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		got, seen := w.counts[msg], w.seen
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-seen:
		case <-deadline:
			t.Fatalf("%q logged %d times in %s, want %d", msg, got, timeout, n)
		}
	}
}
