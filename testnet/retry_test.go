package testnet

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/skip"
)

// TestStartRetriesPortClash takes the vendor lnd's gRPC port before Start
// hands it out: lnd fails to bind, and Start must start over on fresh
// ports instead of failing.
func TestStartRetriesPortClash(t *testing.T) {
	skip.Short(t, "starts a regtest stack")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	exe, err := BuildCapvend(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var calls atomic.Int32
	reservePorts = func(n int) ([]int, error) {
		ps, err := freePorts(n)
		if err == nil && calls.Add(1) == 1 {
			ps[2] = taken.Addr().(*net.TCPAddr).Port // vendor lnd --rpclisten
		}
		return ps, err
	}
	defer func() { reservePorts = freePorts }()

	dir, err := os.MkdirTemp("", "capvend-testnet-retry-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := Start(ctx, Options{Dir: dir, Executable: exe, Progress: tlog{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if calls.Load() != 2 {
		t.Fatalf("ports reserved %d times, want 2 (one retry)", calls.Load())
	}
	v, _ := s.Node(Vendor)
	if v.RPCHost == taken.Addr().String() {
		t.Fatal("vendor still on the taken port")
	}
	inv, err := s.Invoice(ctx, 10, "after retry")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pay(ctx, inv.PaymentRequest); err != nil {
		t.Fatal(err)
	}
}

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
