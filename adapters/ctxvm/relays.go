package ctxvm

import (
	"slices"
	"sync"
)

// RelayStatus is the state of the main subscription (to every request)
// on one relay.
type RelayStatus struct {
	URL string
	// Subscribed: the relay sent the end of its stored events, and the
	// subscription has not ended since.
	Subscribed bool
	// Err is why it is not subscribed, once an attempt failed ("" while
	// the first is under way, or when subscribed).
	Err string
}

// relayStates tracks the main subscription on each relay (see Settled).
type relayStates struct {
	mu      sync.Mutex
	st      map[string]*relayState
	left    int           // relays whose first attempt has not ended
	settled chan struct{} // closed when left is 0
	up      chan struct{} // closed at the first relay subscribed
	upOnce  sync.Once
}

// relayState is one relay's status, and whether its first attempt ended.
type relayState struct {
	RelayStatus
	settled bool
}

// init makes the states of urls, each not settled (New calls it).
func (r *relayStates) init(urls []string) {
	r.st = make(map[string]*relayState, len(urls))
	for _, u := range urls {
		if r.st[u] == nil {
			r.st[u] = &relayState{RelayStatus: RelayStatus{URL: u}}
			r.left++
		}
	}
	r.settled, r.up = make(chan struct{}), make(chan struct{})
}

// set records relay url's new state; the first time, it counts the
// relay as settled.
func (r *relayStates) set(url string, subscribed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st[url]
	if st == nil {
		return
	}
	st.Subscribed, st.Err = subscribed, ""
	if err != nil {
		st.Err = err.Error()
	}
	if !st.settled {
		st.settled = true
		if r.left--; r.left == 0 {
			close(r.settled)
		}
	}
	if subscribed {
		r.upOnce.Do(func() { close(r.up) })
	}
}

// Settled is closed once the main subscription on every relay has had
// its end of stored events or a first failure (see RelayStates):
// requests published after that reach the server through every relay
// then subscribed. Up is closed once one relay is subscribed. For serve's
// "serving" line, readiness probes and tests.
func (s *Server) Settled() <-chan struct{} { return s.relays.settled }

// Up is closed once the main subscription on one relay has had its end
// of stored events.
func (s *Server) Up() <-chan struct{} { return s.relays.up }

// RelayStates returns the state of the main subscription on each relay,
// in Config.Relays' order.
func (s *Server) RelayStates() []RelayStatus {
	s.relays.mu.Lock()
	defer s.relays.mu.Unlock()
	out := make([]RelayStatus, 0, len(s.relays.st))
	for _, u := range s.cfg.Relays {
		if st := s.relays.st[u]; st != nil && !slices.ContainsFunc(out, func(o RelayStatus) bool { return o.URL == u }) {
			out = append(out, st.RelayStatus)
		}
	}
	return out
}

// relaySubscribed notes the main subscription's end of stored events on
// url.
func (s *Server) relaySubscribed(url string) { s.relays.set(url, true, nil) }

// relayFailed notes that lane l could not subscribe on url, or that its
// subscription ended; only the main subscription's state is kept.
func (s *Server) relayFailed(l lane, url string, err error) {
	if l == laneMain {
		s.relays.set(url, false, err)
	}
}
