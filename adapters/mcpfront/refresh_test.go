package mcpfront

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// changingVendor's tools change from old to new while its first Tools
// call is under way: that call returns the old list, once a later one
// returned the new list (or a bound passed).
type changingVendor struct {
	fakeVendor
	mu       sync.Mutex
	calls    int
	newDone  chan struct{} // closed once a call returned the new list
	oldTools []vend.Item
	newTools []vend.Item
}

func (v *changingVendor) Tools() []vend.Item {
	v.mu.Lock()
	v.calls++
	first := v.calls == 1
	v.mu.Unlock()
	if first {
		select {
		case <-v.newDone:
		case <-time.After(300 * time.Millisecond): // a Refresh that waits for this one
		}
		return v.oldTools
	}
	defer close(v.newDone)
	return v.newTools
}

// Two upstreams change at once and each calls Refresh: the tools
// registered last are the newest, not those of the Refresh that read
// first (a lost update left a tool "not found" until the next change).
func TestConcurrentRefreshesKeepTheNewestTools(t *testing.T) {
	v := &changingVendor{newDone: make(chan struct{}),
		oldTools: []vend.Item{{Name: "web_echo"}},
		newTools: []vend.Item{{Name: "web_echo"}, {Name: "t_sha256", Price: 21000}}}
	s, err := New(Config{Vendor: v})
	if err != nil {
		t.Fatal(err)
	}
	// New refreshed once (the first, slow Tools call): start again.
	v.mu.Lock()
	v.calls = 0
	v.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.Refresh() }()
	for { // the first Refresh is reading
		v.mu.Lock()
		n := v.calls
		v.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s.Refresh()
	wg.Wait()
	res := s.mcp.HandleMessage(context.Background(), []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	r, ok := res.(mcp.JSONRPCResponse)
	if !ok {
		t.Fatalf("tools/list: %#v", res)
	}
	list, _ := r.Result.(mcp.ListToolsResult)
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	if len(names) != 2 {
		t.Fatalf("tools registered after two concurrent refreshes: %v, want web_echo and t_sha256", names)
	}
}
