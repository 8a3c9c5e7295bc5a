package oversized

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"
)

// plainMeasure measures chunk frames as published plaintext events of a
// 64-hex pubkey, tagged p and e: ["EVENT", <event>], and the content.
func plainMeasure(token json.RawMessage) Measure {
	return func(data string) (Size, error) {
		f := Frame{ProgressToken: token, Progress: 1 << 40, CVM: CVM{Type: Type, FrameType: FrameChunk, Data: data}}
		ev := nostr.Event{ID: strings.Repeat("a", 64), PubKey: strings.Repeat("b", 64), Sig: strings.Repeat("c", 128), Kind: 25910,
			CreatedAt: 1 << 31, Tags: nostr.Tags{{"p", strings.Repeat("d", 64)}, {"e", strings.Repeat("e", 64)}}, Content: f.Content()}
		env, err := nostr.EventEnvelope{Event: ev}.MarshalJSON()
		return Size{Message: len(env), Content: len(ev.Content)}, err
	}
}

// messages are JSON-RPC messages whose text needs every kind of escape
// and characters of 1 to 4 bytes.
func messages() map[string]string {
	text := func(unit string, n int) string {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 3, "result": map[string]any{
			"content": []any{map[string]any{"type": "text", "text": strings.Repeat(unit, n)}}}})
		return string(b)
	}
	return map[string]string{
		"ascii":     text("abcdefgh", 40_000),
		"escapes":   text("\"\\\n\t<&>\u0001", 20_000),
		"multibyte": text("é€😀\u2028", 30_000),
		"mixed":     text("x\"é😀\\ y", 25_000),
	}
}

// TestCutRoundTrip: every message cut for a 64 KiB relay, plaintext and
// under a tighter content limit, gives chunks of whole code points whose
// frames each fit, and that join into the message; the frames built
// from them, parsed and added to a receiver, give the message back.
func TestCutRoundTrip(t *testing.T) {
	token := json.RawMessage(`"7"`)
	for name, msg := range messages() {
		for _, lim := range []Limits{{Message: 64 << 10}, {Message: 64 << 10, Content: 20_000}, {Message: DefaultThreshold}} {
			t.Run(name+"/"+strconv.Itoa(lim.Message)+"/"+strconv.Itoa(lim.Content), func(t *testing.T) {
				measure := plainMeasure(token)
				chunks, err := Cut(msg, lim, measure)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(chunks, "") != msg {
					t.Fatal("chunks do not join into the message")
				}
				total := 0 // of all chunks but the last, published
				for i, c := range chunks {
					if c == "" || !utf8.ValidString(c) {
						t.Fatalf("chunk %d is empty or cut inside a character", i)
					}
					s, _ := measure(c)
					if !lim.Fits(s) {
						t.Fatalf("chunk %d measures %+v, over %+v", i, s, lim)
					}
					if i < len(chunks)-1 {
						total += s.Message
					}
				}
				// Packed tightly: on average within a tenth of the limit.
				if avg := total / max(len(chunks)-1, 1); len(chunks) > 2 && lim.Content == 0 && avg < lim.Message*9/10 {
					t.Errorf("chunks average %d bytes published for a limit of %d", avg, lim.Message)
				}
				got := receive(t, NewReceiver(Policy{MaxBytes: 8 << 20}), "peer", Build(msg, token, chunks, 2), false)
				if string(got.Data) != msg || got.Token != "7" || got.Frames != len(chunks)+2 {
					t.Fatalf("received %d bytes (token %q, %d frames), want the message", len(got.Data), got.Token, got.Frames)
				}
			})
		}
	}
}

// receive passes frames through Params and Parse to r, and returns the
// message they complete; an error or no message fails t.
func receive(t *testing.T, r *Receiver, peer string, frames []Frame, shuffle bool) *Message {
	t.Helper()
	if shuffle {
		frames = append([]Frame(nil), frames...)
		rand.Shuffle(len(frames), func(i, j int) { frames[i], frames[j] = frames[j], frames[i] })
	}
	var got *Message
	for _, f := range frames {
		p, err := Parse(f.Params())
		if err != nil {
			t.Fatalf("parse %s: %v", f.Params(), err)
		}
		m, err := r.Add(peer, p, false, time.Now(), f.CVM.FrameType)
		if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			got = m
		}
	}
	if got == nil {
		t.Fatal("the frames completed no message")
	}
	if got.Start != FrameStart || got.End != FrameEnd {
		t.Fatalf("infos %v %v", got.Start, got.End)
	}
	return got
}

// TestCutOnRuneBoundaries: the stock SDK's example, {"a":"é😀"} in chunks
// of at most 4 bytes: {"a", :"é, 😀, "}.
func TestCutOnRuneBoundaries(t *testing.T) {
	msg := `{"a":"é😀"}`
	// A measure counting the data's bytes only.
	chunks, err := Cut(msg, Limits{Message: 4}, func(d string) (Size, error) { return Size{Message: len(d)}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{`{"a"`, `:"é`, `😀`, `"}`}; strings.Join(chunks, "|") != strings.Join(want, "|") {
		t.Fatalf("chunks %q, want %q", chunks, want)
	}
	if _, err := Cut("😀", Limits{Message: 3}, func(d string) (Size, error) { return Size{Message: len(d)}, nil }); !errors.Is(err, ErrTooSmall) {
		t.Fatalf("a character over the limit: %v", err)
	}
	// Bytes that are not UTF-8 are cut as the wire sends them: U+FFFD.
	chunks, err = Cut("a\xffb", Limits{Message: 3}, func(d string) (Size, error) { return Size{Message: len(d)}, nil })
	if err != nil || strings.Join(chunks, "") != "a\uFFFDb" {
		t.Fatalf("invalid UTF-8 cut into %q: %v", chunks, err)
	}
}

// frames builds the frames of msg in chunks of n bytes from base.
func frames(t *testing.T, msg string, n int, base int64) []Frame {
	t.Helper()
	chunks, err := Cut(msg, Limits{Message: n}, func(d string) (Size, error) { return Size{Message: len(d)}, nil })
	if err != nil {
		t.Fatal(err)
	}
	return Build(msg, json.RawMessage(`5`), chunks, base)
}

// TestReceiverOrdersAndBases: both chunk bases (2, and 3 after an accept
// slot, as the stock client sends without waiting for the accept), with
// more chunks than the stock receiver's window of 21, in order and
// shuffled (start, chunks and end in any order) within the window.
func TestReceiverOrdersAndBases(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"text":"` + strings.Repeat("0123456789", 300) + `"}}`
	for _, base := range []int64{2, 3} {
		for _, shuffle := range []bool{false, true} {
			fs := frames(t, msg, 50, base) // 61 chunks
			if shuffle {
				// Shuffled within the window: blocks of 32 frames.
				for i := 0; i < len(fs); i += 32 {
					b := fs[i:min(i+32, len(fs))]
					rand.Shuffle(len(b), func(x, y int) { b[x], b[y] = b[y], b[x] })
				}
			}
			got := receive(t, NewReceiver(Policy{Window: 40}), "p", fs, false)
			if string(got.Data) != msg || got.Token != "5" {
				t.Fatalf("base %d shuffled %v: got %q", base, shuffle, got.Data)
			}
		}
	}
}

// addAll adds frames (after Parse) and returns the last result.
func addAll(r *Receiver, peer string, fs []Frame, now time.Time) (*Message, error) {
	var m *Message
	var err error
	for _, f := range fs {
		if m, err = r.Add(peer, f, false, now, f.CVM.FrameType); err != nil {
			return nil, err
		}
	}
	return m, err
}

// TestReceiverRefuses: a wrong digest, a wrong length, a chunk missing
// (the end came: after EndWait), a chunk beyond the window, a transfer
// over the limits (bytes, chunks, per peer, in total), two different
// chunks at one progress, an end that fits no base, an abort, and a
// transfer whose frames stop (Idle): each fails with its error, names
// the end frame's info when the end came (or when it comes later), and
// gives its memory back.
func TestReceiverRefuses(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{"text":"` + strings.Repeat("z", 1000) + `"}}`
	now := time.Now()
	for _, tc := range []struct {
		name   string
		policy Policy
		frames func() []Frame
		sweep  time.Duration // sweep this long after
		want   error
		end    bool // the error names the end frame
	}{
		{"digest", Policy{}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			fs[0].CVM.Digest = Digest([]byte("another"))
			return fs
		}, 0, ErrDigest, true},
		{"length", Policy{}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			fs[0].CVM.TotalBytes++
			return fs
		}, 0, ErrLength, true},
		{"missing chunk", Policy{}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			return append(fs[:3], fs[4:]...)
		}, DefaultEndWait, ErrIncomplete, true},
		{"beyond the window", Policy{Window: 3}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			return []Frame{fs[0], fs[1], fs[6]}
		}, 0, ErrLimit, false},
		{"too many bytes", Policy{MaxBytes: 500}, func() []Frame { return frames(t, msg, 100, 2) }, 0, ErrLimit, false},
		{"too many chunks", Policy{MaxChunks: 5}, func() []Frame { return frames(t, msg, 100, 2) }, 0, ErrLimit, false},
		{"conflicting chunks", Policy{}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			other := fs[2]
			other.CVM.Data = "other"
			return []Frame{fs[0], fs[2], other}
		}, 0, ErrSequence, false},
		{"end fits no base", Policy{}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			fs[len(fs)-1].Progress += 5
			return fs
		}, 0, ErrSequence, true},
		{"abort", Policy{}, func() []Frame {
			fs := frames(t, msg, 100, 2)
			return []Frame{fs[0], fs[1], Abort(fs[0].ProgressToken, 9, "gave up")}
		}, 0, ErrAborted, false},
		{"idle", Policy{}, func() []Frame { return frames(t, msg, 100, 2)[:4] }, DefaultIdle, ErrTimeout, false},
		{"no start", Policy{}, func() []Frame { return frames(t, msg, 100, 2)[1:4] }, DefaultIdle, ErrTimeout, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReceiver(tc.policy)
			m, err := addAll(r, "p", tc.frames(), now)
			if tc.sweep > 0 {
				if err != nil || m != nil {
					t.Fatalf("before the sweep: %v %v", m, err)
				}
				if errs := r.Sweep(now.Add(tc.sweep - time.Millisecond)); len(errs) != 0 {
					t.Fatalf("swept early: %v", errs)
				}
				errs := r.Sweep(now.Add(tc.sweep))
				if len(errs) != 1 {
					t.Fatalf("sweep: %v", errs)
				}
				err = errs[0]
			}
			var e *Error
			if !errors.Is(err, tc.want) || !errors.As(err, &e) || m != nil {
				t.Fatalf("got %v %v, want %v", m, err, tc.want)
			}
			if (e.End == FrameEnd) != tc.end || e.Peer != "p" || e.Token != "5" {
				t.Fatalf("error %+v: end %v, want %v", e, e.End, tc.end)
			}
			if n, b := r.Load(); n != 0 || b != 0 {
				t.Fatalf("%d transfers holding %d bytes left", n, b)
			}
			// Its late chunks are ignored; its end, if it had not come,
			// gets the error (its sender waits for the answer to it).
			late := frames(t, msg, 100, 2)
			if m, err := addAll(r, "p", late[1:len(late)-1], now); m != nil || err != nil {
				t.Fatalf("late chunks: %v %v", m, err)
			}
			m, err = r.Add("p", late[len(late)-1], false, now, FrameEnd)
			if tc.end && (m != nil || err != nil) {
				t.Fatalf("a second end: %v %v", m, err)
			}
			if !tc.end && (!errors.Is(err, tc.want) || !errors.As(err, &e) || e.End != FrameEnd) {
				t.Fatalf("the late end: %v %v, want %v naming it", m, err, tc.want)
			}
		})
	}
}

// TestReceiverBounds: one peer gets MaxPerPeer transfers at once and its
// bytes' share; all peers MaxTransfers and MaxTotalBytes. Memory counts
// each transfer's declared bytes from its start.
func TestReceiverBounds(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":"` + strings.Repeat("y", 400) + `"}`
	now := time.Now()
	start := func(tok int) Frame {
		f := frames(t, msg, 100, 2)[0]
		f.ProgressToken = json.RawMessage(strconv.Itoa(tok))
		return f
	}
	r := NewReceiver(Policy{MaxPerPeer: 2, MaxTransfers: 3, MaxBytes: 1000, MaxPeerBytes: 1000, MaxTotalBytes: 1400})
	for i, tc := range []struct {
		peer string
		want error
	}{{"a", nil}, {"a", nil}, {"a", ErrLimit} /* third of a */, {"b", nil}, {"c", ErrLimit} /* fourth at once */} {
		_, err := r.Add(tc.peer, start(i), false, now, nil)
		if !errors.Is(err, tc.want) && (err != nil || tc.want != nil) {
			t.Fatalf("start %d of %s: %v, want %v", i, tc.peer, err, tc.want)
		}
	}
	if n, b := r.Load(); n != 3 || b != 3*int64(len(msg)) {
		t.Fatalf("load %d transfers %d bytes", n, b)
	}
	r2 := NewReceiver(Policy{MaxBytes: 1000, MaxPeerBytes: 1000, MaxTotalBytes: 1000})
	if _, err := r2.Add("a", start(1), false, now, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Add("a", start(2), false, now, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Add("b", start(3), false, now, nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("a start over the total bytes: %v", err)
	}
}

// TestParse: what Parse takes and refuses.
func TestParse(t *testing.T) {
	digest := Digest([]byte("x"))
	for _, tc := range []struct {
		params string
		ok     bool
	}{
		{`{"progressToken":"1","progress":1,"message":"m","cvm":{"type":"oversized-transfer","frameType":"start","completionMode":"render","digest":"` + digest + `","totalBytes":1,"totalChunks":1}}`, true},
		{`{"progressToken":1,"progress":2,"cvm":{"type":"oversized-transfer","frameType":"chunk","data":"x"}}`, true},
		{`{"progressToken":"t","progress":3,"cvm":{"type":"oversized-transfer","frameType":"end"}}`, true},
		{`{"progressToken":"t","progress":2,"cvm":{"type":"oversized-transfer","frameType":"accept"}}`, true},
		{`{"progressToken":"t","progress":9,"cvm":{"type":"oversized-transfer","frameType":"abort","reason":"r"}}`, true},
		{`{"progressToken":"","progress":1,"cvm":{"type":"oversized-transfer","frameType":"end"}}`, false},
		{`{"progressToken":null,"progress":1,"cvm":{"type":"oversized-transfer","frameType":"end"}}`, false},
		{`{"progressToken":{},"progress":1,"cvm":{"type":"oversized-transfer","frameType":"end"}}`, false},
		{`{"progressToken":"t","progress":0,"cvm":{"type":"oversized-transfer","frameType":"end"}}`, false},
		{`{"progressToken":"t","progress":1.5,"cvm":{"type":"oversized-transfer","frameType":"end"}}`, false},
		{`{"progressToken":"t","progress":2,"cvm":{"type":"oversized-transfer","frameType":"chunk"}}`, false},
		{`{"progressToken":"t","progress":1,"cvm":{"type":"oversized-transfer","frameType":"start","digest":"sha256:AB","totalBytes":1,"totalChunks":1}}`, false},
		{`{"progressToken":"t","progress":1,"cvm":{"type":"oversized-transfer","frameType":"start","digest":"` + digest + `","totalBytes":1,"totalChunks":2}}`, false},
		{`{"progressToken":"t","progress":1,"cvm":{"type":"oversized-transfer","frameType":"middle"}}`, false},
		{`{"progressToken":"t","progress":1,"cvm":{"type":"open-stream","frameType":"end"}}`, false},
		{`{"progressToken":"t","progress":1}`, false},
		{`[]`, false},
	} {
		_, err := Parse(json.RawMessage(tc.params))
		if (err == nil) != tc.ok {
			t.Errorf("Parse(%s): %v, want ok %v", tc.params, err, tc.ok)
		}
	}
	if !IsFrame(Method, json.RawMessage(`{"progressToken":1,"progress":1,"cvm":{"type":"oversized-transfer"}}`)) ||
		IsFrame(Method, json.RawMessage(`{"progressToken":1,"progress":1,"message":"oversized-transfer"}`)) ||
		IsFrame("notifications/message", json.RawMessage(`{"cvm":{"type":"oversized-transfer"}}`)) {
		t.Fatal("IsFrame")
	}
}

// TestFrameWire: the frames as the stock SDK writes them (key order,
// no message on chunks, the digest of the exact bytes).
func TestFrameWire(t *testing.T) {
	msg := `{"a":"é😀"}`
	fs := Build(msg, json.RawMessage(`"1"`), []string{`{"a"`, `:"é`, `😀`, `"}`}, 2)
	want := []string{
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"1","progress":1,"message":"starting oversized transfer","cvm":{"type":"oversized-transfer","frameType":"start","completionMode":"render","digest":"sha256:` + digestHex(msg) + `","totalBytes":14,"totalChunks":4}}}`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"1","progress":2,"cvm":{"type":"oversized-transfer","frameType":"chunk","data":"{\"a\""}}}`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"1","progress":6,"message":"oversized transfer complete","cvm":{"type":"oversized-transfer","frameType":"end"}}}`,
	}
	for i, f := range []Frame{fs[0], fs[1], fs[5]} {
		if got := f.Content(); got != want[i] {
			t.Errorf("frame %d:\n got %s\nwant %s", i, got, want[i])
		}
	}
}

func digestHex(s string) string { return strings.TrimPrefix(Digest([]byte(s)), DigestPrefix) }

// TestMaxWrapped: the largest inner event whose gift wrap fits.
func TestMaxWrapped(t *testing.T) {
	const overhead = 400
	for _, limit := range []int{48_000, 64 << 10, 1 << 20} {
		n := MaxWrapped(Limits{Message: limit}, overhead)
		if n > MaxNIP44Plaintext || overhead+NIP44Len(n) > limit {
			t.Fatalf("limit %d: %d does not fit", limit, n)
		}
		if n < MaxNIP44Plaintext && overhead+NIP44Len(n+1) <= limit {
			t.Fatalf("limit %d: %d is not the largest", limit, n)
		}
	}
	// NIP-44's padding, from its test vectors' lengths.
	for n, want := range map[int]int{1: 32, 32: 32, 33: 64, 37: 64, 65: 96, 100: 128, 257: 320, 383: 384, 385: 448, 65535: 65536} {
		if got := nip44Padded(n); got != want {
			t.Errorf("padded(%d) = %d, want %d", n, got, want)
		}
	}
}
