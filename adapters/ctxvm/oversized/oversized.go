// Package oversized is ContextVM's CEP-22, oversized transfer: a JSON-RPC
// message too large for one Nostr event goes as a sequence of
// notifications/progress messages (frames), each in an event of its own,
// and is put together again by its receiver. It holds the wire form of
// the frames, the cutting of a message into chunks that fit a relay's
// limits, and the receiver that reassembles them within bounds. It does
// no I/O: package ctxvm (the server) and internal/ctxvmclient (capvend's
// client) sign, wrap and publish the frames.
//
// The frames of one transfer share the request's progressToken:
//
//	start  progress 1       cvm {type, frameType:"start", completionMode:"render", digest, totalBytes, totalChunks}
//	accept progress 2       sent by the receiver when the sender could not know it takes transfers
//	chunk  progress b..b+N-1 cvm {type, frameType:"chunk", data}, b = 2, or 3 after an accept slot
//	end    progress b+N     cvm {type, frameType:"end"}
//	abort  any              cvm {type, frameType:"abort", reason}: the transfer is given up
//
// The message is the exact string the sender serialized (with "jsonrpc"
// and its id); digest is "sha256:" and the lowercase hex SHA-256 of its
// UTF-8 bytes, totalBytes their number. Chunks are cut on code point
// boundaries (a cut inside a character would be replaced by U+FFFD on the
// way and break the digest). Wire details, and the stock SDK's behaviour
// this package tolerates, are in docs/CONTEXTVM.md, Oversized transfer.
package oversized

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Wire names.
const (
	// Type is cvm.type of every frame.
	Type = "oversized-transfer"
	// TagSupport is the discovery tag (one element) of a peer that takes
	// oversized transfers.
	TagSupport = "support_oversized_transfer"
	// Method is the JSON-RPC method of frames.
	Method = "notifications/progress"
	// DigestPrefix starts cvm.digest.
	DigestPrefix = "sha256:"
	// CompletionRender is the start frame's completionMode.
	CompletionRender = "render"
)

// Frame types (cvm.frameType).
const (
	FrameStart  = "start"
	FrameAccept = "accept"
	FrameChunk  = "chunk"
	FrameEnd    = "end"
	FrameAbort  = "abort"
)

// Sizes.
const (
	// DefaultThreshold is the largest event (bytes of the published JSON)
	// sent whole to a relay that advertises no limit: the stock SDK's
	// threshold too.
	DefaultThreshold = 48_000
	// MaxNIP44Plaintext is the most NIP-44 v2 encrypts: a gift-wrapped
	// event's inner event is never larger.
	MaxNIP44Plaintext = 65_535
)

// Frame is the params of one frame's notifications/progress. Its fields
// are in the stock SDK's order (progressToken, progress, message, cvm).
type Frame struct {
	// ProgressToken is the request's params._meta.progressToken as JSON
	// (a string or a number).
	ProgressToken json.RawMessage `json:"progressToken"`
	Progress      int64           `json:"progress"`
	Message       string          `json:"message,omitempty"`
	CVM           CVM             `json:"cvm"`
}

// CVM is a frame's cvm member.
type CVM struct {
	Type           string `json:"type"`
	FrameType      string `json:"frameType"`
	CompletionMode string `json:"completionMode,omitempty"`
	Digest         string `json:"digest,omitempty"`
	TotalBytes     int64  `json:"totalBytes,omitempty"`
	TotalChunks    int64  `json:"totalChunks,omitempty"`
	Data           string `json:"data,omitempty"`
	Reason         string `json:"reason,omitempty"`
}

// Errors of the frame parser and of cutting.
var (
	// ErrBadFrame: not a well-formed frame (the progress notification is
	// not CEP-22's, or a member has the wrong type or value).
	ErrBadFrame = errors.New("oversized: malformed frame")
	// ErrTooSmall: the limits leave no room for even one character of
	// data in a chunk frame.
	ErrTooSmall = errors.New("oversized: the relay's limits leave no room for a chunk")
)

// Digest is cvm.digest of msg.
func Digest(msg []byte) string {
	h := sha256.Sum256(msg)
	return DigestPrefix + hex.EncodeToString(h[:])
}

// IsFrame reports whether a JSON-RPC message's method and params are a
// CEP-22 frame (params.cvm.type is Type). It does not check the rest.
func IsFrame(method string, params json.RawMessage) bool {
	if method != Method || len(params) == 0 {
		return false
	}
	// Cheap test first: most progress notifications are not frames.
	if !bytes.Contains(params, []byte(Type)) {
		return false
	}
	var p struct {
		CVM *struct {
			Type string `json:"type"`
		} `json:"cvm"`
	}
	return json.Unmarshal(params, &p) == nil && p.CVM != nil && p.CVM.Type == Type
}

// Parse reads a frame from a notifications/progress' params and checks
// its form: a token that is a non-empty string or a number, a positive
// integer progress, a known frameType, and what that frame type needs
// (a start: a digest of "sha256:" and 64 lowercase hex, totals of at
// least 1, no more chunks than bytes; a chunk: data). It returns
// ErrBadFrame otherwise. It never panics; a frame it accepts encodes
// (Params) back to params that Parse reads as the same frame.
func Parse(params json.RawMessage) (Frame, error) {
	var f Frame
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	var raw struct {
		ProgressToken json.RawMessage `json:"progressToken"`
		Progress      json.Number     `json:"progress"`
		Message       string          `json:"message"`
		CVM           *CVM            `json:"cvm"`
	}
	if err := dec.Decode(&raw); err != nil || dec.More() || raw.CVM == nil || raw.CVM.Type != Type {
		return f, ErrBadFrame
	}
	if _, err := TokenKey(raw.ProgressToken); err != nil {
		return f, err
	}
	p, err := raw.Progress.Int64()
	if err != nil || p <= 0 {
		return f, ErrBadFrame
	}
	f = Frame{ProgressToken: compact(raw.ProgressToken), Progress: p, Message: raw.Message, CVM: *raw.CVM}
	c := &f.CVM
	switch c.FrameType {
	case FrameStart:
		if !validDigest(c.Digest) || c.TotalBytes < 1 || c.TotalChunks < 1 || c.TotalChunks > c.TotalBytes {
			return Frame{}, ErrBadFrame
		}
	case FrameChunk:
		if c.Data == "" {
			return Frame{}, ErrBadFrame
		}
	case FrameAccept, FrameEnd, FrameAbort:
	default:
		return Frame{}, ErrBadFrame
	}
	return f, nil
}

// compact is a JSON value without insignificant space (a token read from
// the wire, so that it encodes back the same).
func compact(v json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}

func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, DigestPrefix)
	if !ok || len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// TokenKey is the key of a progressToken: a string token's value, a
// number token's literal (as JavaScript's String() gives an integer). A
// token that is neither, or an empty string, is ErrBadFrame.
func TokenKey(tok json.RawMessage) (string, error) {
	tok = bytes.TrimSpace(tok)
	if len(tok) == 0 {
		return "", ErrBadFrame
	}
	switch tok[0] {
	case '"':
		var s string
		if json.Unmarshal(tok, &s) != nil || s == "" {
			return "", ErrBadFrame
		}
		return s, nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		if json.Unmarshal(tok, &n) != nil {
			return "", ErrBadFrame
		}
		return n.String(), nil
	}
	return "", ErrBadFrame
}

// Params encodes f as a notification's params (no HTML escaping: every
// byte counts against the relay's limit).
func (f Frame) Params() json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(f) // a Frame always encodes: strings, numbers and a valid token
	return bytes.TrimRight(b.Bytes(), "\n")
}

// Content is the JSON-RPC notification carrying f, as the stock SDK
// writes it: {"jsonrpc":"2.0","method":"notifications/progress","params":...}.
func (f Frame) Content() string {
	return `{"jsonrpc":"2.0","method":"` + Method + `","params":` + string(f.Params()) + `}`
}

// Build returns the frames of a transfer of msg cut into chunks (Cut),
// in sending order: start at progress 1, the chunks from base (2, or 3
// when progress 2 is left to the receiver's accept), then end.
func Build(msg string, token json.RawMessage, chunks []string, base int64) []Frame {
	out := make([]Frame, 0, len(chunks)+2)
	out = append(out, Frame{ProgressToken: token, Progress: 1, Message: "starting oversized transfer",
		CVM: CVM{Type: Type, FrameType: FrameStart, CompletionMode: CompletionRender, Digest: Digest([]byte(msg)),
			TotalBytes: int64(len(msg)), TotalChunks: int64(len(chunks))}})
	for i, c := range chunks {
		out = append(out, Frame{ProgressToken: token, Progress: base + int64(i), CVM: CVM{Type: Type, FrameType: FrameChunk, Data: c}})
	}
	return append(out, Frame{ProgressToken: token, Progress: base + int64(len(chunks)), Message: "oversized transfer complete",
		CVM: CVM{Type: Type, FrameType: FrameEnd}})
}

// Accept is the accept frame a receiver sends for token.
func Accept(token json.RawMessage) Frame {
	return Frame{ProgressToken: token, Progress: 2, Message: "oversized request accepted", CVM: CVM{Type: Type, FrameType: FrameAccept}}
}

// Abort is an abort frame for token, giving reason.
func Abort(token json.RawMessage, progress int64, reason string) Frame {
	return Frame{ProgressToken: token, Progress: max(progress, 1), CVM: CVM{Type: Type, FrameType: FrameAbort, Reason: reason}}
}

// Size is what a relay's limits apply to, in bytes: the whole message
// the relay reads (["EVENT", <event>]) and the event's content.
type Size struct {
	Message int
	Content int
}

// Limits are a relay's limits (NIP-11 limitation.max_message_length and
// max_content_length); 0: none.
type Limits struct {
	Message int
	Content int
}

// Fits says whether s is within l.
func (l Limits) Fits(s Size) bool {
	return (l.Message <= 0 || s.Message <= l.Message) && (l.Content <= 0 || s.Content <= l.Content)
}

// Measure returns the size of what is published for a chunk frame whose
// data is data (signed, wrapped if it is wrapped). Its size must grow
// with data; each character of data adds about its JSON escaping, twice
// (the frame is JSON in the event's content, which is JSON).
type Measure func(data string) (Size, error)

// Cut cuts msg into chunks, whole code points each, such that every chunk
// frame measures within limits. A msg that is not valid UTF-8 has its
// bad bytes replaced first (as the wire would: see Valid). It returns
// ErrTooSmall when not even one character fits.
func Cut(msg string, limits Limits, measure Measure) ([]string, error) {
	msg = Valid(msg)
	empty, err := measure("")
	if err != nil {
		return nil, err
	}
	if !limits.Fits(empty) {
		return nil, ErrTooSmall
	}
	// A chunk's room in escaped bytes, and how measured growth relates
	// to the estimate (1 for plaintext events; about 4/3 and padding
	// for gift wraps, learned from the chunks measured).
	room := func(limit, used int) float64 {
		if limit <= 0 {
			return 1 << 62
		}
		return float64(limit - used)
	}
	msgRoom, contentRoom := room(limits.Message, empty.Message), room(limits.Content, empty.Content)
	scaleMsg, scaleContent := 1.0, 1.0
	var chunks []string
	for pos := 0; pos < len(msg); {
		// The estimate: take code points while their escaped size fits.
		want := min(msgRoom/scaleMsg, contentRoom/scaleContent)
		end, est, estContent := advance(msg, pos, want)
		for tries := 0; ; tries++ {
			if end == pos {
				return nil, ErrTooSmall
			}
			s, err := measure(msg[pos:end])
			if err != nil {
				return nil, err
			}
			if limits.Fits(s) {
				// Learn how the measure grows with the estimate.
				if est > 0 && s.Message > empty.Message {
					scaleMsg = max(scaleMsg*0.5+0.5*float64(s.Message-empty.Message)/est, 0.01)
				}
				if estContent > 0 && s.Content > empty.Content {
					scaleContent = max(scaleContent*0.5+0.5*float64(s.Content-empty.Content)/estContent, 0.01)
				}
				end = grow(msg, pos, end, est, s, empty, limits, measure)
				break
			}
			if tries == 30 {
				return nil, fmt.Errorf("oversized: no chunk size fits after %d tries", tries)
			}
			// Over: shrink the data in proportion, a little more.
			ratio := 1.0
			if limits.Message > 0 && s.Message > limits.Message {
				ratio = min(ratio, float64(limits.Message-empty.Message)/float64(max(s.Message-empty.Message, 1)))
			}
			if limits.Content > 0 && s.Content > limits.Content {
				ratio = min(ratio, float64(limits.Content-empty.Content)/float64(max(s.Content-empty.Content, 1)))
			}
			want = est * ratio * 0.97
			if end2, e2, c2 := advance(msg, pos, want); end2 < end {
				end, est, estContent = end2, e2, c2
			} else {
				end, est, estContent = back(msg, pos, end)
			}
		}
		chunks = append(chunks, msg[pos:end])
		pos = end
	}
	return chunks, nil
}

// grow extends a chunk msg[pos:end] that fits (measuring s) while the
// limits leave room, a few times at most, and returns its end.
func grow(msg string, pos, end int, est float64, s, empty Size, limits Limits, measure Measure) int {
	for range 8 {
		if end == len(msg) {
			return end
		}
		ratio := 1e9
		if limits.Message > 0 {
			ratio = min(ratio, float64(limits.Message-empty.Message)/float64(max(s.Message-empty.Message, 1)))
		}
		if limits.Content > 0 {
			ratio = min(ratio, float64(limits.Content-empty.Content)/float64(max(s.Content-empty.Content, 1)))
		}
		if ratio <= 1.0005 {
			return end
		}
		next, nest, _ := advance(msg, pos, est*ratio)
		if next <= end {
			_, n := utf8.DecodeRuneInString(msg[end:])
			next, nest = end+n, est+float64(twice(utf8.DecodeRuneInString(msg[end:])))
		}
		ns, err := measure(msg[pos:next])
		if err != nil || !limits.Fits(ns) {
			return end
		}
		end, est, s = next, nest, ns
	}
	return end
}

// advance returns the end of the longest run of code points from pos
// whose estimated size (escaped twice) is at most want (at least one code
// point when any is left), and that size and its content size (escaped
// once).
func advance(msg string, pos int, want float64) (end int, est, estContent float64) {
	end = pos
	for end < len(msg) {
		r, n := utf8.DecodeRuneInString(msg[end:])
		c1 := escaped(r, n)
		c2 := twice(r, n)
		if est+float64(c2) > want && end > pos {
			break
		}
		est += float64(c2)
		estContent += float64(c1)
		end += n
		if est > want {
			break
		}
	}
	return end, est, estContent
}

// back drops the last code point of msg[pos:end] and returns the new end
// and its estimates.
func back(msg string, pos, end int) (int, float64, float64) {
	_, n := utf8.DecodeLastRuneInString(msg[pos:end])
	end -= n
	var est, estContent float64
	for i := pos; i < end; {
		r, n := utf8.DecodeRuneInString(msg[i:])
		est += float64(twice(r, n))
		estContent += float64(escaped(r, n))
		i += n
	}
	return end, est, estContent
}

// escaped is the length of code point r (n bytes of UTF-8) in a JSON
// string as Frame.Params writes it.
func escaped(r rune, n int) int {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20, r == '\u2028', r == '\u2029', r == utf8.RuneError && n == 1:
		return 6 // \u00XX, \u2028, \ufffd
	}
	return n
}

// twice is the length of r once escaped in the frame's JSON and then
// again in the event's: an escape's backslash doubles.
func twice(r rune, n int) int {
	switch {
	case r == '"' || r == '\\':
		return 4 // \" -> \\\"
	case r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 3 // \n -> \\n
	case r < 0x20, r == '\u2028', r == '\u2029', r == utf8.RuneError && n == 1:
		return 7 // \u00XX -> \\u00XX
	}
	return n
}

// Valid is msg with every byte sequence that is not UTF-8 replaced by
// U+FFFD, as a JSON encoder does on the wire: the digest must be of what
// the receiver gets.
func Valid(msg string) string {
	if utf8.ValidString(msg) {
		return msg
	}
	return strings.ToValidUTF8(msg, "\uFFFD")
}

// NIP44Len is the length of the base64 NIP-44 v2 payload of a plaintext
// of n bytes (1 to MaxNIP44Plaintext).
func NIP44Len(n int) int {
	raw := 1 + 32 + 2 + nip44Padded(n) + 32 // version, nonce, length, padded plaintext, MAC
	return (raw + 2) / 3 * 4
}

// nip44Padded is NIP-44's calc_padded_len.
func nip44Padded(n int) int {
	if n <= 32 {
		return 32
	}
	next := 1
	for next <= n-1 {
		next <<= 1
	}
	chunk := 32
	if next > 256 {
		chunk = next / 8
	}
	return chunk * ((n-1)/chunk + 1)
}

// MaxWrapped is the largest inner event (bytes of its JSON) that fits a
// gift wrap within limits, when the wrap's published message is overhead
// bytes plus its content (the NIP-44 payload of the inner event), and
// never more than MaxNIP44Plaintext.
func MaxWrapped(limits Limits, overhead int) int {
	fits := func(n int) bool {
		c := NIP44Len(n)
		return (limits.Message <= 0 || overhead+c <= limits.Message) && (limits.Content <= 0 || c <= limits.Content)
	}
	lo, hi := 0, MaxNIP44Plaintext
	for lo < hi { // the largest n that fits: sizes grow with n
		mid := (lo + hi + 1) / 2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
