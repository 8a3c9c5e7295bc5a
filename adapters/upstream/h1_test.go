package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// h1Post posts body to url with h and returns the response's body.
func h1Post(ctx context.Context, h *h1Client, url, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return "", err
	}
	resp, err := h.do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// countDials makes h count its dials.
func countDials(h *h1Client) *atomic.Int32 {
	var n atomic.Int32
	dial := h.dial
	h.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return dial(ctx, network, addr)
	}
	return &n
}

func TestH1ReusesConnection(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "echo %s", b)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	h := newH1Client(srv.URL)
	if h == nil {
		t.Fatal("no h1Client for", srv.URL)
	}
	defer h.close()
	for i := range 3 {
		got, err := h1Post(context.Background(), h, srv.URL+"/mcp", fmt.Sprint(i))
		if err != nil || got != fmt.Sprintf("echo %d", i) {
			t.Fatalf("call %d: %q, %v", i, got, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 sequential calls, want 1", n)
	}
}

// rawServer accepts connections on a loopback listener and runs serve on
// each, in order, until the test ends.
func rawServer(t *testing.T, serve ...func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for _, f := range serve {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				f(c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/mcp"
}

// answerAll answers every request of a connection with its body (see
// answer).
func answerAll(got chan<- string) func(c net.Conn, br *bufio.Reader) {
	return func(c net.Conn, br *bufio.Reader) {
		for answer(c, br, got) {
		}
	}
}

// answer reads one request from br and answers it with its body; false if
// none came.
func answer(c net.Conn, br *bufio.Reader, got chan<- string) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	b, _ := io.ReadAll(req.Body)
	got <- string(b)
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	return true
}

// The upstream closed the idle connection (without saying so): the next
// request does not use it; it goes on a new connection.
func TestH1SkipsClosedIdleConnection(t *testing.T) {
	got := make(chan string, 4)
	closed := make(chan struct{})
	url := rawServer(t,
		func(c net.Conn, br *bufio.Reader) {
			answer(c, br, got)
			c.Close()
			close(closed)
		},
		answerAll(got))
	h := newH1Client(url)
	defer h.close()
	dials := countDials(h)
	if b, err := h1Post(context.Background(), h, url, "one"); err != nil || b != "one" {
		t.Fatalf("first call: %q, %v", b, err)
	}
	<-got
	<-closed
	// The close reaches this side's socket within a moment; wait for it
	// as a reader would (a deadlock guard, not a speed check).
	deadline := time.Now().Add(10 * time.Second)
	for len(h.idle) == 1 && h.idle[0].alive() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if b, err := h1Post(context.Background(), h, url, "two"); err != nil || b != "two" {
		t.Fatalf("second call (the idle connection closed): %q, %v", b, err)
	}
	if g := <-got; g != "two" {
		t.Errorf("the new connection got %q", g)
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2", n)
	}
}

// failingConn fails its writes once fail is set.
type failingConn struct {
	net.Conn
	fail *atomic.Bool
}

func (c failingConn) Write(p []byte) (int, error) {
	if c.fail.Load() {
		return 0, errors.New("write: broken pipe")
	}
	return c.Conn.Write(p)
}

// A request that could not be written is sent again, once, on a new
// connection: the upstream did not get it.
func TestH1RetriesARequestNotSent(t *testing.T) {
	got := make(chan string, 4)
	serve := answerAll(got)
	url := rawServer(t, serve, serve)
	h := newH1Client(url)
	defer h.close()
	var fail atomic.Bool
	dial := h.dial
	dials := 0
	h.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials++
		c, err := dial(ctx, network, addr)
		if err != nil || dials > 1 {
			return c, err
		}
		return failingConn{c, &fail}, nil
	}
	if b, err := h1Post(context.Background(), h, url, "one"); err != nil || b != "one" {
		t.Fatalf("first call: %q, %v", b, err)
	}
	<-got
	fail.Store(true)
	if b, err := h1Post(context.Background(), h, url, "two"); err != nil || b != "two" {
		t.Fatalf("second call (its write failed on the pooled connection): %q, %v", b, err)
	}
	if g := <-got; g != "two" {
		t.Errorf("the upstream got %q", g)
	}
	if dials != 2 {
		t.Errorf("%d dials, want 2", dials)
	}
}

// A request the upstream read is not sent again when the connection
// fails before the response: the upstream may have run the tool.
func TestH1NoRetryAfterRequestSent(t *testing.T) {
	got := make(chan string, 4)
	url := rawServer(t,
		func(c net.Conn, br *bufio.Reader) {
			answer(c, br, got)
			if req, err := http.ReadRequest(br); err == nil { // read, then close unanswered
				b, _ := io.ReadAll(req.Body)
				got <- string(b)
			}
		},
		answerAll(got))
	h := newH1Client(url)
	defer h.close()
	dials := countDials(h)
	if b, err := h1Post(context.Background(), h, url, "one"); err != nil || b != "one" {
		t.Fatalf("first call: %q, %v", b, err)
	}
	<-got
	_, err := h1Post(context.Background(), h, url, "two")
	if !errors.Is(err, errNoResponse) {
		t.Fatalf("got %v, want the connection's failure before the response", err)
	}
	if g := <-got; g != "two" {
		t.Fatalf("the upstream got %q", g)
	}
	select {
	case g := <-got:
		t.Fatalf("the request was sent again: the upstream got %q", g)
	case <-time.After(200 * time.Millisecond): // a second copy would follow at once
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1 (no retry)", n)
	}
}

// Once a byte of the response came, a failed request is not sent again:
// the upstream may have done the work.
func TestH1NoRetryAfterResponseBytes(t *testing.T) {
	got := make(chan string, 4)
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		answer(c, br, got)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		got <- "partial"
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10") // and closes
	})
	h := newH1Client(url)
	defer h.close()
	dials := countDials(h)
	if _, err := h1Post(context.Background(), h, url, "one"); err != nil {
		t.Fatal(err)
	}
	_, err := h1Post(context.Background(), h, url, "two")
	if err == nil {
		t.Fatal("a cut response read as a success")
	}
	if errors.Is(err, errNoResponse) {
		t.Errorf("error %v: says no response byte came", err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1 (no retry)", n)
	}
}

// A request on a new connection is not sent again either.
func TestH1NoRetryOnNewConnection(t *testing.T) {
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) { _, _ = http.ReadRequest(br) })
	h := newH1Client(url)
	defer h.close()
	dials := countDials(h)
	if _, err := h1Post(context.Background(), h, url, "one"); err == nil {
		t.Fatal("no error from a connection closed without an answer")
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1", n)
	}
}

// The request's context ends a call waiting for its answer.
func TestH1ContextEndsCall(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err == nil {
			close(arrived)
			<-release
		}
	})
	h := newH1Client(url)
	defer h.close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	if _, err := h1Post(ctx, h, url, "one"); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if len(h.idle) != 0 {
		t.Error("the cancelled call's connection went back to the pool")
	}
}

func TestNewH1ClientOnlyPlainHTTP(t *testing.T) {
	for _, u := range []string{"https://example.com/mcp", "unix:///x", "http:///nohost"} {
		if newH1Client(u) != nil {
			t.Errorf("%s: h1Client, want httpClient", u)
		}
	}
	if h := newH1Client("http://example.com/mcp"); h == nil || h.addr != "example.com:80" {
		t.Errorf("http://example.com/mcp: %+v", h)
	}
}

// An interim answer (103 Early Hints) before the response is skipped.
func TestH1SkipsInterimAnswers(t *testing.T) {
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	h := newH1Client(url)
	defer h.close()
	if b, err := h1Post(context.Background(), h, url, "one"); err != nil || b != "ok" {
		t.Errorf("got %q, %v", b, err)
	}
}

// A connection idle for h1IdleTimeout is not used again: the call dials.
func TestH1DropsStaleIdleConnections(t *testing.T) {
	got := make(chan string, 4)
	url := rawServer(t,
		answerAll(got),
		answerAll(got))
	h := newH1Client(url)
	defer h.close()
	dials := countDials(h)
	now := time.Now()
	h.now = func() time.Time { return now }
	for i, want := range []int32{1, 1, 2} {
		if i == 2 {
			now = now.Add(h1IdleTimeout)
		}
		if _, err := h1Post(context.Background(), h, url, "x"); err != nil {
			t.Fatal(err)
		}
		<-got
		if n := dials.Load(); n != want {
			t.Errorf("call %d: %d dials, want %d", i, n, want)
		}
	}
}
