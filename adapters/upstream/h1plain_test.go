package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
)

func TestPlainHead(t *testing.T) {
	for _, c := range []struct {
		head     string
		n        int
		keep, ok bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n", 12, true, true},
		{"HTTP/1.1 200 OK\r\ncontent-type:application/JSON\r\ncontent-length:  0 \r\nDate: x\r\n\r\n", 0, true, true},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", 2, false, true},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: keep-alive, Close\r\n\r\n", 2, false, true},
		// Each of these goes the general way.
		{"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 103 Early Hints\r\n\r\n", 0, false, false},
		{"http/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n Content-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: +2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nX: a\x01b\r\n\r\n", 0, false, false},
		{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n: empty\r\n\r\n", 0, false, false},
	} {
		n, keep, ok := plainHead([]byte(c.head))
		if n != c.n || keep != c.keep || ok != c.ok {
			t.Errorf("%q: %d %v %v, want %d %v %v", c.head, n, keep, ok, c.n, c.keep, c.ok)
		}
	}
}

// FuzzPlainHead: a head plainHead reads is read the same by
// http.ReadResponse: status 200, its Content-Length, Content-Type
// application/json, the connection closed or kept alike.
func FuzzPlainHead(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n")
	f.Add("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n")
	f.Add("HTTP/1.1 200 OK\r\ncontent-type: Application/Json\r\ncontent-length: 007\r\nX-A: \xff\r\n\r\n")
	f.Fuzz(func(t *testing.T, head string) {
		if headEnd([]byte(head)) != len(head) {
			return
		}
		n, keep, ok := plainHead([]byte(head))
		if !ok {
			return
		}
		msg := head + strings.Repeat("x", n)
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(msg)), nil)
		if err != nil {
			t.Fatalf("%q: plainHead reads it, http.ReadResponse: %v", head, err)
		}
		mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.ContentLength != int64(n) || mt != "application/json" || resp.Close == keep || err != nil || len(b) != n {
			t.Fatalf("%q: plainHead %d keep %v; http.ReadResponse %d, length %d, %q, close %v, body %d %v",
				head, n, keep, resp.StatusCode, resp.ContentLength, mt, resp.Close, len(b), err)
		}
	})
}

// plainPost posts body with postPlain and returns the answer's body.
func plainPost(h *h1Client, body string) (string, bool, error) {
	a, err := h.postPlain(context.Background(), []byte("Content-Type: application/json\r\n"), "tool", []byte(body))
	if err != nil {
		return "", false, err
	}
	if a.fast {
		return string(a.body), true, nil
	}
	defer a.resp.Body.Close()
	b, err := io.ReadAll(a.resp.Body)
	return fmt.Sprintf("%d %s", a.resp.StatusCode, b), false, err
}

// postPlain writes the request http.Request.Write writes for the same URL,
// headers and body.
func TestPostPlainRequest(t *testing.T) {
	got := make(chan *http.Request, 1)
	raw := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(b))
		got <- req
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	u, _ := url.Parse(raw + "?a=b")
	h := newH1Client(u.String())
	defer h.close()
	hdr := http.Header{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Accept", "application/json, text/event-stream")
	hdr.Set("X-Key", " a\nb ")
	block, ok := headerBlock(hdr)
	if !ok {
		t.Fatal("headerBlock refused", hdr)
	}
	if _, err := h.postPlain(context.Background(), block, "word_count", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	plain := <-got

	want, _ := http.NewRequest(http.MethodPost, u.String(), strings.NewReader(`{"x":1}`))
	want.Header = hdr.Clone()
	want.Header.Set("Mcp-Name", "word_count")
	var buf bytes.Buffer
	if err := want.Write(&buf); err != nil {
		t.Fatal(err)
	}
	written, err := http.ReadRequest(bufio.NewReader(&buf))
	if err != nil {
		t.Fatal(err)
	}
	wb, _ := io.ReadAll(written.Body)
	pb, _ := io.ReadAll(plain.Body)
	if plain.Method != written.Method || plain.RequestURI != written.RequestURI || plain.Host != written.Host ||
		plain.Proto != written.Proto || !reflect.DeepEqual(plain.Header, written.Header) || !bytes.Equal(pb, wb) {
		t.Errorf("postPlain wrote %s %s %s %s %v %s\nRequest.Write: %s %s %s %s %v %s", plain.Method, plain.RequestURI, plain.Host, plain.Proto, plain.Header, pb,
			written.Method, written.RequestURI, written.Host, written.Proto, written.Header, wb)
	}
	for _, k := range []string{"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"} {
		if _, ok := headerBlock(http.Header{k: {"x"}}); ok {
			t.Errorf("headerBlock takes %s", k)
		}
	}
}

// The response's head and body split across reads (a byte at a time) read
// as a whole; the connection is used again.
func TestPostPlainSplitReads(t *testing.T) {
	serve := func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			b, _ := io.ReadAll(req.Body)
			msg := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
			for i := range len(msg) {
				if _, err := c.Write([]byte{msg[i]}); err != nil {
					return
				}
			}
		}
	}
	raw := rawServer(t, serve, serve)
	h := newH1Client(raw)
	defer h.close()
	dials := countDials(h)
	for _, body := range []string{`{"a":1}`, `{"b":22}`} {
		got, fast, err := plainPost(h, body)
		if err != nil || got != body || !fast {
			t.Fatalf("%s: got %q fast %v, %v", body, got, fast, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1", n)
	}
}

// plainServer answers every request on a connection with the responses
// given, in turn (one per request), then closes it.
func plainServer(t *testing.T, conns ...[]string) string {
	var serve []func(net.Conn, *bufio.Reader)
	for _, resps := range conns {
		serve = append(serve, func(c net.Conn, br *bufio.Reader) {
			for _, r := range resps {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.ReadAll(req.Body)
				io.WriteString(c, r)
			}
		})
	}
	return rawServer(t, serve...)
}

const plainOK = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

func TestPostPlainResponses(t *testing.T) {
	for _, c := range []struct {
		name      string
		first     string // the first call's response, on the first connection
		want      string // its body ("500 ..." for a response read the general way)
		fast      bool
		fail      bool // the first call fails
		wantDials int32
		cut       bool // the upstream closes the connection after the first response
	}{
		{"plain", plainOK, "{}", true, false, 1, false},
		{"connection close", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", "{}", true, false, 2, false},
		{"longer than its length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}}", "{}", true, false, 2, false},
		{"shorter than its length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{}", "", false, true, 2, true},
		{"malformed status line", "HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}", "", false, true, 2, false},
		{"bare LF", "HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\n{}", "200 {}", false, false, 1, false},
		{"chunked", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "200 {}", false, false, 1, false},
		{"error status", "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nboom", "500 boom", false, false, 1, false},
		{"interim", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + plainOK, "200 {}", false, false, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := []string{c.first, plainOK}
			if c.cut {
				first = first[:1]
			}
			raw := plainServer(t, first, []string{plainOK})
			h := newH1Client(raw)
			defer h.close()
			dials := countDials(h)
			got, fast, err := plainPost(h, "{}")
			if c.fail {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				if errors.Is(err, errNoResponse) {
					t.Errorf("error %v says no response came", err)
				}
			} else if err != nil || got != c.want || fast != c.fast {
				t.Fatalf("got %q fast %v, %v; want %q fast %v", got, fast, err, c.want, c.fast)
			}
			// The next call: on the same connection only if it may be kept.
			if got, _, err := plainPost(h, "{}"); err != nil || got != "{}" {
				t.Fatalf("second call: %q, %v", got, err)
			}
			if n := dials.Load(); n != c.wantDials {
				t.Errorf("%d dials, want %d", n, c.wantDials)
			}
		})
	}
}

// postPlain keeps do's retry rule: a request it could not write on a
// pooled connection is written again on a new one; one the upstream read
// is not (TestH1NoRetryAfterRequestSent for do).
func TestPostPlainRetriesOnlyARequestNotSent(t *testing.T) {
	got := make(chan string, 4)
	serve := answerAll(got)
	readThenClose := func(c net.Conn, br *bufio.Reader) {
		answer(c, br, got)
		if req, err := http.ReadRequest(br); err == nil {
			b, _ := io.ReadAll(req.Body)
			got <- string(b)
		}
	}
	raw := rawServer(t, serve, serve, readThenClose)
	h := newH1Client(raw)
	defer h.close()
	var fail atomic.Bool
	dial := h.dial
	var dials atomic.Int32
	h.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil || dials.Add(1) > 1 {
			return c, err
		}
		return failingConn{c, &fail}, nil
	}
	if b, fast, err := plainPost(h, `"one"`); err != nil || b != `"one"` || !fast {
		t.Fatalf("first call: %q %v, %v", b, fast, err)
	}
	<-got
	fail.Store(true)
	if b, _, err := plainPost(h, `"two"`); err != nil || b != `"two"` {
		t.Fatalf("second call (its write failed on the pooled connection): %q, %v", b, err)
	}
	if g := <-got; g != `"two"` || dials.Load() != 2 {
		t.Fatalf("the upstream got %q, %d dials, want 2", g, dials.Load())
	}
	h.close() // the next call dials the connection that reads and closes
	if _, _, err := plainPost(h, `"three"`); err != nil {
		t.Fatal(err)
	}
	<-got
	if _, _, err := plainPost(h, `"four"`); !errors.Is(err, errNoResponse) {
		t.Fatalf("got %v, want the connection's failure before the response", err)
	}
	<-got
	if n := dials.Load(); n != 3 {
		t.Errorf("%d dials, want 3 (no retry after the upstream read the request)", n)
	}
}
