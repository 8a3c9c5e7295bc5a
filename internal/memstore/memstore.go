// Package memstore is an in-memory event store for the khatru relays that
// capvend's regtest stack and tests run. It stands in for eventstore's
// slicestore, which saves, deletes and queries its one slice without a
// common lock: a query running while an announcement is replaced reads
// the slice as it shifts, and returns one event twice and another not at
// all (seen as a flaky ctxvm TestUnannounce under -race). Here every
// operation holds one mutex, and a query copies its matches before it
// hands them out.
package memstore

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"
)

// DefaultLimit is the most events one query returns (a filter asking for
// more, or for no limit, gets this many).
const DefaultLimit = 500

// Store holds events in memory, newest first. The zero value is ready to
// use; it is safe for concurrent use.
type Store struct {
	mu     sync.Mutex
	events []*nostr.Event // newest first; ties by id, as slicestore
}

var (
	_ eventstore.Store   = (*Store)(nil)
	_ eventstore.Counter = (*Store)(nil)
)

// Init implements eventstore.Store; it does nothing.
func (s *Store) Init() error { return nil }

// Close implements eventstore.Store; it does nothing.
func (s *Store) Close() {}

// Attach makes rl store, query, count, delete and replace its events in s.
func (s *Store) Attach(rl *khatru.Relay) {
	rl.StoreEvent = append(rl.StoreEvent, s.SaveEvent)
	rl.QueryEvents = append(rl.QueryEvents, s.QueryEvents)
	rl.CountEvents = append(rl.CountEvents, s.CountEvents)
	rl.DeleteEvent = append(rl.DeleteEvent, s.DeleteEvent)
	rl.ReplaceEvent = append(rl.ReplaceEvent, s.ReplaceEvent)
}

// order sorts newest first, then by id descending (slicestore's order).
func order(a, b *nostr.Event) int {
	if c := cmp.Compare(b.CreatedAt, a.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(b.ID, a.ID)
}

// QueryEvents implements eventstore.Store: the events matching filter,
// newest first, at most filter.Limit (DefaultLimit when it is 0 or more),
// as they were when it was called.
func (s *Store) QueryEvents(ctx context.Context, filter nostr.Filter) (chan *nostr.Event, error) {
	limit := filter.Limit
	if limit > DefaultLimit || (limit == 0 && !filter.LimitZero) {
		limit = DefaultLimit
	}
	var out []*nostr.Event
	s.mu.Lock()
	for _, ev := range s.events {
		if len(out) == limit {
			break
		}
		if filter.Matches(ev) {
			out = append(out, ev)
		}
	}
	s.mu.Unlock()
	ch := make(chan *nostr.Event)
	go func() {
		defer close(ch)
		for _, ev := range out {
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// CountEvents implements eventstore.Counter.
func (s *Store) CountEvents(ctx context.Context, filter nostr.Filter) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, ev := range s.events {
		if filter.Matches(ev) {
			n++
		}
	}
	return n, nil
}

// SaveEvent implements eventstore.Store: eventstore.ErrDupEvent if evt is
// stored already.
func (s *Store) SaveEvent(ctx context.Context, evt *nostr.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.save(evt)
}

func (s *Store) save(evt *nostr.Event) error {
	i, found := slices.BinarySearchFunc(s.events, evt, order)
	if found {
		return eventstore.ErrDupEvent
	}
	s.events = slices.Insert(s.events, i, evt)
	return nil
}

// DeleteEvent implements eventstore.Store; deleting an event not stored
// does nothing.
func (s *Store) DeleteEvent(ctx context.Context, evt *nostr.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delete(evt)
	return nil
}

func (s *Store) delete(evt *nostr.Event) {
	if i, found := slices.BinarySearchFunc(s.events, evt, order); found {
		s.events = slices.Delete(s.events, i, i+1)
	}
}

// ReplaceEvent implements eventstore.Store: evt replaces the stored events
// of its kind and author (and d tag, for an addressable kind) that are
// older; if one is newer, evt is not stored. Atomic.
func (s *Store) ReplaceEvent(ctx context.Context, evt *nostr.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	filter := nostr.Filter{Kinds: []int{evt.Kind}, Authors: []string{evt.PubKey}}
	if nostr.IsAddressableKind(evt.Kind) {
		filter.Tags = nostr.TagMap{"d": []string{evt.Tags.GetD()}}
	}
	var older []*nostr.Event
	for _, prev := range s.events {
		if !filter.Matches(prev) {
			continue
		}
		if prev.CreatedAt < evt.CreatedAt || (prev.CreatedAt == evt.CreatedAt && prev.ID > evt.ID) {
			older = append(older, prev)
		} else {
			return nil // a newer one (or evt itself) is stored
		}
	}
	for _, prev := range older {
		s.delete(prev)
	}
	if err := s.save(evt); err != nil && err != eventstore.ErrDupEvent {
		return err
	}
	return nil
}
