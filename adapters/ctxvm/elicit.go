package ctxvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/capvend/capvend/vend"
)

// Elicitation: an upstream asking for input during a ContextVM call is
// relayed to the call's client as a JSON-RPC request of our own, under an
// id of our own (256 random bits, hex), and the client's JSON-RPC response
// with that id, from that client, is the answer (see docs/CONTEXTVM.md,
// Elicitation).

// DefaultElicitTimeout is how long a client has to answer an elicitation
// when Config.ElicitTimeout is 0.
const DefaultElicitTimeout = 10 * time.Minute

// Bounds of the elicitations waiting for an answer: beyond them, an
// upstream's elicitation fails at once (errElicitLimit).
const (
	maxElicitsPerClient = 4
	maxElicits          = 1000
)

const methodElicit = "elicitation/create"

// Why an elicitation got no answer (returned to the upstream, which
// cancels it; never sent to the client).
var (
	errElicitLimit   = errors.New("too many elicitations waiting for an answer")
	errElicitTimeout = errors.New("elicitation not answered in time")
	errElicitRefused = errors.New("the client answered the elicitation with an error")
	errElicitAnswer  = errors.New("the client's answer is not an ElicitResult")
	errElicitClosed  = errors.New("the call's answer is out already")
)

var answerDecline = json.RawMessage(`{"action":"decline"}`)

// elicitWait is one elicitation waiting for its client's answer.
type elicitWait struct {
	client string       // the only pubkey whose answer is taken
	answer chan message // buffered 1: the first answer
}

// elicitations is the bounded map of elicitations waiting for an answer,
// by our request id.
type elicitations struct {
	mu        sync.Mutex
	byID      map[string]*elicitWait
	perClient map[string]int
}

// add records a new elicitation of id for client, or returns
// errElicitLimit.
func (e *elicitations) add(id, client string) (*elicitWait, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byID == nil {
		e.byID, e.perClient = map[string]*elicitWait{}, map[string]int{}
	}
	if len(e.byID) >= maxElicits || e.perClient[client] >= maxElicitsPerClient {
		return nil, errElicitLimit
	}
	w := &elicitWait{client: client, answer: make(chan message, 1)}
	e.byID[id] = w
	e.perClient[client]++
	return w, nil
}

// take removes and returns the elicitation of id if client may answer
// it; nil if there is none, or it is another client's (then it stays).
// Exactly one of the answer and the waiter's end removes it.
func (e *elicitations) take(id, client string) *elicitWait {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.byID[id]
	if w == nil || w.client != client {
		return nil
	}
	delete(e.byID, id)
	if e.perClient[client]--; e.perClient[client] <= 0 {
		delete(e.perClient, client)
	}
	return w
}

// pending returns how many elicitations wait for an answer (tests).
func (e *elicitations) pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.byID)
}

// newElicitID returns a fresh unguessable request id: 32 random bytes, hex.
func newElicitID() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// elicitFunc is the vend.ElicitFunc of a ContextVM call r whose events go
// out through out.
func (s *Server) elicitFunc(r *request, out *outbox) vend.ElicitFunc {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		return s.elicit(ctx, r, out, params)
	}
}

// elicit asks r's client with elicitation/create and returns its
// ElicitResult. A client that did not declare the elicitation capability
// in its initialize, and params that are not a JSON object, are answered
// "decline" without asking. It fails when too many elicitations wait,
// when the request could not be published, when the client answers with
// a JSON-RPC error or something that is not an ElicitResult, after
// Config.ElicitTimeout, or when ctx ends.
func (s *Server) elicit(ctx context.Context, r *request, out *outbox, params json.RawMessage) (json.RawMessage, error) {
	client := r.ev.PubKey
	if !s.sess.canElicit(client) || !isObject(string(params)) || !json.Valid(params) {
		return answerDecline, nil
	}
	id, err := newElicitID()
	if err != nil {
		return nil, err
	}
	w, err := s.elicits.add(id, client)
	if err != nil {
		s.log.Warn("elicitation refused", logKeyClient, client, logKeyErr, err)
		return nil, err
	}
	defer s.elicits.take(id, client)
	sent := make(chan error, 1)
	if !out.request(id, methodElicit, params, sent) {
		return nil, errElicitClosed
	}
	timer := time.NewTimer(s.cfg.ElicitTimeout)
	defer timer.Stop()
	for {
		select {
		case err := <-sent:
			if err != nil {
				return nil, fmt.Errorf("elicitation not published: %w", err)
			}
			sent = nil
		case m := <-w.answer:
			return elicitResult(m)
		case <-timer.C:
			return nil, errElicitTimeout
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// elicitResult reads a client's response to elicitation/create: an
// ElicitResult {action, content?} (content only on accept), re-encoded
// with those members only.
func elicitResult(m message) (json.RawMessage, error) {
	if len(m.Error) > 0 && string(m.Error) != "null" {
		return nil, errElicitRefused
	}
	var res struct {
		Action  string          `json:"action"`
		Content json.RawMessage `json:"content,omitempty"`
	}
	if err := json.Unmarshal(m.Result, &res); err != nil {
		return nil, errElicitAnswer
	}
	switch res.Action {
	case "accept":
		if len(res.Content) > 0 && string(res.Content) != "null" && !isObject(string(res.Content)) {
			return nil, errElicitAnswer
		}
		if string(res.Content) == "null" {
			res.Content = nil
		}
	case "decline", "cancel":
		res.Content = nil
	default:
		return nil, errElicitAnswer
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, errElicitAnswer
	}
	return b, nil
}

// answerElicit hands a client's JSON-RPC response (a ContextVM message
// without a method) to the elicitation it answers. A response whose id is
// not one we are waiting for from this client is dropped.
func (s *Server) answerElicit(r *request) {
	var id string
	if err := json.Unmarshal(r.msg.ID, &id); err != nil || id == "" {
		s.log.Debug("nostr response dropped: not ours", logKeyEvent, r.ev.ID)
		return
	}
	if s.cfg.Encryption == EncryptionRequired && !r.encrypted {
		s.log.Debug("nostr response dropped: plaintext", logKeyEvent, r.ev.ID)
		return
	}
	w := s.elicits.take(id, r.ev.PubKey)
	if w == nil {
		s.log.Debug("nostr response dropped: no elicitation of this client waits for it", logKeyEvent, r.ev.ID, logKeyClient, r.ev.PubKey)
		return
	}
	w.answer <- r.msg // buffered, and taken once
}
