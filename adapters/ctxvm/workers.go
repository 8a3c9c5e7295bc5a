package ctxvm

import (
	"sync"
	"sync/atomic"
	"time"
)

// workerIdle is how long a worker waits for the next request before it
// ends.
const workerIdle = 10 * time.Second

// workers runs Run's requests on goroutines that serve one request after
// another. A goroutine per request started with a small stack and grew
// it on every request (the JSON decoders, the schema validator and the
// ledger's driver go deep): copying stacks was 5 % of capvend's CPU per
// free call. A worker keeps its grown stack for the next request.
//
// The pool is elastic: a request finding no idle worker gets a new one,
// so a request waiting long (for a payment, an elicitation) never holds
// up another (Run's slots bound how many run at once). A worker idle for
// workerIdle ends, and every worker ends once stop is called.
type workers struct {
	idle time.Duration
	next chan func() // unbuffered: a send succeeds only to an idle worker
	done chan struct{}
	wg   sync.WaitGroup

	started atomic.Int64 // workers started, for tests
}

func newWorkers(idle time.Duration) *workers {
	return &workers{idle: idle, next: make(chan func()), done: make(chan struct{})}
}

// run runs f on an idle worker, or a new one.
func (w *workers) run(f func()) {
	select {
	case w.next <- f:
	default:
		w.wg.Add(1)
		w.started.Add(1)
		go w.work(f)
	}
}

func (w *workers) work(f func()) {
	defer w.wg.Done()
	t := time.NewTimer(w.idle)
	defer t.Stop()
	for {
		f()
		f = nil
		t.Reset(w.idle)
		select {
		case f = <-w.next:
		case <-t.C:
			return
		case <-w.done:
			return
		}
	}
}

// stop ends the idle workers and waits for them, and for the busy ones
// to finish. run must not be called after stop.
func (w *workers) stop() {
	close(w.done)
	w.wg.Wait()
}
