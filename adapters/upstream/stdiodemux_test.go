package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// TestStdioDemux: a raw call's answer goes to its caller, read as
// mcp-go's transport reads a response (names without regard to case,
// the last of a repeated name, the error member first); every other line
// reaches mcp-go's transport as it came, in order, long lines whole; the
// end of the child's stdout fails the calls waiting and later ones.
func TestStdioDemux(t *testing.T) {
	childOut, stdout := io.Pipe()
	var stdinMu sync.Mutex
	var stdin strings.Builder
	d, toMCP := newStdioDemux(childOut, nopCloser{writerFunc(func(p []byte) (int, error) {
		stdinMu.Lock()
		defer stdinMu.Unlock()
		return stdin.Write(p)
	})})
	go d.run()
	forwarded := make(chan string, 16)
	go func() {
		r := bufio.NewReaderSize(toMCP, 16)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(forwarded)
				return
			}
			forwarded <- line
		}
	}()
	long := `{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"` + strings.Repeat("x", 200<<10) + `"}}` + "\n"
	cases := []struct {
		id, answer     string
		result, errSub string
	}{
		{"capvend-raw-1", `{"jsonrpc":"2.0","id":"capvend-raw-1","result":{"content":[]}}`, `{"content":[]}`, ""},
		{"capvend-raw-2", `{"result":{"a":1},"jsonrpc":"2.0","id":"capvend-raw-2"}`, `{"a":1}`, ""},
		{"capvend-raw-3", `{"jsonrpc":"2.0","id":"capvend-raw-3","error":{"code":-32602,"message":"bad args"}}`, "", "bad args"},
		{"capvend-raw-4", `{"jsonrpc":"2.0","ID":"capvend-raw-4","Result":{"b":2}}`, `{"b":2}`, ""},
		{"capvend-raw-5", `{"id":"capvend-raw-5","result":1,"result":{"c":3}}`, `{"c":3}`, ""},
		{"capvend-raw-6", `{"id":"capvend-raw-6"}`, "", "without result"},
		{"capvend-raw-7", strings.TrimSuffix(`{"id":"capvend-raw-7","result":{"big":"`+strings.Repeat("y", 100<<10)+`"}}`, "\n"), `{"big":"` + strings.Repeat("y", 100<<10) + `"}`, ""},
	}
	type got struct {
		result string
		err    error
	}
	answers := make([]chan got, len(cases))
	for i, c := range cases {
		answers[i] = make(chan got, 1)
		go func() {
			res, rpcErr, err := d.call(context.Background(), c.id, []byte(`{"id":"`+c.id+`"}`+"\n"))
			answers[i] <- got{string(res), errors.Join(rpcErr, err)}
		}()
	}
	waitFor := func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			d.mu.Lock()
			w := len(d.waiting)
			d.mu.Unlock()
			if w == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d calls waiting, want %d", w, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(len(cases))
	others := []string{
		`{"jsonrpc":"2.0","id":3,"result":{}}` + "\n", // mcp-go's own request
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"capvend-raw-1"}}` + "\n",
		`{"jsonrpc":"2.0","id":"capvend-raw-1","method":"ping"}` + "\n", // the child's request
		`{"id":"capvend\u002draw-9","result":{}}` + "\n",                // not ours as written
		`{"id":"capvend-raw-1",` + "\n",                                 // not JSON
		long,
	}
	for _, line := range others {
		io.WriteString(stdout, line)
	}
	for _, c := range cases {
		io.WriteString(stdout, c.answer+"\n")
	}
	for i, c := range cases {
		g := <-answers[i]
		if c.errSub != "" {
			if g.err == nil || !strings.Contains(g.err.Error(), c.errSub) {
				t.Errorf("%s: error %v, want one saying %q", c.id, g.err, c.errSub)
			}
			continue
		}
		if g.err != nil || g.result != c.result {
			t.Errorf("%s: %.80q %v, want %.80q", c.id, g.result, g.err, c.result)
		}
	}
	for _, want := range others {
		if line := <-forwarded; line != want {
			t.Fatalf("forwarded %.80q, want %.80q", line, want)
		}
	}
	stdinMu.Lock()
	if n := strings.Count(stdin.String(), "\n"); n != len(cases) {
		t.Errorf("%d request lines written, want %d", n, len(cases))
	}
	stdinMu.Unlock()

	// The end of stdout.
	waiting := make(chan error, 1)
	go func() {
		_, _, err := d.call(context.Background(), "capvend-raw-10", []byte("{}\n"))
		waiting <- err
	}()
	waitFor(1)
	stdout.Close()
	if err := <-waiting; err == nil || !strings.Contains(err.Error(), "stdout ended") {
		t.Fatalf("call waiting at the end: %v", err)
	}
	if _, _, err := d.call(context.Background(), "capvend-raw-11", []byte("{}\n")); err == nil {
		t.Fatal("a call after the end did not fail")
	}
	if _, open := <-forwarded; open {
		t.Fatal("mcp-go's reader did not end")
	}
	<-d.done
}

// TestStdioDemuxGivenUp: a call whose context ends stops waiting; its
// late answer is dropped, not passed to mcp-go's transport; close lets
// run go on reading when mcp-go's transport stopped reading.
func TestStdioDemuxGivenUp(t *testing.T) {
	childOut, stdout := io.Pipe()
	d, _ := newStdioDemux(childOut, nopCloser{io.Discard})
	go d.run()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := d.call(ctx, "capvend-raw-1", []byte("{}\n")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("given up: %v", err)
	}
	io.WriteString(stdout, `{"id":"capvend-raw-1","result":{}}`+"\n") // dropped: nobody reads toMCP
	d.close()
	io.WriteString(stdout, `{"id":1,"result":{}}`+"\n") // for mcp-go, which is gone
	stdout.Close()
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not end after mcp-go's transport stopped reading")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
