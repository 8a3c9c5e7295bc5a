package cli

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// limitListener accepts at most cap(slots) connections at a time (the
// http.max_connections cap). A connection beyond is answered "503 Service
// Unavailable" and closed at once: Accept never blocks on the cap, so the
// connections waiting in the kernel's backlog are not left hanging. At
// most cap(refusing) refusals are written at a time; beyond, a connection
// is just closed.
type limitListener struct {
	net.Listener
	slots    chan struct{}
	refusing chan struct{}
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, slots: make(chan struct{}, n), refusing: make(chan struct{}, 32)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
		}
		select {
		case l.refusing <- struct{}{}:
			go func() {
				defer func() { <-l.refusing }()
				refuseConn(c)
			}()
		default:
			c.Close()
		}
	}
}

// refused is the answer to a connection beyond the cap.
var refused = func() string {
	body := `{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Service Unavailable: too many connections"}}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body
}()

// refuseConn writes the 503 and closes c, first reading (for a moment)
// what the client sent, so that the close does not reset the connection
// before the client read the answer.
func refuseConn(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, refused); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// limitConn gives its slot back when closed (once).
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// readTokenFile reads the bearer token of a token file (field names it:
// http.auth_token_file, admin.token_file): at least
// 16 characters, no spaces (surrounding white space is dropped). Its
// permissions are checkSecrets' business. Errors never carry the file's
// content, nor the path when it does not exist (it may be a token written
// in its place).
func readTokenFile(field, path string) ([]byte, error) {
	if err := checkSecretFile(field, path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s: cannot read it (%v): it must be the path of a file holding the token", field, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 || strings.ContainsAny(tok, " \t\r\n") {
		return nil, fmt.Errorf("%s %s must hold one token of at least 16 characters, no spaces (e.g. openssl rand -hex 32 > %s)", field, path, path)
	}
	return []byte(tok), nil
}
