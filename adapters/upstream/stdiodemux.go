package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
)

// rawIDPrefix starts the JSON-RPC id of every raw call (callRaw).
const rawIDPrefix = "capvend-raw-"

// stdioDemux sits between a stdio child and mcp-go's transport on it
// (transport.NewIO): it reads the child's stdout line by line, hands the
// answers to raw calls (ids rawIDPrefix…) to their callers, and passes
// every other line on to mcp-go's transport through a pipe; raw calls
// write their request to the child's stdin themselves. mcp-go's
// transport encodes each request it sends (json.Marshal, which checks
// and compacts the params again) and decodes every line it reads twice
// (its kind, then the message): that was 6 % of capvend's CPU per free
// call to a stdio upstream. A raw answer here is checked once
// (json.Valid) and read off the bytes (plainAnswer).
//
// Both writers share the child's stdin through stdin: one Write per
// message (mcp-go writes each message with its newline in one call), so
// messages never interleave.
type stdioDemux struct {
	in    *bufio.Reader
	fwd   *io.PipeWriter // mcp-go's transport reads the other end
	fwdR  *io.PipeReader
	stdin *stdinWriter

	done chan struct{} // closed when run returns

	mu      sync.Mutex
	waiting map[string]chan rawReply // raw id (unquoted) → its caller
	ended   error                    // why the child's stdout ended, once it did
}

// rawReply is a raw call's answer: its result, or its error member.
type rawReply struct {
	result json.RawMessage
	err    error
	ended  bool // err: the child's stdout ended
}

// newStdioDemux returns the demux of a child's stdout and stdin, and the
// reader mcp-go's transport reads instead of stdout; run reads stdout.
func newStdioDemux(stdout io.Reader, stdin io.WriteCloser) (*stdioDemux, io.Reader) {
	pr, pw := io.Pipe()
	return &stdioDemux{
		in: bufio.NewReaderSize(stdout, 64<<10), fwd: pw, fwdR: pr,
		stdin: &stdinWriter{w: stdin}, waiting: make(map[string]chan rawReply), done: make(chan struct{}),
	}, pr
}

// run reads the child's stdout until it ends, then fails the raw calls
// waiting and ends mcp-go's reading with the same error.
func (d *stdioDemux) run() {
	defer close(d.done)
	var long []byte // a line longer than the reader's buffer
	for {
		line, err := d.in.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			continue
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if len(line) > 0 && !d.deliver(line) {
			// An error: mcp-go's transport is closed (close), and the
			// line is dropped.
			_, _ = d.fwd.Write(line)
		}
		if err != nil {
			d.end(err)
			return
		}
	}
}

// deliver hands line to the raw call it answers, and reports whether it
// was one (a line for no raw call waiting, such as the late answer of a
// call given up, is dropped as mcp-go's transport drops it). It tells a
// response as mcp-go's transport does (json.Unmarshal: names matched
// without regard to case, the last of a name repeated); the usual answer
// (members jsonrpc, id and result, as written) is read off the bytes.
func (d *stdioDemux) deliver(line []byte) bool {
	if !bytes.Contains(line, []byte(`"`+rawIDPrefix)) {
		return false
	}
	msg := bytes.TrimRight(line, "\r\n")
	if !json.Valid(msg) {
		return false // mcp-go's transport drops it
	}
	var r rawReply
	var id string
	if rid, result, ok := plainAnswer(msg); ok && len(rid) > 2 && rid[0] == '"' && bytes.IndexByte(rid, '\\') < 0 &&
		bytes.HasPrefix(rid[1:], []byte(rawIDPrefix)) {
		id, r.result = string(rid[1:len(rid)-1]), append(json.RawMessage(nil), result...)
	} else {
		var m struct {
			ID     json.RawMessage          `json:"id"`
			Method string                   `json:"method"`
			Result json.RawMessage          `json:"result"`
			Error  *mcp.JSONRPCErrorDetails `json:"error"`
		}
		if json.Unmarshal(msg, &m) != nil || m.Method != "" || json.Unmarshal(m.ID, &id) != nil || !strings.HasPrefix(id, rawIDPrefix) {
			return false
		}
		switch {
		case m.Error != nil:
			r.err = m.Error.AsError()
		case m.Result != nil:
			r.result = append(json.RawMessage(nil), m.Result...)
		default:
			r.err = errors.New("answer without result or error")
		}
	}
	d.mu.Lock()
	ch := d.waiting[id]
	delete(d.waiting, id)
	d.mu.Unlock()
	if ch != nil {
		ch <- r // buffered
	}
	return true
}

// call writes a raw call's request line (id, unquoted, is its id) and
// waits for its answer: the result, or the error member as an error
// (rpcErr); err is the transport's (or ctx's).
func (d *stdioDemux) call(ctx context.Context, id string, request []byte) (result json.RawMessage, rpcErr, err error) {
	ch := make(chan rawReply, 1)
	d.mu.Lock()
	if d.ended != nil {
		err := d.ended
		d.mu.Unlock()
		return nil, nil, fmt.Errorf("upstream's stdout ended: %w", err)
	}
	d.waiting[id] = ch
	d.mu.Unlock()
	forget := func() {
		d.mu.Lock()
		delete(d.waiting, id)
		d.mu.Unlock()
	}
	if _, err := d.stdin.Write(request); err != nil {
		forget()
		return nil, nil, fmt.Errorf("write request: %w", err)
	}
	select {
	case r := <-ch:
		if r.ended {
			return nil, nil, r.err
		}
		return r.result, r.err, nil
	case <-ctx.Done():
		forget()
		return nil, nil, ctx.Err()
	}
}

// end fails the raw calls waiting and every later one with err, and ends
// mcp-go's reading with it.
func (d *stdioDemux) end(err error) {
	d.mu.Lock()
	if d.ended == nil {
		d.ended = err
	}
	waiting := d.waiting
	d.waiting = map[string]chan rawReply{}
	d.mu.Unlock()
	for _, ch := range waiting {
		ch <- rawReply{err: fmt.Errorf("upstream's stdout ended: %w", err), ended: true}
	}
	_ = d.fwd.CloseWithError(err)
}

// close stops passing lines on (mcp-go's transport was closed): a line
// waiting to be read by it is dropped, so run keeps reading until the
// child's stdout ends.
func (d *stdioDemux) close() {
	_ = d.fwdR.CloseWithError(io.ErrClosedPipe)
}

// stdinWriter makes each Write on w whole: writes from the raw calls and
// mcp-go's transport to a child's stdin do not interleave.
type stdinWriter struct {
	mu sync.Mutex
	w  io.WriteCloser
}

func (l *stdinWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *stdinWriter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Close()
}
