package cashu

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestCheckRoundIsBounded: a round of 20 due quotes asks the mint at most
// checkWorkers (8) at a time, and every quote once. The fake mint holds
// each answer until the batch of 8 it belongs to has arrived: with a
// larger bound a 9th request arrives during a batch (the maximum in
// flight exceeds 8); with a smaller one a batch never fills and the round
// does not end.
func TestCheckRoundIsBounded(t *testing.T) {
	const total = 20
	var (
		mu               sync.Mutex
		cond             = sync.NewCond(&mu)
		arrived, maxSeen int
		inflight         int
		abort            bool // the round gave up: let every answer go
		asked            = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Path[len("/v1/mint/quote/bolt11/"):]
		mu.Lock()
		arrived++
		inflight++
		asked[id]++
		maxSeen = max(maxSeen, inflight)
		batchEnd := min(((arrived-1)/checkWorkers+1)*checkWorkers, total)
		cond.Broadcast()
		for arrived < batchEnd && !abort {
			cond.Wait()
		}
		inflight--
		mu.Unlock()
		fmt.Fprintf(w, `{"quote":%q,"state":"UNPAID"}`, id)
	}))
	defer srv.Close()
	b := &Backend{
		cfg:     Config{PollInterval: time.Second, SafetyPoll: 5 * time.Second},
		mints:   []string{srv.URL},
		http:    srv.Client(),
		log:     slog.New(slog.DiscardHandler),
		now:     time.Now,
		watched: map[string]*watchedQuote{},
	}
	var due []*watchedQuote
	for i := range total {
		q := &watchedQuote{ref: fmt.Sprint("q", i), mint: srv.URL, busy: true, created: time.Now(), expiresAt: time.Now().Add(time.Hour)}
		b.watched[q.ref] = q
		due = append(due, q)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	checks, failures, err := b.checkRound(ctx, &wg, due, nil)
	mu.Lock()
	abort = true
	cond.Broadcast()
	mu.Unlock()
	wg.Wait()
	if err != nil {
		t.Fatalf("round: %v (a batch never filled: fewer than %d checks at a time?)", err, checkWorkers)
	}
	mu.Lock()
	defer mu.Unlock()
	if checks != total || failures != 0 || len(asked) != total {
		t.Fatalf("checks %d, failures %d, quotes asked %d; want %d, 0, %d", checks, failures, len(asked), total, total)
	}
	if maxSeen != checkWorkers {
		t.Fatalf("at most %d checks in flight, want %d", maxSeen, checkWorkers)
	}
	for _, q := range due {
		if q.busy {
			t.Errorf("%s still busy after its check", q.ref)
		}
	}
}
