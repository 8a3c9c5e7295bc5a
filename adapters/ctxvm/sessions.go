package ctxvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

// Sessions: what the server remembers of each ContextVM client (by
// pubkey) that sent it a request that was served: when, whether it came
// encrypted (and so how list_changed notifications reach it), and whether
// its last initialize declared the elicitation capability.

// maxListChanged bounds the clients one change is notified to: the most
// recent ones of the last Config.Window.
const maxListChanged = 1000

// maxListChangedFailures is how many failed publications in a row end a
// round of list_changed notifications.
const maxListChangedFailures = 3

// session is one ContextVM client's.
type session struct {
	last   time.Time
	wrap   int  // the gift wrap kind of its last request's answers; 0: plaintext
	elicit bool // its last initialize declared capabilities.elicitation
}

// sessionStore is the bounded map of sessions by client pubkey.
type sessionStore struct {
	mu sync.Mutex
	m  map[string]*session
}

// touch records a served ContextVM request r at now. An initialize sets
// whether the client can be asked for input (elicitation).
func (st *sessionStore) touch(r *request, now time.Time, window time.Duration) {
	wrap := 0
	if r.wrap.kind != 0 {
		wrap = answerWrapKind(r.ev)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		st.m = map[string]*session{}
	}
	s := st.m[r.ev.PubKey]
	if s == nil {
		st.makeRoom(now, window)
		s = &session{}
		st.m[r.ev.PubKey] = s
	}
	s.last, s.wrap = now, wrap
	if r.msg.Method == "initialize" {
		s.elicit = declaresElicitation(r.msg.Params)
	}
}

// makeRoom keeps the store under maxSessions: when full, it forgets the
// clients not seen for window, then arbitrary ones down to nine tenths
// (amortised: it runs once per maxSessions/10 new clients at most).
func (st *sessionStore) makeRoom(now time.Time, window time.Duration) {
	if len(st.m) < maxSessions {
		return
	}
	for pk, s := range st.m {
		if now.Sub(s.last) > window {
			delete(st.m, pk)
		}
	}
	for pk := range st.m { // random order
		if len(st.m) <= maxSessions*9/10 {
			break
		}
		delete(st.m, pk)
	}
}

// canElicit says whether client's last initialize declared elicitation.
func (st *sessionStore) canElicit(client string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.m[client]
	return s != nil && s.elicit
}

// recipient is a client to notify, and the gift wrap kind to use (0: none).
type recipient struct {
	pubkey string
	wrap   int
}

// recent returns the clients seen within window of now, the most recent
// first, at most max.
func (st *sessionStore) recent(now time.Time, window time.Duration, max int) []recipient {
	type seen struct {
		recipient
		last time.Time
	}
	st.mu.Lock()
	var all []seen
	for pk, s := range st.m {
		if now.Sub(s.last) <= window {
			all = append(all, seen{recipient{pk, s.wrap}, s.last})
		}
	}
	st.mu.Unlock()
	slices.SortFunc(all, func(a, b seen) int { return b.last.Compare(a.last) })
	out := make([]recipient, 0, min(len(all), max))
	for i := 0; i < len(all) && i < max; i++ {
		out = append(out, all[i].recipient)
	}
	return out
}

// declaresElicitation reads initialize params: capabilities.elicitation
// present and not null.
func declaresElicitation(params json.RawMessage) bool {
	var p struct {
		Capabilities struct {
			Elicitation json.RawMessage `json:"elicitation"`
		} `json:"capabilities"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	e := p.Capabilities.Elicitation
	return len(e) > 0 && string(e) != "null"
}

// List-changed notifications, by list.
const (
	notifyToolsChanged     = "notifications/tools/list_changed"
	notifyPromptsChanged   = "notifications/prompts/list_changed"
	notifyResourcesChanged = "notifications/resources/list_changed"
)

// listWatch is the state of the list_changed loop. kick is made by New;
// the rest belongs to the loop's goroutine.
type listWatch struct {
	kick chan struct{}     // a pending Refresh (buffered 1: coalesced)
	last map[string]string // fingerprint by notification method

	roundDone func(sent []string) // tests: called after each round that compared
}

func newListWatch() listWatch { return listWatch{kick: make(chan struct{}, 1)} }

// refresh asks the loop to compare the lists again. It never blocks.
func (w *listWatch) refresh() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// listFingerprints identifies the lists as clients see them now: the
// tools with their prices (the tools/list result and its cap tags), the
// prompts, and the resources with the resource templates.
func (s *Server) listFingerprints() map[string]string {
	sum := func(v any) string {
		b, _ := json.Marshal(v)
		h := sha256.Sum256(b)
		return hex.EncodeToString(h[:])
	}
	res, tags := s.listTools()
	fp := map[string]string{notifyToolsChanged: sum([]any{res, tags})}
	if cat := s.cfg.Catalog; cat != nil {
		var prompts, resources [][2]string
		for _, p := range cat.Prompts() {
			prompts = append(prompts, [2]string{p.Name, string(p.Definition)})
		}
		for _, r := range cat.Resources() {
			resources = append(resources, [2]string{r.URI, string(r.Definition)})
		}
		resources = append(resources, [2]string{}) // templates apart from resources
		for _, t := range cat.ResourceTemplates() {
			resources = append(resources, [2]string{t.URITemplate, string(t.Definition)})
		}
		fp[notifyPromptsChanged] = sum(prompts)
		fp[notifyResourcesChanged] = sum(resources)
	}
	return fp
}

// startListWatch runs the list_changed loop and returns a channel closed
// once it has stopped (after ctx ends). The lists as they are now are the
// reference the first Refresh is compared to.
func (s *Server) startListWatch(ctx context.Context) <-chan struct{} {
	s.lists.last = s.listFingerprints()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.listWatchLoop(ctx)
	}()
	return done
}

// listWatchLoop waits for Refreshes; AnnounceDelay after one (Refreshes
// meanwhile coalesced) it compares the lists with the last round's and
// notifies the recent ContextVM clients of those that changed.
func (s *Server) listWatchLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.lists.kick:
		}
		if !s.settle(ctx, s.lists.kick) {
			return
		}
		now := s.listFingerprints()
		var changed []string
		for _, m := range []string{notifyToolsChanged, notifyPromptsChanged, notifyResourcesChanged} {
			if now[m] != s.lists.last[m] {
				changed = append(changed, m)
			}
		}
		s.lists.last = now
		if len(changed) > 0 {
			s.notifyListChanged(ctx, changed)
		}
		if s.lists.roundDone != nil {
			s.lists.roundDone(changed)
		}
	}
}

// notifyListChanged sends each of methods (JSON-RPC notifications without
// params) to the ContextVM clients seen within Config.Window, at most
// maxListChanged, the most recent first: kind 25910 tagged ["p",
// <client>], gift wrapped when the client's last request was. Failures
// are logged; nothing is retried (a client lists again when it calls),
// and a round stops after maxListChangedFailures failures in a row (the
// relays are down: each failure took up to PublishTimeout).
func (s *Server) notifyListChanged(ctx context.Context, methods []string) {
	rcpts := s.sess.recent(s.cfg.Now(), s.cfg.Window, maxListChanged)
	failed, inRow := 0, 0
	for _, rc := range rcpts {
		for _, m := range methods {
			if ctx.Err() != nil {
				return
			}
			if inRow >= maxListChangedFailures {
				s.log.Warn("list_changed notifications given up: relays refuse them", "lists", methods, "clients", len(rcpts))
				return
			}
			ev := nostr.Event{Kind: KindMessage, CreatedAt: nostr.Timestamp(s.cfg.Now().Unix()),
				Tags: nostr.Tags{{"p", rc.pubkey}}, Content: jsonrpcNotification(m, nil)}
			if err := s.sign(&ev); err != nil {
				failed++
				continue
			}
			if rc.wrap != 0 {
				w, err := s.giftWrap(ev, rc.pubkey, rc.wrap)
				if err != nil {
					failed++
					continue
				}
				ev = w
			}
			pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
			err := s.publish(pctx, ev)
			cancel()
			if err != nil {
				failed++
				inRow++
				s.log.Debug("list_changed not published", logKeyClient, rc.pubkey, logKeyMethod, m, logKeyErr, err)
				continue
			}
			inRow = 0
		}
	}
	s.log.Info("lists changed: clients notified", "lists", methods, "clients", len(rcpts), "failed", failed)
}
