package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/capvend/capvend/vend"
)

func testCall(i int) vend.NewCall {
	h := sha256.Sum256([]byte(fmt.Sprint("args", i)))
	return vend.NewCall{
		Transport: "mcp-http", Client: "client-1", RequestID: fmt.Sprint("req-", i),
		Server: "demo", Name: "echo", ArgsHash: hex.EncodeToString(h[:]), Price: 21_000, Idempotent: true,
	}
}

func testPayment(ref string) vend.NewPayment {
	return vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref, Bolt11: "lnbcrt210n1test",
		Amount: 21_000, ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// holdWriter makes the writer goroutine run a write that waits until
// release is called, so that the writes queued meanwhile make the next
// batch. It returns once the writer holds.
func holdWriter(t *testing.T, l *Ledger) (release func()) {
	t.Helper()
	entered, open := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- l.write(context.Background(), func(*wtx, time.Time) error {
			close(entered)
			<-open
			return nil
		})
	}()
	<-entered
	return func() {
		close(open)
		if err := <-errc; err != nil {
			t.Errorf("the write holding the writer: %v", err)
		}
	}
}

// waitQueued returns once n writes wait for the writer.
func waitQueued(t *testing.T, l *Ledger, n int) {
	t.Helper()
	hang := time.Now().Add(time.Minute) // a hang guard, not a timing
	for {
		l.queue.mu.Lock()
		k := len(l.queue.pending)
		l.queue.mu.Unlock()
		if k >= n {
			return
		}
		if time.Now().After(hang) {
			t.Fatalf("%d writes queued, waited for %d", k, n)
		}
		runtime.Gosched()
	}
}

// batchOf runs the writes concurrently while the writer is held, so that
// they make one batch, and returns each one's error and how many batches
// the writer took for them.
func batchOf(t *testing.T, l *Ledger, writes ...func() error) (errs []error, batches int) {
	t.Helper()
	release := holdWriter(t, l)
	commits, _ := l.BatchStatsForTest()
	errs = make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w()
		}()
		waitQueued(t, l, i+1) // in this order
	}
	release()
	wg.Wait()
	after, _ := l.BatchStatsForTest()
	return errs, after - commits
}

// In one batch (one transaction), a caller whose change breaks a schema
// rule gets its error alone, and none of its change is written (its
// savepoint is rolled back); the others' changes commit, those before it
// in the batch and those after.
func TestBatchOneCallersErrorIsItsAlone(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// fail returns a write that fails on a schema rule after
		// changing something, and a check that the change is gone.
		fail func(t *testing.T, l *Ledger) (write func() error, isItsError func(error) bool, gone func() bool)
	}{
		{"unique payment ref (constraint)", func(t *testing.T, l *Ledger) (func() error, func(error) bool, func() bool) {
			x, _, err := l.RecordCall(ctx, testCall(100))
			if err != nil {
				t.Fatal(err)
			}
			y, _, err := l.RecordCall(ctx, testCall(101))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.RecordPayment(ctx, y.ID, testPayment("ref-taken")); err != nil {
				t.Fatal(err)
			}
			// RecordPayment moves x to awaiting_payment, then its
			// payment's ref is refused as a duplicate.
			write := func() error { _, err := l.RecordPayment(ctx, x.ID, testPayment("ref-taken")); return err }
			is := func(err error) bool { return errors.Is(err, vend.ErrDuplicatePayment) }
			gone := func() bool {
				c, err := l.Call(ctx, x.ID)
				return err == nil && c.State == vend.CallQuoted
			}
			return write, is, gone
		}},
		{"illegal call transition (trigger)", func(t *testing.T, l *Ledger) (func() error, func(error) bool, func() bool) {
			x, _, err := l.RecordCall(ctx, testCall(100))
			if err != nil {
				t.Fatal(err)
			}
			write := func() error {
				return l.write(ctx, func(tx *wtx, now time.Time) error {
					if _, err := tx.ExecContext(ctx, "UPDATE calls SET reason = 'half done' WHERE id = ?", x.ID); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, "UPDATE calls SET state = 'delivered' WHERE id = ?", x.ID)
					return err
				})
			}
			gone := func() bool {
				c, err := l.Call(ctx, x.ID)
				return err == nil && c.State == vend.CallQuoted && c.Reason == ""
			}
			return write, isConstraint, gone
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := openTemp(t)
			failing, isItsError, gone := tc.fail(t, l)
			var writes []func() error
			for i := range 8 {
				if i == 4 {
					writes = append(writes, failing)
				}
				writes = append(writes, func() error { _, _, err := l.RecordCall(ctx, testCall(i)); return err })
			}
			errs, batches := batchOf(t, l, writes...)
			if batches != 1 {
				t.Fatalf("the %d writes took %d transactions, want one", len(writes), batches)
			}
			for i, err := range errs {
				if i == 4 {
					if !isItsError(err) {
						t.Fatalf("the failing write: %v", err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("write %d of the batch got %v: the failing write's error is its own", i, err)
				}
			}
			if !gone() {
				t.Fatal("the failing write's change before its error was committed")
			}
			for i := range 8 {
				if _, err := l.CallByRequest(ctx, "mcp-http", "client-1", fmt.Sprint("req-", i)); err != nil {
					t.Fatalf("call %d of the batch: %v", i, err)
				}
			}
		})
	}
}

// A caller whose context is done before its turn in the batch is told
// so, and its write does not run; the others commit.
func TestBatchCanceledCallerDoesNotRun(t *testing.T) {
	ctx := context.Background()
	l := openTemp(t)
	gone, cancel := context.WithCancel(ctx)
	errs, _ := batchOf(t, l,
		func() error { _, _, err := l.RecordCall(ctx, testCall(1)); return err },
		func() error {
			cancel() // queued, not run: the writer is held
			_, _, err := l.RecordCall(gone, testCall(2))
			return err
		},
		func() error { _, _, err := l.RecordCall(ctx, testCall(3)); return err },
	)
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], context.Canceled) {
		t.Fatalf("errors %v, want nil, context canceled, nil", errs)
	}
	if _, err := l.CallByRequest(ctx, "mcp-http", "client-1", "req-2"); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("the canceled caller's call: %v, want not found", err)
	}
}

// When a caller's error ends the whole transaction (SQLite does so on
// some I/O and out-of-memory errors), that caller gets its error and the
// others of the batch, those whose change was rolled back with it
// included, run again in a new transaction and commit.
func TestBatchLostTransactionRunsTheOthersAgain(t *testing.T) {
	ctx := context.Background()
	l := openTemp(t)
	ioErr := errors.New("disk I/O error (simulated)")
	errs, batches := batchOf(t, l,
		func() error { _, _, err := l.RecordCall(ctx, testCall(1)); return err },
		func() error {
			return l.write(ctx, func(tx *wtx, now time.Time) error {
				if _, err := l.wconn.ExecContext(ctx, "ROLLBACK"); err != nil {
					return err
				}
				return ioErr
			})
		},
		func() error { _, _, err := l.RecordCall(ctx, testCall(3)); return err },
	)
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], ioErr) {
		t.Fatalf("errors %v, want nil, the simulated I/O error, nil", errs)
	}
	if batches != 2 {
		t.Fatalf("%d transactions, want 2 (the lost one and the one run again)", batches)
	}
	for _, req := range []string{"req-1", "req-3"} {
		if _, err := l.CallByRequest(ctx, "mcp-http", "client-1", req); err != nil {
			t.Fatalf("%s: %v", req, err)
		}
	}
}

// No caller is told its write succeeded unless the COMMIT holding it
// did: when the commit fails, every caller of the batch gets the error
// and nothing of the batch is in the file.
func TestBatchFailedCommitFailsEveryCaller(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l, err := OpenForTest(t, ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	commitErr := errors.New("commit failed (simulated)")
	commits := 0 // the writer's own: it alone calls the hook
	l.queue.beforeCommit = func() error {
		if commits++; commits == 1 {
			return nil // the write holding the writer
		}
		return commitErr
	}
	var writes []func() error
	for i := range 6 {
		writes = append(writes, func() error { _, _, err := l.RecordCall(ctx, testCall(i)); return err })
	}
	release := holdWriter(t, l)
	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w()
		}()
	}
	waitQueued(t, l, len(writes))
	release()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, commitErr) {
			t.Fatalf("write %d: %v, want the commit's error", i, err)
		}
	}
	l.queue.beforeCommit = nil
	l.Close()
	l, err = OpenForTest(t, ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if calls, err := l.CallsIn(ctx, vend.CallQuoted); err != nil || len(calls) != 0 {
		t.Fatalf("after a failed commit the file holds %d calls (%v), want none", len(calls), err)
	}
}

// Close lets the batch being written and the writes queued before it
// commit, and tells their callers; a write after Close gets ErrClosed at
// once and writes nothing.
func TestCloseMidBatch(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capvend.db")
	l, err := OpenForTest(t, ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	release := holdWriter(t, l)
	const queued = 6
	errs := make([]error, queued)
	var wg sync.WaitGroup
	for i := range queued {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = l.RecordCall(ctx, testCall(i))
		}()
	}
	waitQueued(t, l, queued)
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	for { // until Close refuses new writes
		l.queue.mu.Lock()
		c := l.queue.closed
		l.queue.mu.Unlock()
		if c {
			break
		}
		runtime.Gosched()
	}
	if _, _, err := l.RecordCall(ctx, testCall(99)); !errors.Is(err, ErrClosed) {
		t.Fatalf("a write after Close: %v, want ErrClosed", err)
	}
	release()
	wg.Wait()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	l, err = OpenForTest(t, ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i, err := range errs {
		_, ondisk := l.CallByRequest(ctx, "mcp-http", "client-1", fmt.Sprint("req-", i))
		if err != nil || ondisk != nil {
			t.Fatalf("write %d queued before Close: %v; reading it back: %v", i, err, ondisk)
		}
	}
	if _, err := l.CallByRequest(ctx, "mcp-http", "client-1", "req-99"); !errors.Is(err, vend.ErrNotFound) {
		t.Fatalf("the write after Close is on disk: %v", err)
	}
}

// A write that panics panics in its caller's goroutine, as it did before
// batching, and changes nothing; the writer and the other callers go on.
func TestBatchPanicIsTheCallers(t *testing.T) {
	ctx := context.Background()
	l := openTemp(t)
	errs, _ := batchOf(t, l,
		func() error { _, _, err := l.RecordCall(ctx, testCall(1)); return err },
		func() (err error) {
			defer func() {
				if p := recover(); p != "boom" {
					err = fmt.Errorf("recovered %v, want boom", p)
				}
			}()
			return l.write(ctx, func(tx *wtx, now time.Time) error {
				if _, err := tx.ExecContext(ctx, "UPDATE calls SET reason = 'half done'"); err != nil {
					return err
				}
				panic("boom")
			})
		},
		func() error { _, _, err := l.RecordCall(ctx, testCall(3)); return err },
	)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	c, err := l.CallByRequest(ctx, "mcp-http", "client-1", "req-1")
	if err != nil || c.Reason != "" {
		t.Fatalf("call 1: reason %q (%v): the panicking write's change was kept", c.Reason, err)
	}
	if _, _, err := l.RecordCall(ctx, testCall(4)); err != nil {
		t.Fatalf("a write after the panic: %v", err)
	}
}

// A caller whose write fails because of an earlier caller's change in the
// same batch is told only once that change is committed: what it then
// reads agrees with its error. (It was woken at once, and read the state
// from before the batch: a payment it was told had ended was still open.)
func TestBatchFailedCallerWakesAfterTheCommit(t *testing.T) {
	ctx := context.Background()
	l, err := OpenForTest(t, ctx, filepath.Join(t.TempDir(), "capvend.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, _, err := l.RecordCall(ctx, testCall(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.RecordPayment(ctx, c.ID, testPayment("ref-1")); err != nil {
		t.Fatal(err)
	}
	seen := make(chan vend.PaymentState, 1) // what the second caller read
	commits := 0
	l.queue.beforeCommit = func() error {
		if commits++; commits == 2 { // the batch of the two ends
			select {
			case <-seen: // woken before the commit: the test fails below
				t.Error("the failed caller was told before the batch committed")
			case <-time.After(500 * time.Millisecond):
				// Not woken: the commit goes on. (A bound, not a timing:
				// a caller woken too early reads within microseconds.)
			}
		}
		return nil
	}
	end := func() error { _, err := l.EndPayment(ctx, "ref-1", vend.PaymentCanceled, "test"); return err }
	errs, _ := batchOf(t, l,
		end,
		func() error {
			err := end()
			p, perr := l.Payment(ctx, "ref-1")
			if perr != nil {
				t.Error(perr)
			}
			select {
			case seen <- p.State:
			default:
			}
			if err != nil && p.State != vend.PaymentCanceled {
				t.Errorf("told %v, but the payment reads %s", err, p.State)
			}
			return err
		})
	if errs[0] != nil || errs[1] == nil {
		t.Fatalf("errors %v, want the first end to succeed and the second to fail", errs)
	}
}
