package mcpfront

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

// slowVendor's one tool sends a notification, then takes wait before its
// result, like a call waiting for its payment.
type slowVendor struct{ wait time.Duration }

func (v slowVendor) Tools() []vend.Item { return []vend.Item{{Name: "slow", Price: 1000}} }

func (v slowVendor) CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error) {
	r.Notify(vend.NotifyPaymentRequired, map[string]any{"amount": 1, "pay_req": "lnbcrt10n1fake"})
	select {
	case <-time.After(v.wait): // the payment takes longer than one write may
	case <-ctx.Done():
		return vend.CallResult{}, ctx.Err()
	}
	return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"done"}]}`)}, nil
}

// A stream that waits longer than the write timeout (a payment wait) is not
// cut: the front moves the write deadline before each write. A server-wide
// WriteTimeout alone would end it.
func TestStreamOutlivesWriteTimeout(t *testing.T) {
	const wt = 100 * time.Millisecond
	s, err := New(Config{Vendor: slowVendor{wait: 4 * wt}, WriteTimeout: wt, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s.Handler(), WriteTimeout: wt}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/mcp"

	status, _, body := sendModern(t, url, "slow", `{}`)
	if status != http.StatusOK || !strings.Contains(string(body), `"text":"done"`) {
		t.Fatalf("HTTP %d %q", status, body)
	}
}
