package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/capvend/capvend/vend"
)

// ReplyStore keeps the answers to requests that ran something, by request
// event (replyKey), so that a relay delivering a request again (to a restarted
// server too) gets the first answer instead of a second run. The ledger
// implements it. Priced calls are also found by the Vendor (the request
// event id is the call's RequestID); the store covers free calls, prompts
// and resources as well.
type ReplyStore interface {
	// Reply returns the stored answer to key, and whether there is one;
	// an error matching vend.ErrResultExpired when the request was
	// answered but its answer was pruned after the retention period (the
	// request must not run again).
	Reply(ctx context.Context, key string) ([]byte, bool, error)
	// RememberReply stores the answer to key once; a second answer for the
	// same key is ignored (false). Atomic.
	RememberReply(ctx context.Context, key string, reply []byte) (bool, error)
}

// claimKey names a request among instances (Config.Claims) and among the
// requests in flight: its event id (the rumor's for NIP-59),
// transport-qualified. Instances of every version claim by it.
func claimKey(r *request) string { return "nostr:" + r.ev.ID }

// replyKey is the store key of a request's answer: its created_at, fixed
// width, then its event id (the id commits to the time, so the key is as
// unique). Keyed by the id alone, every stored answer went to a random
// place in the table's key order, and each one rewrote a page of its own
// when committed; keyed by time first, the answers of a group commit
// share the last pages (a stored answer cost half the CPU).
func replyKey(r *request) string {
	b := make([]byte, 0, len("nostr@0000000000:")+len(r.ev.ID))
	b = append(b, "nostr@"...)
	t := int64(r.ev.CreatedAt)
	if t >= 0 {
		for p := int64(1e9); p > 1 && t < p; p /= 10 {
			b = append(b, '0')
		}
	}
	b = strconv.AppendInt(b, t, 10)
	b = append(b, ':')
	return string(append(b, r.ev.ID...))
}

// legacyReplies says whether an answer may be stored under the key
// earlier builds of capvend stored it by (claimKey): Run looks those up
// for two windows after it starts, the longest a reply stored before it
// stays wanted (a request is served only within Config.Window of its
// created_at).
func (s *Server) legacyReplies() bool {
	return s.cfg.Now().Before(s.legacyUntil)
}

// kept says whether answers to method are kept for replays: the methods
// that run something upstream.
func kept(method string) bool {
	switch method {
	case "tools/call", "prompts/get", "resources/read":
		return true
	}
	return false
}

// startReplay decides how a request that runs something is served: it
// returns false when it was answered already (from the store: a replay;
// or from memory, answered and being stored), or when the same event is
// being served right now (the first copy will answer). Otherwise the
// request is marked in flight until endReplay.
func (s *Server) startReplay(ctx context.Context, r *request, out *outbox) bool {
	key := claimKey(r)
	s.mu.Lock()
	if answer, busy := s.inflight[key]; busy {
		s.mu.Unlock()
		if answer != nil {
			// Answered, its answer not stored yet (remember).
			out.answer(json.RawMessage(answer), nil, nil, false)
		}
		return false
	}
	s.inflight[key] = nil
	s.mu.Unlock()
	if s.cfg.Replies == nil {
		return true
	}
	reply, ok, err := s.cfg.Replies.Reply(ctx, replyKey(r))
	if err == nil && !ok && s.legacyReplies() {
		reply, ok, err = s.cfg.Replies.Reply(ctx, key)
	}
	if errors.Is(err, vend.ErrResultExpired) {
		// It ran; its answer is gone: say so, and do not run it again.
		s.log.Debug("replayed request's stored answer expired", logKeyEvent, r.ev.ID, logKeyMethod, r.msg.Method)
		s.endReplay(r)
		out.answer(nil, toWire(err, ""), nil, false)
		return false
	}
	if err != nil {
		// Serve it: a priced call is still protected by the Vendor.
		s.log.Warn("replay store unreadable", logKeyEvent, r.ev.ID, logKeyErr, err)
		return true
	}
	if !ok {
		return true
	}
	s.log.Debug("replayed request answered from the store", logKeyEvent, r.ev.ID, logKeyMethod, r.msg.Method)
	s.endReplay(r)
	out.answer(json.RawMessage(reply), nil, nil, false)
	return false
}

// endReplay clears a request's in-flight mark.
func (s *Server) endReplay(r *request) {
	s.mu.Lock()
	delete(s.inflight, claimKey(r))
	s.mu.Unlock()
}

// remember stores a request's successful answer for replays. Errors are
// not kept: a replay is evaluated again (and a priced call is still found
// by the Vendor, never charged twice).
func (s *Server) remember(ctx context.Context, r *request, res json.RawMessage, rerr *rpcError) {
	if s.cfg.Replies == nil || rerr != nil || len(res) == 0 || !kept(r.msg.Method) {
		return
	}
	// Until it is stored (a group commit waits for others), a copy of
	// the request is answered from here.
	key := claimKey(r)
	s.mu.Lock()
	if _, busy := s.inflight[key]; busy {
		s.inflight[key] = res
	}
	s.mu.Unlock()
	if _, err := s.cfg.Replies.RememberReply(context.WithoutCancel(ctx), replyKey(r), res); err != nil {
		s.log.Warn("reply not stored for replays", logKeyEvent, r.ev.ID, logKeyErr, err)
	}
}

// claim says whether this server serves r: always without Config.Claims;
// with Config.Members, when r is in this server's shard (v, or decided
// here for what preShard left: gift wraps), claimed first only during a
// membership change; otherwise when its claim of r's event id holds
// (Instance has it). A request another server claimed is dropped, and so
// is one whose claim could not be written (the ledger unreachable):
// answering it might answer it twice, or run a free call twice; the
// client asks again.
func (s *Server) claim(ctx context.Context, r *request, v verdict) bool {
	if s.cfg.Claims == nil {
		return true
	}
	if s.shard != nil {
		if v < 0 {
			v = s.shard.decide(r.ev.ID)
		}
		switch v {
		case skip:
			s.log.Debug("nostr request dropped: another instance's shard", logKeyEvent, r.ev.ID)
			return false
		case serveFree:
			return true
		}
	}
	mine, err := s.cfg.Claims.ClaimRequest(ctx, claimKey(r), s.cfg.Instance)
	switch {
	case err != nil:
		s.log.Error("nostr request dropped: its claim was not written", logKeyEvent, r.ev.ID, logKeyErr, err)
		return false
	case !mine:
		s.log.Debug("nostr request dropped: another instance serves it", logKeyEvent, r.ev.ID)
		return false
	}
	return true
}
