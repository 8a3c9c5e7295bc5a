package ctxvm

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestWorkersReuseAndGrow(t *testing.T) {
	w := newWorkers(time.Minute)
	defer w.stop()
	// One at a time: one goroutine serves them all.
	for range 50 {
		done := make(chan struct{})
		w.run(func() { close(done) })
		<-done
		time.Sleep(time.Millisecond) // back to idle
	}
	if n := w.started.Load(); n != 1 {
		t.Fatalf("%d goroutines serve 50 sequential requests, want 1", n)
	}
	// A request that waits never holds up the next: the pool grows.
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	var ran atomic.Int32
	for range 5 {
		w.run(func() { <-release; ran.Add(1) })
	}
	quick := make(chan struct{})
	w.run(func() { close(quick) })
	select {
	case <-quick:
	case <-time.After(10 * time.Second):
		t.Fatal("a request waited for five blocked ones")
	}
	if n := w.started.Load(); n != 6 {
		t.Fatalf("%d workers for 5 waiting requests and one more, want 6 (the idle one and 5 new)", n)
	}
	close(release)
	for ran.Load() != 5 {
		time.Sleep(time.Millisecond)
	}
}

func TestWorkersEnd(t *testing.T) {
	w := newWorkers(20 * time.Millisecond)
	for range 3 {
		w.run(func() { time.Sleep(5 * time.Millisecond) })
	}
	ended := make(chan struct{})
	go func() { w.wg.Wait(); close(ended) }()
	select {
	case <-ended: // idle workers end by themselves
	case <-time.After(10 * time.Second):
		t.Fatal("idle workers did not end")
	}
	// stop ends the idle ones at once, and waits for busy ones.
	w = newWorkers(time.Hour)
	var finished atomic.Bool
	w.run(func() {})
	w.run(func() { time.Sleep(30 * time.Millisecond); finished.Store(true) })
	w.stop()
	if !finished.Load() {
		t.Fatal("stop returned before a busy worker finished")
	}
}
