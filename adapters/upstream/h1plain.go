package upstream

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/mark3labs/mcp-go/mcp"
)

// The plain exchange of h1Client: a tools/call is written as bytes (no
// http.Request, no header map) and the usual answer, a 200 JSON response
// with a Content-Length, is read by hand (readPlain); any other response
// (chunked, an event stream, an error status, an interim answer, a head
// with anything this reader does not check as http.ReadResponse does) is
// read by http.ReadResponse, as before.

// requestLine is what http.Request.Write writes for a POST to u before
// its Content-Length: the request line, Host and User-Agent; "" if u's
// host is one Request.Write would rewrite (not plain ASCII, or a zone).
func requestLine(u *url.URL) string {
	for i := 0; i < len(u.Host); i++ {
		c := u.Host[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == ':' || c == '[' || c == ']') {
			return ""
		}
	}
	if !plainHeaderValue(u.RequestURI()) {
		return ""
	}
	return "POST " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: Go-http-client/1.1\r\n"
}

// plainHeaderValue reports whether v is written as it is in a header:
// not empty, visible ASCII and inner spaces (no control byte to replace,
// no space to trim).
func plainHeaderValue(v string) bool {
	if v == "" || v[0] == ' ' || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// headerBlock is h written as http.Request.Write writes a request's
// header (sorted, values cleaned); false if h holds a header Request.Write
// writes otherwise (Host, User-Agent, Content-Length, Transfer-Encoding,
// Trailer).
func headerBlock(h http.Header) ([]byte, bool) {
	for _, k := range []string{"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"} {
		if _, ok := h[k]; ok {
			return nil, false
		}
	}
	var b bytes.Buffer
	if h.Write(&b) != nil {
		return nil, false
	}
	return b.Bytes(), true
}

// postPlain posts body to the upstream with the header lines header (as
// headerBlock writes them) and an Mcp-Name of nameValue (a
// plainHeaderValue; none if ""), and returns the answer: the body of a
// plain JSON response, or the response. The retry rule is do's.
func (h *h1Client) postPlain(ctx context.Context, header []byte, nameValue string, body []byte) (h1Answer, error) {
	write := func(w *bufio.Writer) error {
		w.WriteString(h.line)
		w.WriteString("Content-Length: ")
		w.Write(strconv.AppendInt(w.AvailableBuffer(), int64(len(body)), 10))
		w.WriteString("\r\n")
		w.Write(header)
		if nameValue != "" {
			w.WriteString(mcpNameKey)
			w.WriteString(nameValue)
			w.WriteString("\r\n")
		}
		w.WriteString("\r\n")
		_, err := w.Write(body)
		return err
	}
	return h.exchange(ctx, write, nil, true)
}

// maxPlainBody bounds the body readPlain reads into one slice; a longer
// one is read the general way.
const maxPlainBody = 1 << 20

// readPlain reads a response from br if it is a plain one: HTTP/1.1 200,
// Content-Type application/json, a Content-Length, no Transfer-Encoding,
// and a head http.ReadResponse would read the same (CRLF line ends, valid
// names and values). ok false: nothing was consumed; err: br failed.
// keep false: the response asks to close the connection.
func readPlain(br *bufio.Reader) (body []byte, keep, ok bool, err error) {
	head, err := peekHead(br)
	if err != nil || head == nil {
		return nil, false, false, err
	}
	n, keep, ok := plainHead(head)
	if !ok {
		return nil, false, false, nil
	}
	_, _ = br.Discard(len(head))
	body = make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, false, false, err
	}
	return body, keep, true, nil
}

// peekHead returns the response head at the start of br, up to and with
// its blank line, without consuming it; nil if it does not fit in br's
// buffer. It reads until the head is complete.
func peekHead(br *bufio.Reader) ([]byte, error) {
	for n := 1; ; {
		if _, err := br.Peek(n); err != nil {
			if err == bufio.ErrBufferFull {
				return nil, nil
			}
			return nil, err
		}
		b, _ := br.Peek(br.Buffered())
		if i := headEnd(b); i > 0 {
			return b[:i], nil
		}
		n = len(b) + 1
	}
}

// headEnd returns the length of the head b starts with, up to the end of
// its first empty line (CRLF or a bare LF, which plainHead refuses); 0 if
// b holds no empty line yet.
func headEnd(b []byte) int {
	for i := bytes.IndexByte(b, '\n'); i >= 0 && i+1 < len(b); {
		switch {
		case b[i+1] == '\n':
			return i + 2
		case b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n':
			return i + 3
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			return 0
		}
		i += 1 + j
	}
	return 0
}

// plainHead reads a response head (ending with its empty line): the
// Content-Length and whether the connection may be kept, for a plain
// response (see readPlain); ok false for any other.
func plainHead(head []byte) (n int, keep, ok bool) {
	line, rest, found := bytes.Cut(head, crlf)
	if !found || !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) || !plainLine(line) {
		return 0, false, false
	}
	n, keep = -1, true
	var jsonType, typed bool
	for string(rest) != "\r\n" {
		line, rest, found = bytes.Cut(rest, crlf)
		colon := bytes.IndexByte(line, ':')
		if !found || colon <= 0 || !plainLine(line) || !token(line[:colon]) {
			return 0, false, false
		}
		key, v := line[:colon], bytes.Trim(line[colon+1:], " \t")
		switch {
		case bytes.EqualFold(key, []byte("Content-Length")):
			if n >= 0 || len(v) == 0 || len(v) > 7 {
				return 0, false, false
			}
			n = 0
			for _, c := range v {
				if c < '0' || c > '9' {
					return 0, false, false
				}
				n = n*10 + int(c-'0')
			}
		case bytes.EqualFold(key, []byte("Content-Type")):
			if typed {
				return 0, false, false
			}
			typed, jsonType = true, bytes.EqualFold(v, []byte("application/json"))
		case bytes.EqualFold(key, []byte("Transfer-Encoding")):
			return 0, false, false
		case bytes.EqualFold(key, []byte("Connection")):
			for _, t := range bytes.Split(v, []byte(",")) {
				if bytes.EqualFold(bytes.Trim(t, " \t"), []byte("close")) {
					keep = false
				}
			}
		}
	}
	if n < 0 || n > maxPlainBody || !jsonType {
		return 0, false, false
	}
	return n, keep, true
}

var crlf = []byte("\r\n")

// mcpNameKey starts the Mcp-Name line.
const mcpNameKey = mcp.HeaderName + ": "

// plainLine reports whether a head line holds only bytes
// http.ReadResponse accepts in a header value (no CR, LF or other
// control byte but tab).
func plainLine(line []byte) bool {
	for _, c := range line {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// token reports whether b is a valid header name.
func token(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 || !tokenByte[c] {
			return false
		}
	}
	return true
}

// tokenByte holds the bytes of an HTTP token (RFC 9110 tchar).
var tokenByte = func() (t [128]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()
