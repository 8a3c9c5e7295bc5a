package cli

import (
	"testing"
	"time"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/internal/listed"
)

// TestStopClosesCallsWaitingForPayment: on stop, a call waiting for its
// payment over MCP HTTP gets http.shutdown_grace to finish, then its
// connection is closed: the client's call ends, unpaid and unrun. The
// stop used to wait a fixed 30 s, then return, leaving the call's stream
// open in a handler nobody waited for.
func TestStopClosesCallsWaitingForPayment(t *testing.T) {
	s := needStack(t)
	path, listen := writeServeConfig(t, s, serveOpts{})
	capvendtest.EditConfig(t, path, "\nhttp:\n", "\nhttp:\n  shutdown_grace: 1s\n")
	stop := startCapvend(t, path).Stop
	quoted := make(chan struct{}, 1)
	pc := capvendtest.NewPayingClientWith(t, "http://"+listen+"/mcp", func(string) { quoted <- struct{}{} }) // never pays
	capvendtest.WaitTools(t, pc.Client, listed.Count(serveTools))
	ended := make(chan error, 1)
	go func() {
		_, err := pc.Call(t, "t_sha256", map[string]any{"text": "never paid"})
		ended <- err
	}()
	select {
	case <-quoted:
	case err := <-ended:
		t.Fatalf("the call ended before its payment_required: %v", err)
	case <-time.After(60 * time.Second): // a hang guard
		t.Fatal("no payment_required")
	}
	stop()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("a call nobody paid succeeded")
		}
	case <-time.After(30 * time.Second): // a hang guard
		t.Fatal("the call waiting for its payment is still open after serve stopped")
	}
}
