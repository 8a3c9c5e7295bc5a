package ledger

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/capvend/capvend/vend"
)

// Group commit. Each commit with synchronous=FULL waits for one fsync of
// the WAL, and the disk does only a few thousand of those a second; a paid
// call is five commits. So concurrent callers' transactions share one: the
// writer goroutine (started by Open, stopped by Close) takes every write
// queued, runs each in a SAVEPOINT of one BEGIN IMMEDIATE transaction,
// commits once, and only then wakes the callers. Durability is unchanged:
// a caller is told its change succeeded only after the COMMIT that holds
// it returned, with the same fsync as before (a crash before that COMMIT
// loses the batch's changes, and none of their callers was told they
// were written). Atomicity per caller is unchanged too: a caller whose
// function fails is rolled back to its savepoint and gets its error
// alone, and the others' changes commit.

// maxBatch bounds the callers of one transaction, so one commit's wait
// stays short under a flood.
const maxBatch = 128

// ErrClosed is returned by writes to a closed ledger.
var ErrClosed = errors.New("ledger closed")

// writeReq is one caller's write transaction waiting for the writer.
type writeReq struct {
	ctx      context.Context
	fn       func(tx *wtx, now time.Time) error
	err      error
	panicked any           // what fn panicked with, raised again in the caller's goroutine
	done     chan struct{} // closed when err is final
	changes  []vend.Change // what fn changed, for the Observer once committed
}

func (r *writeReq) finish(err error) {
	r.err = err
	close(r.done)
}

// writeQueue holds the writes waiting for the writer goroutine.
type writeQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond // signaled when pending grows or closed is set
	pending []*writeReq
	closed  bool          // Close was called: no new writes
	stopped chan struct{} // closed when the writer goroutine returned; nil if never started
	off     bool          // batching is off: writes run one transaction each (see write)
	commits int           // batches taken, for the benchmark's writes/commit
	writes  int           // writes in them

	// beforeCommit, set by tests only, runs with the batch's savepoints
	// released and before its COMMIT; an error fails the commit.
	beforeCommit func() error
}

// startWriter starts the writer goroutine; Close stops it.
func (l *Ledger) startWriter() {
	q := &l.queue
	q.cond = sync.NewCond(&q.mu)
	q.stopped = make(chan struct{})
	go l.writer()
}

// stopWriter refuses new writes, lets the writer commit those queued
// before, and waits for it to return. Safe to call more than once.
func (l *Ledger) stopWriter() {
	q := &l.queue
	q.mu.Lock()
	q.closed = true
	stopped := q.stopped
	if q.cond != nil {
		q.cond.Broadcast()
	}
	q.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}

// enqueue hands fn to the writer and waits for its transaction to commit
// or fail. The wait does not end with ctx: once queued, the caller learns
// the truth (a ctx canceled before its turn makes fn not run).
func (l *Ledger) enqueue(ctx context.Context, fn func(tx *wtx, now time.Time) error) error {
	r := &writeReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	q := &l.queue
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return fmt.Errorf("ledger %s: %w", l.path, ErrClosed)
	}
	q.pending = append(q.pending, r)
	q.cond.Signal()
	q.mu.Unlock()
	<-r.done
	if r.panicked != nil {
		panic(r.panicked) // where it would have been without batching
	}
	return r.err
}

// writer commits the queued writes, a batch at a time, until Close.
func (l *Ledger) writer() {
	q := &l.queue
	defer close(q.stopped)
	for {
		q.mu.Lock()
		for len(q.pending) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.pending) == 0 {
			q.mu.Unlock()
			return // closed, and everything queued before is answered
		}
		// Let the callers that are ready to queue a write do so first:
		// the first one to queue made this goroutine runnable next, and
		// without the yield most batches would hold one or two writes
		// (BenchmarkPaidCall, 16 callers: 4 writes a commit on average
		// without it, 13 with it).
		q.mu.Unlock()
		runtime.Gosched()
		q.mu.Lock()
		n := min(len(q.pending), maxBatch)
		batch := make([]*writeReq, n)
		copy(batch, q.pending)
		rest := copy(q.pending, q.pending[n:])
		clear(q.pending[rest:]) // no references to answered writes
		q.pending = q.pending[:rest]
		q.commits++
		q.writes += n
		q.mu.Unlock()
		if again := l.commitBatch(batch); len(again) > 0 {
			q.mu.Lock()
			q.pending = append(again, q.pending...)
			q.mu.Unlock()
		}
	}
}

// commitBatch runs batch in one transaction, a savepoint per caller, and
// answers every caller except those it returns: when a caller's error
// ended the whole transaction (SQLite rolls a transaction back by itself
// on some I/O and out-of-memory errors), that caller gets its error and
// the others, whose changes were rolled back with it, must run again.
func (l *Ledger) commitBatch(batch []*writeReq) (again []*writeReq) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	failAll := func(rs []*writeReq, err error) {
		for _, r := range rs {
			r.finish(err)
		}
	}
	if l.wconn == nil {
		failAll(batch, fmt.Errorf("ledger %s: %w", l.path, ErrClosed))
		return nil
	}
	// The statements run without cancellation: a canceled statement
	// interrupts the connection, and SQLite then rolls back the whole
	// transaction, the other callers' changes with it.
	bg := context.Background()
	began := time.Now()
	if err := l.beginWrite(bg); err != nil {
		failAll(batch, l.fileError(err))
		return nil
	}
	ok := make([]*writeReq, 0, len(batch)) // run, waiting for the COMMIT
	// The callers whose own write failed wait for the COMMIT too: their
	// error may come from an earlier caller's change in this batch (a
	// payment already ended), and what they read once told must agree.
	type failure struct {
		r   *writeReq
		err error
	}
	var failed []failure
	for i, r := range batch {
		err, fatal := l.runSaved(r)
		switch {
		case fatal != nil:
			// The transaction is unusable or gone: nothing of this
			// batch is written. The callers that failed on its state
			// run again, with the others.
			l.rollback()
			for _, f := range failed {
				ok = append(ok, f.r)
			}
			if err != nil {
				r.finish(err)
				return append(ok, batch[i+1:]...)
			}
			failAll(append(ok, batch[i:]...), fatal)
			return nil
		case err != nil:
			failed = append(failed, failure{r, err})
		default:
			ok = append(ok, r)
		}
	}
	if err := l.commit(); err != nil {
		l.rollback()
		for _, f := range failed {
			ok = append(ok, f.r)
		}
		failAll(ok, err)
		return nil
	}
	l.committed(began, len(batch), ok)
	failAll(ok, nil)
	for _, f := range failed {
		f.r.finish(f.err)
	}
	return nil
}

// committed tells the Observer, if any, about a batch committed since
// began and the changes of its writes ok, before their callers are woken
// (a caller that returns sees its change counted).
func (l *Ledger) committed(began time.Time, writes int, ok []*writeReq) {
	if l.obs == nil {
		return
	}
	l.obs.LedgerCommit(time.Since(began), writes)
	for _, r := range ok {
		if len(r.changes) > 0 {
			l.obs.LedgerChanged(r.changes)
		}
	}
}

// runSaved runs r's function in a savepoint of the batch transaction. err
// is r's own error (its changes are rolled back to the savepoint); fatal,
// if set, means the batch transaction cannot go on: a savepoint statement
// failed, or r's error ended the transaction (then err is set too).
func (l *Ledger) runSaved(r *writeReq) (err, fatal error) {
	if err := r.ctx.Err(); err != nil {
		return l.fileError(err), nil
	}
	tx := &wtx{l: l, detached: true}
	r.changes = r.changes[:0] // a write run again (see commitBatch) starts anew
	if l.obs != nil {
		tx.changes = &r.changes
	}
	bg := context.Background()
	if _, err := tx.ExecContext(bg, "SAVEPOINT caller"); err != nil {
		return nil, l.fileError(err)
	}
	if err := r.run(tx, l.now().UTC()); err != nil {
		if !l.inTx() {
			return err, fmt.Errorf("ledger %s: the transaction ended on a caller's error: %w", l.path, err)
		}
		// ROLLBACK TO keeps the savepoint open; RELEASE ends it.
		if _, rerr := tx.ExecContext(bg, "ROLLBACK TO caller"); rerr != nil {
			return err, l.fileError(rerr)
		}
		if _, rerr := tx.ExecContext(bg, "RELEASE caller"); rerr != nil {
			return err, l.fileError(rerr)
		}
		return err, nil
	}
	if _, err := tx.ExecContext(bg, "RELEASE caller"); err != nil {
		return nil, l.fileError(err)
	}
	return nil, nil
}

// run calls r's function; a panic is its caller's (enqueue raises it
// again there), and an error for the batch: r's changes are rolled back.
func (r *writeReq) run(tx *wtx, now time.Time) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.panicked = p
			err = fmt.Errorf("panic in a ledger write: %v", p)
		}
	}()
	return r.fn(tx, now)
}

// commit commits the batch transaction (after the test hook, if any).
func (l *Ledger) commit() error {
	if h := l.queue.beforeCommit; h != nil {
		if err := h(); err != nil {
			return err
		}
	}
	return l.commitWrite(context.Background())
}

// rollback ends the batch transaction, if SQLite has not already.
func (l *Ledger) rollback() {
	if l.inTx() {
		// An error here leaves the connection inside a transaction;
		// the next BEGIN IMMEDIATE then fails, and its callers are told.
		l.wconn.ExecContext(context.Background(), "ROLLBACK")
	}
}

// inTx reports whether the writer connection is inside a transaction.
func (l *Ledger) inTx() bool {
	in := true // if we cannot tell, assume so: ROLLBACK is then tried
	l.wconn.Raw(func(dc any) error {
		if c, ok := dc.(*sqlite3.SQLiteConn); ok {
			in = !c.AutoCommit()
		} else if pin, ok := pgInTx(dc); ok {
			in = pin
		}
		return nil
	})
	return in
}
