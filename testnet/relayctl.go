package testnet

import (
	"context"
	"errors"
	"time"
)

// StopRelay stops the stack's relay (SIGTERM, then SIGKILL after 10 s) and
// returns once it is gone: a relay outage, for tests and the soak run of
// clients and servers that must reconnect. Its events are lost (it keeps
// them in memory). Idempotent: a relay already stopped is not an error.
// Not for the shared stack (teststack): other packages use its relay.
func (s *Stack) StopRelay() error {
	r := s.Info.Relay
	if err := r.stop(10 * time.Second); err != nil {
		return &ComponentError{Component: "relay", Log: r.Log, Err: err}
	}
	s.logf("stopped relay (pid %d)", r.PID)
	return nil
}

// StartRelay starts the stack's relay again, on the same address with the
// same command line, after StopRelay, and returns once it answers NIP-11.
// The new process is recorded in testnet.json. It is tied to this process
// (SIGTERM when it dies) like the stack's other processes when this Stack
// started them without Options.Detach; otherwise (a detached stack, or
// one reattached with Load) it outlives this process. A relay still
// running is left as it is (StartRelay waits until it answers).
func (s *Stack) StartRelay(ctx context.Context) error {
	r := &s.Info.Relay
	if !r.Alive() {
		if len(r.Cmd) == 0 {
			return &ComponentError{Component: "relay", Log: r.Log, Err: errors.New("no command line recorded")}
		}
		p, err := spawn(r.Cmd[0], r.Cmd[1:], r.Log, s.owned && !s.detach)
		if err != nil {
			return &ComponentError{Component: "relay", Log: r.Log, Err: err}
		}
		r.Proc = p
		s.record()
	}
	if err := s.waitService(ctx, "relay", r.Proc, "http://"+r.Listen, map[string]string{"Accept": "application/nostr+json"}); err != nil {
		return err
	}
	s.logf("relay ready at %s (pid %d)", r.URL, r.PID)
	return nil
}
