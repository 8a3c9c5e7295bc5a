package ledger_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// recorder is a vend.Observer that keeps the ledger's changes.
type recorder struct {
	vend.NopObserver
	mu      sync.Mutex
	changes []string
	commits int
}

func (r *recorder) LedgerChanged(cs []vend.Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		switch c.What {
		case vend.ChangeCall:
			r.changes = append(r.changes, fmt.Sprintf("call %d %s/%s %s>%s", c.Call, c.Server, c.Tool, c.CallFrom, c.CallTo))
		case vend.ChangePayment:
			r.changes = append(r.changes, fmt.Sprintf("payment %s %s>%s %d", c.Backend, c.PayFrom, c.PayTo, c.Amount))
		case vend.ChangeRefund:
			r.changes = append(r.changes, fmt.Sprintf("refund %s %d", c.Backend, c.Amount))
		}
	}
}

func (r *recorder) LedgerCommit(time.Duration, int) {
	r.mu.Lock()
	r.commits++
	r.mu.Unlock()
}

func (r *recorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := strings.Join(r.changes, "\n")
	r.changes = nil
	return s
}

// The Observer hears each committed state change once, in order, and
// nothing of a write that was refused (rolled back).
func TestObserverHearsCommittedChanges(t *testing.T) {
	rec := &recorder{}
	l, err := ledger.OpenForTest(t, context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	c, p := quote(t, l, 1)
	if _, err := l.SettlePayment(ctx, vend.Settlement{Ref: p.Ref, Amount: 22_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartExecution(ctx, c.ID, c.Binding(), c.Released(vend.SchemeInvoice)); err != nil {
		t.Fatal(err)
	}
	if err := l.Fail(ctx, c.ID, vend.Result{IsError: true, Body: []byte(`{}`)}, "boom"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(ctx, c.ID, "boom"); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"call 1 demo/echo >quoted",
		"call 1 demo/echo quoted>awaiting_payment",
		"payment lnd >open 21000",
		"payment lnd open>settled 22000",
		"call 1 demo/echo awaiting_payment>paid",
		"call 1 demo/echo paid>executing",
		"call 1 demo/echo executing>failed",
		"call 1 demo/echo failed>refunded",
		"refund lnd 22000",
	}, "\n")
	if got := rec.take(); got != want {
		t.Fatalf("changes:\n%s\nwant:\n%s", got, want)
	}
	// Refused: the call is refunded already. Nothing was committed.
	if err := l.Deliver(ctx, c.ID, vend.Result{Body: []byte(`{}`)}); err == nil {
		t.Fatal("delivered a refunded call")
	}
	if _, err := l.RecordPayment(ctx, c.ID, newPayment(1)); err == nil {
		t.Fatal("recorded a payment twice")
	}
	// Refused after a change in the same write: call 2 moved to
	// awaiting_payment, then its payment's ref was taken. Rolled back,
	// so not heard.
	c2, _, err := l.RecordCall(ctx, newCall(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.RecordPayment(ctx, c2.ID, newPayment(1)); err == nil {
		t.Fatal("recorded a payment ref twice")
	}
	if got := rec.take(); got != "call 2 demo/echo >quoted" {
		t.Fatalf("refused writes reported changes:\n%s", got)
	}
	if rec.commits == 0 {
		t.Fatal("no commit reported")
	}
}
