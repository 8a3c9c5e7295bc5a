package mcpfront

import (
	"container/list"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"
)

// JSON-RPC codes of the transport's own refusals, as the MCP SDKs send
// them (the TypeScript SDK answers an unknown session with -32001 and other
// transport errors with -32000).
const (
	codeTransport       = -32000
	codeSessionNotFound = -32001
)

// Session defaults (Config.SessionIdle, Config.MaxSessions,
// Config.MaxSessionsPerSource).
const (
	DefaultSessionIdle          = 30 * time.Minute
	DefaultMaxSessions          = 10_000
	DefaultMaxSessionsPerSource = 100
)

// sessionIDPrefix starts every session id (as mcp-go's own ids do); 32
// random bytes follow, base64url.
const sessionIDPrefix = "mcp-session-"

var (
	// errSessionsFull: every one of MaxSessions sessions has a request in
	// flight, so none can be evicted for a new one (503).
	errSessionsFull = errors.New("too many sessions")
	// errSourceFull: the source asking holds MaxSessionsPerSource
	// sessions, each with a request in flight (429).
	errSourceFull = errors.New("too many sessions from one source")
	// errUnknownSession: a session id this Server did not issue, or
	// issued and then ended (expired, evicted, terminated by DELETE).
	errUnknownSession = errors.New("unknown session")
)

// sessions are the MCP sessions (protocols before 2026-07-28) this Server
// issued. A session is live from its initialize until DELETE, until it was
// idle (no request in flight) for idle, or until it is evicted. Each
// session belongs to the source whose initialize made it (the Source of
// limits: "ip:<address>" or "id:<client id>"), so that one source cannot
// take the others' sessions:
//
//   - a source holding perSource sessions evicts its own idle the
//     longest for a new one, and is refused (429) when all of its have a
//     request in flight;
//   - when max sessions are live, a new initialize evicts the session idle
//     the longest of the source holding the most live sessions (of those
//     with an idle one; at equal counts, the one idle the longest of
//     all), and is refused (503) when every session has a request in
//     flight. A flood from one source so evicts only its own sessions,
//     while it holds more than any other.
//
// Ids are 256 random bits; nothing else is accepted.
type sessions struct {
	idle      time.Duration
	max       int
	perSource int
	now       func() time.Time // the clock; tests move it

	mu       sync.Mutex
	byID     map[string]*session
	lru      *list.List // sessions with no request in flight, least recently active at the back
	bySource map[string]*sourceSessions
}

type session struct {
	id       string
	source   string        // who made it (see sessions)
	shared   time.Time     // the expiry last written to Config.Sessions (zero: none)
	last     time.Time     // the end of its last request (or its start)
	inflight int           // requests being served
	elem     *list.Element // its place in lru; nil while a request is in flight
	selem    *list.Element // its place in its source's lru; nil likewise
}

// sourceSessions are one source's live sessions: how many, and its idle
// ones, least recently active at the back.
type sourceSessions struct {
	n   int
	lru *list.List
}

func newSessions(idle time.Duration, max, perSource int) *sessions {
	return &sessions{idle: idle, max: max, perSource: perSource, now: time.Now,
		byID: map[string]*session{}, lru: list.New(), bySource: map[string]*sourceSessions{}}
}

// newSessionID returns a fresh session id.
func newSessionID() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return sessionIDPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// admit issues a new session of source for an initialize request, with
// that request in flight (call end when it is answered). It returns the
// ids of the sessions that expired or were evicted, for the caller to
// clean up (outside any lock); errSourceFull or errSessionsFull if none
// could be evicted.
func (ss *sessions) admit(source string) (id string, gone []string, err error) {
	id, err = newSessionID()
	if err != nil {
		return "", nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	gone, err = ss.addLocked(id, source)
	if err != nil {
		return "", gone, err
	}
	return id, gone, nil
}

// addLocked makes session id of source live with a request in flight,
// evicting an idle session if a bound is reached (see sessions): the ids
// of the sessions that expired or were evicted; errSourceFull or
// errSessionsFull if none could be evicted. ss.mu is held.
func (ss *sessions) addLocked(id, source string) (gone []string, err error) {
	gone = ss.sweep(nil)
	src := ss.bySource[source]
	if src != nil && src.n >= ss.perSource {
		back := src.lru.Back()
		if back == nil {
			return gone, errSourceFull
		}
		victim := back.Value.(*session)
		ss.remove(victim)
		gone = append(gone, victim.id)
	}
	if len(ss.byID) >= ss.max {
		victim := ss.victim()
		if victim == nil {
			return gone, errSessionsFull
		}
		ss.remove(victim)
		gone = append(gone, victim.id)
	}
	if src = ss.bySource[source]; src == nil {
		src = &sourceSessions{lru: list.New()}
		ss.bySource[source] = src
	}
	src.n++
	ss.byID[id] = &session{id: id, source: source, last: ss.now(), inflight: 1}
	return gone, nil
}

// victim is the session to evict at the global bound: the idle session
// idle the longest of the source holding the most live sessions (of
// those with an idle one); of sources holding as many, the one whose
// session has been idle the longest. nil if no session is idle.
func (ss *sessions) victim() *session {
	var v *session
	vn := 0
	for _, src := range ss.bySource {
		back := src.lru.Back()
		if back == nil {
			continue
		}
		s := back.Value.(*session)
		if v == nil || src.n > vn || src.n == vn && s.last.Before(v.last) {
			v, vn = s, src.n
		}
	}
	return v
}

// adopt makes id, a session another instance issued (Config.Sessions
// says it is live), live here as source's with a request in flight, as
// admit does a new one; begin it instead if it is live here already.
func (ss *sessions) adopt(id, source string) (gone []string, err error) {
	ss.mu.Lock()
	if ss.byID[id] != nil {
		ss.mu.Unlock()
		return ss.begin(id)
	}
	defer ss.mu.Unlock()
	return ss.addLocked(id, source)
}

// toShare reports whether session id's expiry is to be written to
// Config.Sessions now (never written, or half its idle time passed since),
// and if so marks it written until the returned expiry.
func (ss *sessions) toShare(id string) (expires time.Time, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	now := ss.now()
	if s == nil || (!s.shared.IsZero() && s.shared.Sub(now) > ss.idle/2) {
		return time.Time{}, false
	}
	s.shared = now.Add(ss.idle)
	return s.shared, true
}

// unshare forgets that session id's expiry was written (the write failed).
func (ss *sessions) unshare(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.byID[id]; s != nil {
		s.shared = time.Time{}
	}
}

// begin marks a request of session id in flight: until end, the session
// neither expires nor is evicted. errUnknownSession if id is not live (an
// id found expired is ended now and returned in gone, with any others).
func (ss *sessions) begin(id string) (gone []string, err error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	gone = ss.sweep(nil)
	s := ss.byID[id]
	if s == nil {
		return gone, errUnknownSession
	}
	if s.elem != nil && ss.expired(s) {
		ss.remove(s)
		return append(gone, id), errUnknownSession
	}
	ss.unidle(s)
	s.inflight++
	return gone, nil
}

// end ends a request begin (or admit) started. The session's idle time
// counts from now when it was its last request in flight. A session that
// was terminated meanwhile stays ended.
func (ss *sessions) end(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	if s == nil || s.inflight == 0 {
		return
	}
	s.inflight--
	if s.inflight == 0 {
		s.last = ss.now()
		s.elem = ss.lru.PushFront(s)
		if src := ss.bySource[s.source]; src != nil {
			s.selem = src.lru.PushFront(s)
		}
	}
}

// live reports whether id is a live session (not expired).
func (ss *sessions) live(id string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	return s != nil && !(s.elem != nil && ss.expired(s))
}

// terminate ends session id (DELETE). It reports whether it was live.
func (ss *sessions) terminate(id string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	if s == nil {
		return false
	}
	ss.remove(s)
	return true
}

// count returns the number of live (or not yet swept) sessions.
func (ss *sessions) count() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.byID)
}

// sweep ends the sessions idle for longer than ss.idle, appending their
// ids to gone. The lru list is in order of last activity, so this stops at
// the first session still fresh: amortised O(1) per request.
func (ss *sessions) sweep(gone []string) []string {
	for back := ss.lru.Back(); back != nil; back = ss.lru.Back() {
		s := back.Value.(*session)
		if !ss.expired(s) {
			break
		}
		ss.remove(s)
		gone = append(gone, s.id)
	}
	return gone
}

func (ss *sessions) expired(s *session) bool { return ss.now().Sub(s.last) >= ss.idle }

// unidle takes s off the lists of idle sessions.
func (ss *sessions) unidle(s *session) {
	if s.elem != nil {
		ss.lru.Remove(s.elem)
		s.elem = nil
	}
	if s.selem != nil {
		ss.bySource[s.source].lru.Remove(s.selem)
		s.selem = nil
	}
}

func (ss *sessions) remove(s *session) {
	ss.unidle(s)
	delete(ss.byID, s.id)
	if src := ss.bySource[s.source]; src != nil {
		if src.n--; src.n <= 0 {
			delete(ss.bySource, s.source)
		}
	}
}

// ctxNewSession carries the id admit issued for an initialize request to
// the session id manager mcp-go asks for it (see sessionManager.Generate).
type ctxNewSession struct{}

// sessionResolver gives mcp-go, per request, the session id manager that
// knows the id admitted for that request.
//
// mcp-go v1.2.1's default session id manager only checks an id's format.
// Ours knows the issued ids (Validate fails for any other: mcp-go answers
// 404), and the front checks every request itself before mcp-go sees it
// (serveSession), to answer with JSON-RPC bodies and to count requests in
// flight. mcp-go drops its own state of a session only on DELETE, so an
// expired or evicted session is sent a DELETE in process.
type sessionResolver struct{ s *Server }

func (r sessionResolver) ResolveSessionIdManager(req *http.Request) server.SessionIdManager {
	m := sessionManager{s: r.s}
	if req != nil {
		m.issued, _ = req.Context().Value(ctxNewSession{}).(string)
	}
	return m
}

// sessionManager is mcp-go's view of the sessions. The front's handler
// checks every request before mcp-go sees it (serveSession); this is the
// second lock on the same door.
type sessionManager struct {
	s      *Server
	issued string // the id admitted for this request, if it is an initialize
}

// Generate returns the id admitted for this initialize request. mcp-go
// calls it only for a legacy initialize, which serveSession admitted; any
// other caller gets an id that was never issued, so it is refused later.
func (m sessionManager) Generate() string {
	if m.issued != "" {
		return m.issued
	}
	id, err := newSessionID()
	if err != nil {
		return sessionIDPrefix + "unissued"
	}
	return id
}

// Validate refuses (404 in mcp-go) every id that is not a live session.
func (m sessionManager) Validate(id string) (isTerminated bool, err error) {
	if !m.s.sessions.live(id) {
		return false, errUnknownSession
	}
	return false, nil
}

// Terminate ends id (mcp-go's DELETE, or its own sweeps). Ending an id
// that is not live is allowed: the caller then only cleans up mcp-go's
// state of it.
func (m sessionManager) Terminate(id string) (isNotAllowed bool, err error) {
	m.s.sessions.terminate(id)
	return false, nil
}

// forget removes mcp-go's state of sessions that ended without a DELETE
// (expired, evicted): mcp-go keeps a registered session per initialize
// and cleans it up only on DELETE, so a DELETE is sent to it, in process.
func (s *Server) forget(ids []string) {
	for _, id := range ids {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodDelete, "/mcp", nil)
		if err != nil {
			continue
		}
		req.Header.Set(server.HeaderKeySessionID, id)
		s.http.ServeHTTP(discardResponse{h: http.Header{}}, req)
		s.log.Debug("mcp session ended", logKeyReason, "idle or evicted")
	}
}

// discardResponse is the ResponseWriter of forget's DELETEs.
type discardResponse struct{ h http.Header }

func (d discardResponse) Header() http.Header         { return d.h }
func (d discardResponse) Write(p []byte) (int, error) { return len(p), nil }
func (d discardResponse) WriteHeader(int)             {}

// serveSession applies the session rules to a request of a protocol
// before 2026-07-28 and, if it may go on, returns the session id it runs
// in (call done when it is answered) and the request to hand to mcp-go.
// Otherwise it has answered: 400 without a session id (except initialize),
// 404 for an id that is not a live session, 503 when no session can be
// made for an initialize. Every refusal has a JSON-RPC error body.
func (s *Server) serveSession(w http.ResponseWriter, r *http.Request, body []byte) (*http.Request, func(), bool) {
	var id string
	var gone []string
	var err error
	switch {
	case r.Method == http.MethodPost && isInitialize(body):
		id, gone, err = s.sessions.admit(s.source(r))
		if err == nil {
			r = r.WithContext(context.WithValue(r.Context(), ctxNewSession{}, id))
		}
	case r.Method == http.MethodPost || r.Method == http.MethodGet || r.Method == http.MethodDelete:
		id = r.Header.Get(server.HeaderKeySessionID)
		if id == "" {
			writeRPCError(w, http.StatusBadRequest, rpcID(body), codeTransport, "Bad Request: Mcp-Session-Id header is required")
			return nil, nil, false
		}
		gone, err = s.beginSession(r, id)
		if err == nil && r.Method == http.MethodDelete && s.cfg.Sessions != nil {
			// The client ends it: on every instance.
			if err := s.cfg.Sessions.EndSession(r.Context(), sessionHash(id)); err != nil {
				s.log.Warn("mcp session not ended in the shared store", logKeyErr, err)
			}
		}
	default:
		return r, func() {}, true // mcp-go refuses other methods
	}
	s.forget(gone)
	switch {
	case errors.Is(err, errUnknownSession):
		s.log.Debug("mcp session refused", logKeyReason, "unknown, expired or terminated")
		writeRPCError(w, http.StatusNotFound, rpcID(body), codeSessionNotFound, "Session not found")
		return nil, nil, false
	case errors.Is(err, errSessionsFull):
		s.log.Warn("mcp initialize refused: every session is busy", "max_sessions", s.sessions.max)
		w.Header().Set("Retry-After", strconv.Itoa(1))
		writeRPCError(w, http.StatusServiceUnavailable, rpcID(body), codeTransport, "Service Unavailable: too many sessions")
		return nil, nil, false
	case errors.Is(err, errSourceFull):
		s.log.Info("mcp initialize refused: every session of its source is busy", "max_sessions_per_source", s.sessions.perSource)
		w.Header().Set("Retry-After", strconv.Itoa(1))
		writeRPCError(w, http.StatusTooManyRequests, rpcID(body), codeTransport, "Too Many Requests: too many sessions from this client")
		return nil, nil, false
	case err != nil:
		s.log.Error("mcp session not issued", logKeyErr, err)
		writeRPCError(w, http.StatusInternalServerError, rpcID(body), rpcerrInternal, "Internal error")
		return nil, nil, false
	}
	return r, func() { s.sessions.end(id) }, true
}

// SessionStore keeps MCP sessions where several instances share them (the
// ledger), by the SHA-256 (hex) of each id, so that a session one
// instance issued is accepted by the others (see Config.Sessions). An id
// not live here, of the issued form, is looked up in the store and made
// live here when the store has it unexpired. mcp-go serves a request of
// such a session in an ephemeral session of the same id, so its calls are
// the same client's: a request sent again (same id) gets the stored
// answer of a paid call.
type SessionStore interface {
	// PutSession records session hash live until expires (a later
	// expiry only).
	PutSession(ctx context.Context, hash string, expires time.Time) error
	// SessionLive reports whether session hash is recorded and not
	// expired at now.
	SessionLive(ctx context.Context, hash string, now time.Time) (bool, error)
	// EndSession forgets session hash.
	EndSession(ctx context.Context, hash string) error
}

// sessionHash is the key of session id in a SessionStore: the hex SHA-256
// of the id (a bearer secret, never stored).
func sessionHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// wellFormedSessionID reports whether id has the form of the ids this
// front issues (newSessionID): nothing else is looked up in the store.
func wellFormedSessionID(id string) bool {
	rest, ok := strings.CutPrefix(id, sessionIDPrefix)
	if !ok || len(rest) != base64.RawURLEncoding.EncodedLen(32) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(rest)
	return err == nil
}

// beginSession is sessions.begin, and with Config.Sessions: a session not
// live here that another instance issued (the store says it is live) is
// made live here; and a session's idle expiry is written to the store at
// its first request after initialize, then when half of it has passed.
// A store that cannot be read refuses the session (404), as an unknown
// one; a write that fails is logged (another instance may then not know
// the session).
func (s *Server) beginSession(r *http.Request, id string) ([]string, error) {
	ctx := r.Context()
	gone, err := s.sessions.begin(id)
	store := s.cfg.Sessions
	if store == nil {
		return gone, err
	}
	if errors.Is(err, errUnknownSession) && wellFormedSessionID(id) {
		live, lerr := store.SessionLive(ctx, sessionHash(id), s.sessions.now())
		if lerr != nil {
			s.log.Warn("mcp session not looked up in the shared store", logKeyErr, lerr)
		}
		if live {
			var more []string
			more, err = s.sessions.adopt(id, s.source(r))
			gone = append(gone, more...)
		}
	}
	if err != nil {
		return gone, err
	}
	if expires, ok := s.sessions.toShare(id); ok {
		if err := store.PutSession(ctx, sessionHash(id), expires); err != nil {
			s.sessions.unshare(id)
			s.log.Warn("mcp session not written to the shared store", logKeyErr, err)
		}
	}
	return gone, nil
}

// writeRPCError answers with a JSON-RPC error and HTTP status.
func writeRPCError(w http.ResponseWriter, status int, id []byte, code int, msg string) {
	if len(id) == 0 {
		id = []byte("null")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	m, _ := jsonString(msg)
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}`+"\n", id, code, m)
}
