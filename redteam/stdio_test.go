package redteam

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/capvend/capvend/internal/syncbuf"
)

// stdioClient runs `capvend serve --stdio` as a desktop MCP client
// launches it, and speaks MCP over its pipes.
type stdioClient struct {
	t    *testing.T
	in   io.WriteCloser
	msgs chan rpcMessage
}

// startStdioShop runs the shop's capvend with --stdio (no HTTP, no Nostr)
// until the test ends, then checks the invariant like startShop.
func startStdioShop(t *testing.T, o shopOpts) (*shop, *stdioClient) {
	t.Helper()
	sh := newShop(t, o)
	t.Cleanup(sh.finish)
	cmd := exec.Command(serveBin, "serve", "--stdio", "--config", sh.config)
	cmd.Env = append(os.Environ(), o.env...)
	logs := &syncbuf.Buffer{}
	cmd.Stderr = logs
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &stdioClient{t: t, in: in, msgs: make(chan rpcMessage, 256)}
	exited := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(c.msgs)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var m rpcMessage
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				c.msgs <- m
			}
		}
	}()
	sh.mu.Lock()
	sh.cmd, sh.logs, sh.exited = cmd, logs, exited
	sh.mu.Unlock()
	go func() {
		<-read // Wait closes the pipes: read them to the end first
		err := cmd.Wait()
		sh.mu.Lock()
		sh.exitErr = err
		sh.mu.Unlock()
		close(exited)
	}()
	t.Cleanup(func() { in.Close() }) // runs before sh.finish: capvend sees its input end
	init := c.rpc(0, "initialize", map[string]any{"protocolVersion": protocolVersion, "capabilities": payingCapabilities(),
		"clientInfo": map[string]any{"name": "redteam", "version": "1"}})
	if init.Error != nil {
		t.Fatalf("initialize: %s", init)
	}
	c.send(request(nil, "notifications/initialized", nil))
	waitUntil(t, "example-tools listed over stdio", func() bool {
		m := c.rpc("list", "tools/list", nil)
		return m.Error == nil && json.Valid(m.Result) && containsName(m.Result, "sha256")
	})
	return sh, c
}

func containsName(raw json.RawMessage, name string) bool {
	var r struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	json.Unmarshal(raw, &r)
	for _, t := range r.Tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

// send writes one message line.
func (c *stdioClient) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatal(err)
	}
}

// next returns the next message capvend wrote, or false after wait.
func (c *stdioClient) next(wait time.Duration) (rpcMessage, bool) {
	select {
	case m, ok := <-c.msgs:
		return m, ok
	case <-time.After(wait):
		return rpcMessage{}, false
	}
}

// untilResponse reads up to the response to id (as JSON), passing
// notifications (and other responses) to note.
func (c *stdioClient) untilResponse(id any, note func(rpcMessage)) rpcMessage {
	c.t.Helper()
	want, _ := json.Marshal(id)
	for {
		m, ok := c.next(3 * time.Minute) // a hang guard
		if !ok {
			c.t.Fatalf("no response to id %s", want)
		}
		if m.Method == "" && string(m.ID) == string(want) {
			return m
		}
		if note != nil {
			note(m)
		}
	}
}

// rpc sends a request and returns its response (notifications ignored).
func (c *stdioClient) rpc(id any, method string, params any) rpcMessage {
	c.t.Helper()
	c.send(request(id, method, params))
	return c.untilResponse(id, nil)
}
