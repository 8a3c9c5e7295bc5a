package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// h1Client posts the raw forwarder's requests (post) to a plain-HTTP
// upstream over HTTP/1.1 keep-alive connections it pools itself, writing
// the request and reading the response in the caller's goroutine: net/http's
// Transport hands each request to a connection's writeLoop goroutine and
// its response back from a readLoop goroutine, which on a free call costs
// more CPU than the call's own work. A tools/call is written as bytes
// and its usual answer read by hand (postPlain, in h1plain.go); other
// requests are written by http.Request.Write and other responses read by
// http.ReadResponse, as the Transport does (less its gzip: no
// Accept-Encoding is sent, so the upstream answers uncompressed).
//
// An idle connection the upstream closed is not used: net/http's readLoop
// notices the close while the connection is idle, this client checks
// each connection it takes from the pool (alive). Like the Transport for a
// POST, a request is sent again (once, on a new connection) only if it
// could not be written: once written, the upstream may have run it, and a
// tool call must not run twice. Anything else this client does not do
// goes through httpClient: https, a proxy from the environment (see
// newH1Client).
type h1Client struct {
	addr string // host:port to dial
	line string // the request's first lines (requestLine); "" if postPlain cannot be used
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	now  func() time.Time

	mu   sync.Mutex
	idle []*h1Conn // most recently used last
}

// h1Conn is one pooled connection.
type h1Conn struct {
	idleSince time.Time // when it went back to the pool
	c         net.Conn
	r         countingReader
	br        *bufio.Reader
	bw        *bufio.Writer
}

// countingReader counts the bytes read from its connection.
type countingReader struct {
	c net.Conn
	n int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	r.n += int64(n)
	return n, err
}

// newH1Client returns an h1Client for the upstream at rawURL, or nil if
// its requests must go through httpClient: not http, or a proxy applies
// (HTTP_PROXY and NO_PROXY, as http.DefaultTransport reads them).
func newH1Client(rawURL string) *h1Client {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil
	}
	if p, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err != nil || p != nil {
		return nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second} // http.DefaultTransport's
	return &h1Client{addr: addr, line: requestLine(u), dial: d.DialContext, now: time.Now}
}

// do sends req (its body a *bytes.Reader, *bytes.Buffer or
// *strings.Reader: one that can be sent again) and returns the response.
// Its body must be closed: read to its end, it gives the connection back
// to the pool. The request's context ends a call at any point.
func (h *h1Client) do(req *http.Request) (*http.Response, error) {
	sent := false
	write := func(w *bufio.Writer) error {
		if sent { // a second attempt: the body again
			body, err := req.GetBody()
			if err != nil {
				return err
			}
			req.Body = body
		}
		sent = true
		return req.Write(w)
	}
	r, err := h.exchange(req.Context(), write, req, false)
	return r.resp, err
}

// h1Answer is an exchange's answer: the body of a plain JSON response
// (fast), or else the response, its body to close.
type h1Answer struct {
	fast bool
	body []byte
	resp *http.Response
}

// exchange writes a request with write and reads its answer (see
// roundTrip), on a pooled connection or a new one. Like the Transport for
// a POST, the request is written again (once, on a new connection) only
// if it could not be written on a pooled one.
func (h *h1Client) exchange(ctx context.Context, write func(*bufio.Writer) error, req *http.Request, fast bool) (h1Answer, error) {
	for attempt := 0; ; attempt++ {
		pc := h.get()
		reused := pc != nil
		if pc == nil {
			c, err := h.dial(ctx, "tcp", h.addr)
			if err != nil {
				return h1Answer{}, err
			}
			pc = newH1Conn(c)
		}
		a, err := h.roundTrip(ctx, pc, write, req, fast)
		if err == nil {
			return a, nil
		}
		if ctx.Err() != nil {
			return h1Answer{}, ctx.Err()
		}
		if !reused || attempt > 0 || !errors.Is(err, errNotSent) {
			return h1Answer{}, err
		}
	}
}

// errNotSent wraps a failure to write a request: the upstream did not get
// all of it, so it did not run it.
var errNotSent = errors.New("the request could not be sent")

// errNoResponse wraps a failure on a connection after the request was
// sent and before any byte of the response arrived: the upstream may have
// run it.
var errNoResponse = errors.New("connection failed before the response")

// roundTrip writes a request on pc with write and reads the answer: with
// fast, a plain JSON response (readPlain) is read here, in full, and pc
// goes back to the pool; any other response is read by http.ReadResponse
// (for req, nil for a POST), as the Transport reads it. On error pc is
// closed.
func (h *h1Client) roundTrip(ctx context.Context, pc *h1Conn, write func(*bufio.Writer) error, req *http.Request, fast bool) (h1Answer, error) {
	// The context's end unblocks the connection's reads and writes.
	stop := context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(aLongTimeAgo) })
	before := pc.r.n
	fail := func(err error) (h1Answer, error) {
		stop()
		pc.c.Close()
		if pc.r.n == before {
			return h1Answer{}, errors.Join(errNoResponse, err)
		}
		return h1Answer{}, err
	}
	if err := write(pc.bw); err != nil {
		return h1Answer{}, notSent(stop, pc, err)
	}
	if err := pc.bw.Flush(); err != nil {
		return h1Answer{}, notSent(stop, pc, err)
	}
	if fast {
		body, keep, ok, err := readPlain(pc.br)
		if err != nil {
			return fail(err)
		}
		if ok {
			h.release(pc, stop, keep)
			return h1Answer{fast: true, body: body}, nil
		}
	}
	if req == nil {
		req = &http.Request{Method: http.MethodPost}
	}
	resp, err := http.ReadResponse(pc.br, req)
	// Interim answers (100 Continue, 103 Early Hints) come before the
	// response, as the Transport skips them.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(pc.br, req)
	}
	if err != nil {
		return fail(err)
	}
	resp.Body = &h1Body{ReadCloser: resp.Body, h: h, pc: pc, stop: stop, keep: !resp.Close}
	return h1Answer{resp: resp}, nil
}

// notSent closes pc, whose request could not be written.
func notSent(stop func() bool, pc *h1Conn, err error) error {
	stop()
	pc.c.Close()
	return errors.Join(errNotSent, err)
}

// h1Body is a response's body: closed after it was read to its end, it
// puts its connection back in the pool, else closes it.
type h1Body struct {
	io.ReadCloser
	h    *h1Client
	pc   *h1Conn
	stop func() bool
	keep bool // the response does not ask to close the connection
	eof  bool
	done bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *h1Body) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	err := b.ReadCloser.Close()
	b.h.release(b.pc, b.stop, b.eof && b.keep && err == nil)
	return err
}

// release ends pc's exchange (stop: its context watch): pc goes back to
// the pool if reusable (its response read to the end, no close asked)
// and nothing more came, else it is closed. stop false: the context ended
// and may have set a deadline on pc.
func (h *h1Client) release(pc *h1Conn, stop func() bool, reusable bool) {
	if stop() && reusable && pc.br.Buffered() == 0 {
		h.put(pc)
	} else {
		pc.c.Close()
	}
}

func newH1Conn(c net.Conn) *h1Conn {
	pc := &h1Conn{c: c}
	pc.r.c = c
	pc.br = bufio.NewReader(&pc.r)
	pc.bw = bufio.NewWriter(c)
	return pc
}

// get takes the most recently used idle connection that is still open;
// nil if none (those closed are dropped).
func (h *h1Client) get() *h1Conn {
	for {
		pc := h.getIdle()
		if pc == nil || pc.alive() {
			return pc
		}
		pc.c.Close()
	}
}

// aLongTimeAgo is a deadline that has passed: blocked reads and writes
// return at once.
var aLongTimeAgo = time.Unix(1, 0)

// alive reports whether the idle connection pc is still open: a peek that
// does not wait finds nothing to read (the upstream sent neither a close
// nor stray bytes). A connection that cannot be peeked at (not a socket)
// counts as open.
func (pc *h1Conn) alive() bool {
	if pc.br.Buffered() > 0 {
		return false
	}
	sc, ok := pc.c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, perr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK
		return true // done: never wait for the socket to be readable
	})
	return err == nil && open
}

// getIdle takes the most recently used idle connection; nil if none. The
// connections idle for h1IdleTimeout or longer are closed.
func (h *h1Client) getIdle() *h1Conn {
	h.mu.Lock()
	n := len(h.idle)
	if n == 0 {
		h.mu.Unlock()
		return nil
	}
	pc := h.idle[n-1]
	h.idle[n-1] = nil
	h.idle = h.idle[:n-1]
	var stale []*h1Conn
	if h.now().Sub(pc.idleSince) >= h1IdleTimeout {
		// The others are older still.
		stale = append(h.idle, pc)
		h.idle = nil
		pc = nil
	}
	h.mu.Unlock()
	for _, c := range stale {
		c.c.Close()
	}
	return pc
}

// h1IdleTimeout is how long an idle connection is kept: as
// http.DefaultTransport's IdleConnTimeout.
const h1IdleTimeout = 90 * time.Second

// put keeps pc for the next request, up to maxIdlePerUpstream.
func (h *h1Client) put(pc *h1Conn) {
	pc.idleSince = h.now()
	h.mu.Lock()
	if len(h.idle) < maxIdlePerUpstream {
		h.idle = append(h.idle, pc)
		pc = nil
	}
	h.mu.Unlock()
	if pc != nil {
		pc.c.Close()
	}
}

// close closes the idle connections.
func (h *h1Client) close() {
	h.mu.Lock()
	idle := h.idle
	h.idle = nil
	h.mu.Unlock()
	for _, pc := range idle {
		pc.c.Close()
	}
}
