package oversized

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Receiver defaults (see Policy).
const (
	DefaultMaxBytes     = 1 << 20
	DefaultMaxChunks    = 10_000
	DefaultMaxTransfers = 64
	DefaultMaxPerPeer   = 4
	DefaultWindow       = 64
	DefaultIdle         = 30 * time.Second
	DefaultTimeout      = 5 * time.Minute
	DefaultEndWait      = 5 * time.Second
	// maxFinished bounds the memory of transfers that ended, whose late
	// frames are ignored.
	maxFinished = 4096
)

// Policy bounds what a Receiver holds. Zero fields take the defaults.
type Policy struct {
	// MaxBytes bounds one message (totalBytes). DefaultMaxBytes.
	MaxBytes int64
	// MaxChunks bounds one transfer's chunks. DefaultMaxChunks.
	MaxChunks int64
	// MaxTransfers bounds the transfers in progress, all peers together;
	// MaxPerPeer one peer's. DefaultMaxTransfers, DefaultMaxPerPeer.
	MaxTransfers, MaxPerPeer int
	// MaxPeerBytes bounds the bytes one peer's transfers may hold (each
	// counts its totalBytes from its start on, its chunks' bytes before);
	// MaxTotalBytes all peers'. 2*MaxBytes and 16*MaxBytes.
	MaxPeerBytes, MaxTotalBytes int64
	// Window is how far ahead of the first missing chunk a chunk may be.
	// DefaultWindow.
	Window int64
	// Idle ends a transfer no frame came for in that long; Timeout one
	// that started that long ago; EndWait one whose end came that long ago
	// with chunks still missing (frames may come out of order, but not
	// that late). DefaultIdle, DefaultTimeout, DefaultEndWait.
	Idle, Timeout, EndWait time.Duration
}

func (p Policy) withDefaults() Policy {
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&p.MaxBytes, DefaultMaxBytes)
	def(&p.MaxChunks, DefaultMaxChunks)
	def(&p.MaxPeerBytes, 2*p.MaxBytes)
	def(&p.MaxTotalBytes, 16*p.MaxBytes)
	def(&p.Window, DefaultWindow)
	if p.MaxTransfers <= 0 {
		p.MaxTransfers = DefaultMaxTransfers
	}
	if p.MaxPerPeer <= 0 {
		p.MaxPerPeer = DefaultMaxPerPeer
	}
	for _, d := range []struct {
		v *time.Duration
		d time.Duration
	}{{&p.Idle, DefaultIdle}, {&p.Timeout, DefaultTimeout}, {&p.EndWait, DefaultEndWait}} {
		if *d.v <= 0 {
			*d.v = d.d
		}
	}
	return p
}

// Why a transfer failed (wrapped in an *Error).
var (
	ErrLimit      = errors.New("over the receiver's limits")
	ErrSequence   = errors.New("frames out of sequence")
	ErrLength     = errors.New("length differs from totalBytes")
	ErrDigest     = errors.New("SHA-256 digest mismatch")
	ErrIncomplete = errors.New("chunks missing")
	ErrTimeout    = errors.New("transfer not completed in time")
	ErrAborted    = errors.New("aborted by the sender")
)

// Error is a failed transfer: the peer, the token, why, and the infos
// given with its start and end frames (nil when they did not come).
type Error struct {
	Peer, Token string
	Start, End  any
	Err         error
	Detail      string // e.g. "3 of 10 chunks"
	// Again: the failure was returned before; this is the end frame that
	// came after it (to answer, not to count again).
	Again bool
}

func (e *Error) Error() string {
	s := fmt.Sprintf("oversized transfer %q: %v", e.Token, e.Err)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Message is a reassembled message.
type Message struct {
	Peer, Token string
	// Data is the sender's serialized message, its length and digest
	// checked.
	Data []byte
	// Start and End are the infos given with the start and end frames.
	Start, End any
	// Plaintext: at least one frame came in plaintext.
	Plaintext bool
	// Frames is how many frames made it (duplicates not counted).
	Frames int
}

type key struct{ peer, token string }

type transfer struct {
	key
	started     bool
	startP      int64
	digest      string
	totalBytes  int64
	totalChunks int64
	startInfo   any

	ended   bool
	endP    int64
	endInfo any
	endAt   time.Time

	chunks    map[int64]string
	have      int64 // bytes of chunks held
	reserved  int64 // bytes counted against the peer's and the total
	plaintext bool
	frames    int
	first     time.Time
	last      time.Time
}

// Receiver reassembles the transfers of many peers, frames in any order
// (a chunk or the end before the start included), within its Policy. Safe
// for concurrent use.
type Receiver struct {
	p Policy

	mu       sync.Mutex
	m        map[key]*transfer
	perPeer  map[string]*peerUse
	total    int64
	finished map[key]ended // ended transfers: their late frames are ignored
	order    []key         // finished, oldest first
}

// ended is a transfer that ended: when, and why if it failed.
type ended struct {
	at  time.Time
	err *Error
}

type peerUse struct {
	n     int
	bytes int64
}

// NewReceiver returns a Receiver bounded by p.
func NewReceiver(p Policy) *Receiver {
	return &Receiver{p: p.withDefaults(), m: map[key]*transfer{}, perPeer: map[string]*peerUse{}, finished: map[key]ended{}}
}

// Policy returns the receiver's policy, defaults filled in.
func (r *Receiver) Policy() Policy { return r.p }

// Add takes frame f of peer (Parse checked its form) at now. plaintext
// says it came unencrypted; info is the caller's, handed back with the
// message (or error) when f is the transfer's start or end. It returns the
// message once f completes it, an *Error when the transfer failed (it is
// then forgotten: its later frames are ignored), or nil, nil. Frames of a
// transfer that ended (but a start: the token used again), and accept
// frames, are ignored.
func (r *Receiver) Add(peer string, f Frame, plaintext bool, now time.Time, info any) (*Message, error) {
	tok, err := TokenKey(f.ProgressToken)
	if err != nil {
		return nil, err
	}
	k := key{peer, tok}
	r.mu.Lock()
	defer r.mu.Unlock()
	if f.CVM.FrameType == FrameAccept {
		return nil, nil
	}
	if done, ok := r.finished[k]; ok {
		switch {
		case f.CVM.FrameType == FrameStart:
			delete(r.finished, k) // the token again: a new transfer (or a replay)
		case f.CVM.FrameType == FrameEnd && done.err != nil && done.err.End == nil:
			// The end of a transfer that failed before it came: the
			// sender waits for an answer to it.
			e := *done.err
			e.End, e.Again = info, true
			done.err.End = info
			return nil, &e
		default:
			return nil, nil // a late frame of a transfer that ended
		}
	}
	t := r.m[k]
	if t == nil {
		if f.CVM.FrameType == FrameAbort {
			return nil, nil
		}
		u := r.perPeer[peer]
		if len(r.m) >= r.p.MaxTransfers || (u != nil && u.n >= r.p.MaxPerPeer) {
			e := &Error{Peer: peer, Token: tok, Start: startInfo(f, info), End: endInfo(f, info), Err: ErrLimit, Detail: "too many transfers at once"}
			r.finish(k, now, e)
			return nil, e
		}
		t = &transfer{key: k, chunks: map[int64]string{}, first: now}
		r.m[k] = t
		if u == nil {
			u = &peerUse{}
			r.perPeer[peer] = u
		}
		u.n++
	}
	t.last = now
	t.plaintext = t.plaintext || plaintext
	fail := func(why error, format string, a ...any) (*Message, error) {
		e := &Error{Peer: peer, Token: tok, Start: t.startInfo, End: t.endInfo, Err: why, Detail: fmt.Sprintf(format, a...)}
		if e.End == nil {
			e.End = endInfo(f, info)
		}
		if e.Start == nil {
			e.Start = startInfo(f, info)
		}
		r.drop(t, now, e)
		return nil, e
	}
	switch c := &f.CVM; c.FrameType {
	case FrameAbort:
		return fail(ErrAborted, "%s", c.Reason)
	case FrameStart:
		if t.started {
			if f.Progress == t.startP && c.Digest == t.digest && c.TotalBytes == t.totalBytes && c.TotalChunks == t.totalChunks {
				return nil, nil // a copy
			}
			return fail(ErrSequence, "a second start")
		}
		switch {
		case c.TotalBytes > r.p.MaxBytes:
			return fail(ErrLimit, "%d bytes, over %d", c.TotalBytes, r.p.MaxBytes)
		case c.TotalChunks > r.p.MaxChunks:
			return fail(ErrLimit, "%d chunks, over %d", c.TotalChunks, r.p.MaxChunks)
		case t.have > c.TotalBytes:
			return fail(ErrLength, "chunks of %d bytes before a start of %d", t.have, c.TotalBytes)
		}
		if !r.reserve(t, c.TotalBytes) {
			return fail(ErrLimit, "%d bytes: the memory for transfers is taken", c.TotalBytes)
		}
		t.started, t.startP, t.digest, t.totalBytes, t.totalChunks, t.startInfo = true, f.Progress, c.Digest, c.TotalBytes, c.TotalChunks, info
		t.frames++
		for p := range t.chunks {
			if p <= t.startP || p > t.startP+t.totalChunks+1 {
				return fail(ErrSequence, "a chunk at progress %d, outside %d..%d", p, t.startP+1, t.startP+t.totalChunks+1)
			}
		}
		if t.ended && !t.endFits() {
			return fail(ErrSequence, "end at progress %d for %d chunks from %d", t.endP, t.totalChunks, t.startP)
		}
	case FrameChunk:
		if old, ok := t.chunks[f.Progress]; ok {
			if old != c.Data {
				return fail(ErrSequence, "two chunks at progress %d", f.Progress)
			}
			return nil, nil
		}
		if t.started {
			if f.Progress <= t.startP || f.Progress > t.startP+t.totalChunks+1 {
				return fail(ErrSequence, "a chunk at progress %d, outside %d..%d", f.Progress, t.startP+1, t.startP+t.totalChunks+1)
			}
			if gap := f.Progress - t.nextMissing(); gap > r.p.Window {
				return fail(ErrLimit, "a chunk %d ahead of the first missing one (window %d)", gap, r.p.Window)
			}
			if t.have+int64(len(c.Data)) > t.totalBytes {
				return fail(ErrLength, "chunks of more than %d bytes", t.totalBytes)
			}
		} else {
			// Before its start (frames are handled concurrently): held,
			// a window's worth, counted against the limits.
			if int64(len(t.chunks)) >= r.p.Window {
				return fail(ErrLimit, "more than %d chunks before the start", r.p.Window)
			}
			if !r.reserve(t, t.have+int64(len(c.Data))) {
				return fail(ErrLimit, "chunks before the start: the memory for transfers is taken")
			}
		}
		t.chunks[f.Progress] = c.Data
		t.have += int64(len(c.Data))
		t.frames++
	case FrameEnd:
		if t.ended {
			if f.Progress == t.endP {
				return nil, nil
			}
			return fail(ErrSequence, "a second end")
		}
		t.ended, t.endP, t.endInfo, t.endAt = true, f.Progress, info, now
		t.frames++
		if t.started && !t.endFits() {
			return fail(ErrSequence, "end at progress %d for %d chunks from %d", t.endP, t.totalChunks, t.startP)
		}
	default:
		return fail(ErrSequence, "frame type %q", c.FrameType)
	}
	if !t.started || !t.ended || int64(len(t.chunks)) < t.totalChunks {
		return nil, nil
	}
	return r.complete(t, now)
}

// startInfo and endInfo are info if f is a start (end) frame.
func startInfo(f Frame, info any) any {
	if f.CVM.FrameType == FrameStart {
		return info
	}
	return nil
}

func endInfo(f Frame, info any) any {
	if f.CVM.FrameType == FrameEnd {
		return info
	}
	return nil
}

// endFits: the end's progress follows the chunks from start+1 or start+2
// (after an accept slot).
func (t *transfer) endFits() bool {
	base := t.endP - t.totalChunks
	return base == t.startP+1 || base == t.startP+2
}

// nextMissing is the first chunk progress not held, counting from the
// first chunk: start+1, or start+2 when start+1 is missing and start+2
// came (the sender left progress 2 to an accept).
func (t *transfer) nextMissing() int64 {
	p := t.startP + 1
	if _, ok := t.chunks[p]; !ok {
		if _, ok := t.chunks[p+1]; ok {
			p++
		}
	}
	for {
		if _, ok := t.chunks[p]; !ok {
			return p
		}
		p++
	}
}

// complete assembles a transfer that has its start, its end and as many
// chunks as declared.
func (r *Receiver) complete(t *transfer, now time.Time) (*Message, error) {
	fail := func(why error, format string, a ...any) (*Message, error) {
		e := &Error{Peer: t.peer, Token: t.token, Start: t.startInfo, End: t.endInfo, Err: why, Detail: fmt.Sprintf(format, a...)}
		r.drop(t, now, e)
		return nil, e
	}
	base := t.endP - t.totalChunks
	var b strings.Builder
	b.Grow(int(t.have))
	for p := base; p < t.endP; p++ {
		c, ok := t.chunks[p]
		if !ok {
			if int64(len(t.chunks)) > t.totalChunks {
				return fail(ErrSequence, "chunks outside %d..%d", base, t.endP-1)
			}
			return nil, nil // more may come; EndWait bounds the wait
		}
		b.WriteString(c)
	}
	if int64(len(t.chunks)) != t.totalChunks {
		return fail(ErrSequence, "%d chunks for %d declared", len(t.chunks), t.totalChunks)
	}
	data := []byte(b.String())
	if int64(len(data)) != t.totalBytes {
		return fail(ErrLength, "%d bytes, %d declared", len(data), t.totalBytes)
	}
	h := sha256.Sum256(data)
	if DigestPrefix+hex.EncodeToString(h[:]) != t.digest {
		return fail(ErrDigest, "")
	}
	m := &Message{Peer: t.peer, Token: t.token, Data: data, Start: t.startInfo, End: t.endInfo, Plaintext: t.plaintext, Frames: t.frames}
	r.drop(t, now, nil)
	return m, nil
}

// reserve sets t's counted bytes to n if the peer's and the total bounds
// allow it.
func (r *Receiver) reserve(t *transfer, n int64) bool {
	u := r.perPeer[t.peer]
	d := n - t.reserved
	if d > 0 && (u.bytes+d > r.p.MaxPeerBytes || r.total+d > r.p.MaxTotalBytes) {
		return false
	}
	u.bytes += d
	r.total += d
	t.reserved = n
	return true
}

// drop forgets t, giving its bytes back, and remembers it ended (failed
// with err, if not nil).
func (r *Receiver) drop(t *transfer, now time.Time, err *Error) {
	if r.m[t.key] != t {
		return
	}
	delete(r.m, t.key)
	if u := r.perPeer[t.peer]; u != nil {
		u.n--
		u.bytes -= t.reserved
		if u.n <= 0 {
			delete(r.perPeer, t.peer)
		}
	}
	r.total -= t.reserved
	r.finish(t.key, now, err)
}

// finish remembers that k ended (its late frames are ignored), for Idle,
// at most maxFinished keys.
func (r *Receiver) finish(k key, now time.Time, err *Error) {
	if _, ok := r.finished[k]; !ok {
		r.order = append(r.order, k)
	}
	r.finished[k] = ended{now, err}
	for len(r.order) > 0 {
		old := r.order[0]
		if e, ok := r.finished[old]; ok && len(r.order) <= maxFinished && now.Sub(e.at) < r.p.Idle {
			break
		}
		if e, ok := r.finished[old]; ok && (len(r.order) > maxFinished || now.Sub(e.at) >= r.p.Idle) {
			delete(r.finished, old)
		}
		r.order = r.order[1:]
	}
}

// Sweep ends the transfers that ran out of time at now and returns them:
// no frame for Idle, started over Timeout ago, or ended over EndWait ago
// with chunks missing. A transfer whose start never came is forgotten
// after Idle too (its Error has no Start).
func (r *Receiver) Sweep(now time.Time) []*Error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Error
	for _, t := range r.m {
		var why error
		var detail string
		switch {
		case t.ended && now.Sub(t.endAt) >= r.p.EndWait:
			why, detail = ErrIncomplete, fmt.Sprintf("%d of %d chunks when its end came", len(t.chunks), t.totalChunks)
			if !t.started {
				detail = "no start frame"
			}
		case t.started && now.Sub(t.first) >= r.p.Timeout:
			why, detail = ErrTimeout, fmt.Sprintf("%d of %d chunks after %s", len(t.chunks), t.totalChunks, r.p.Timeout)
		case now.Sub(t.last) >= r.p.Idle:
			why, detail = ErrTimeout, fmt.Sprintf("%d of %d chunks, no frame for %s", len(t.chunks), t.totalChunks, r.p.Idle)
			if !t.started {
				detail = fmt.Sprintf("no start frame, no frame for %s", r.p.Idle)
			}
		default:
			continue
		}
		e := &Error{Peer: t.peer, Token: t.token, Start: t.startInfo, End: t.endInfo, Err: why, Detail: detail}
		out = append(out, e)
		r.drop(t, now, e)
	}
	return out
}

// Load returns the transfers in progress and the bytes they hold
// counted against the limits.
func (r *Receiver) Load() (transfers int, bytes int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m), r.total
}
