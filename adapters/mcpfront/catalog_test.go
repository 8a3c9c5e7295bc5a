package mcpfront

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// fakeCatalog serves fixed prompts and resources; tests change them and
// call Refresh.
type fakeCatalog struct {
	mu        sync.Mutex
	prompts   []Prompt
	resources []Resource
	templates []ResourceTemplate
}

// Bodies the fake returns, to check they reach the client unchanged.
const (
	greetBody = `{"_meta":{"k":"v"},"description":"a greeting","messages":[` +
		`{"role":"user","content":{"type":"text","text":"hello WHO","annotations":{"audience":["user"],"priority":0.5}}},` +
		`{"role":"assistant","content":{"type":"resource","resource":{"uri":"test://readme","mimeType":"text/plain","text":"embedded"}}},` +
		`{"role":"user","content":{"type":"image","data":"aGk=","mimeType":"image/png"}}]}`
	readmeBody = `{"contents":[{"uri":"test://readme","mimeType":"text/plain","text":"hello","_meta":{"m":1}}]}`
	blobBody   = `{"contents":[{"uri":"test://blob","mimeType":"application/octet-stream","blob":"AAEC"}]}`
)

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{
		prompts: []Prompt{
			{Name: "greet", Definition: json.RawMessage(`{"name":"ignored","title":"Greet","description":"greets","arguments":[{"name":"who","required":true}]}`)},
			{Name: "down"},
		},
		resources: []Resource{
			{URI: "test://readme", Definition: json.RawMessage(`{"uri":"test://readme","name":"readme","mimeType":"text/plain","annotations":{"priority":1}}`)},
			{URI: "test://blob", Definition: json.RawMessage(`{"uri":"test://blob","name":"blob","size":3}`)},
			{URI: "test://down", Definition: json.RawMessage(`{"uri":"test://down","name":"down"}`)},
		},
		templates: []ResourceTemplate{
			{URITemplate: "test://item/{id}", Definition: json.RawMessage(`{"uriTemplate":"test://item/{id}","name":"item","description":"an item"}`)},
		},
	}
}

func (f *fakeCatalog) Prompts() []Prompt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.prompts
}

func (f *fakeCatalog) Resources() []Resource {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resources
}

func (f *fakeCatalog) ResourceTemplates() []ResourceTemplate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.templates
}

func (f *fakeCatalog) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	switch name {
	case "greet":
		return json.RawMessage(strings.Replace(greetBody, "WHO", args["who"], 1)), nil
	case "down":
		return nil, leaky(vend.ErrUpstream)
	default:
		return json.RawMessage(`{"messages":[{"role":"user","content":{"type":"text","text":"` + name + `"}}]}`), nil
	}
}

func (f *fakeCatalog) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	switch {
	case uri == "test://readme":
		return json.RawMessage(readmeBody), nil
	case uri == "test://blob":
		return json.RawMessage(blobBody), nil
	case uri == "test://down":
		return nil, leaky(vend.ErrUpstream)
	case strings.HasPrefix(uri, "test://item/"):
		return json.RawMessage(`{"contents":[{"uri":"` + uri + `","text":"item ` + strings.TrimPrefix(uri, "test://item/") + `"}]}`), nil
	}
	return nil, leaky(errors.New("no such resource"))
}

func newCatalogServer(t *testing.T) (*Server, *fakeCatalog) {
	t.Helper()
	fc := newFakeCatalog()
	s, _ := newServer(t, Config{Catalog: fc})
	return s, fc
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

// catalogSuite runs the checks of prompts and resources every transport
// must pass with a real mcp-go client.
func catalogSuite(t *testing.T, c *client.Client) {
	ctx := context.Background()
	t.Run("list prompts", func(t *testing.T) {
		res, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, p := range res.Prompts {
			names = append(names, p.Name)
			if p.Name == "greet" && (p.Title != "Greet" || p.Description != "greets" || len(p.Arguments) != 1 || !p.Arguments[0].Required) {
				t.Errorf("greet listed as %+v", p)
			}
		}
		slices.Sort(names)
		if strings.Join(names, ",") != "down,greet" {
			t.Errorf("prompts %v", names)
		}
	})
	t.Run("get prompt", func(t *testing.T) {
		req := mcp.GetPromptRequest{}
		req.Params.Name = "greet"
		req.Params.Arguments = map[string]string{"who": "bob"}
		res, err := c.GetPrompt(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) != 3 || res.Description != "a greeting" {
			t.Fatalf("result %+v", res)
		}
		if tc, ok := res.Messages[0].Content.(mcp.TextContent); !ok || tc.Text != "hello bob" || tc.Annotations == nil {
			t.Errorf("first message %+v", res.Messages[0])
		}
		req.Params.Name = "down"
		_, err = c.GetPrompt(ctx, req)
		if err == nil || !strings.Contains(err.Error(), "Upstream server failed") || strings.Contains(err.Error(), "deadbeef") {
			t.Errorf("down: %v", err)
		}
		req.Params.Name = "nope"
		if _, err := c.GetPrompt(ctx, req); err == nil {
			t.Error("unknown prompt answered")
		}
	})
	t.Run("list resources", func(t *testing.T) {
		res, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		uris := []string{}
		for _, r := range res.Resources {
			uris = append(uris, r.URI)
			if r.URI == "test://readme" && (r.Name != "readme" || r.MIMEType != "text/plain" || r.Annotations == nil) {
				t.Errorf("readme listed as %+v", r)
			}
		}
		slices.Sort(uris)
		if strings.Join(uris, ",") != "test://blob,test://down,test://readme" {
			t.Errorf("resources %v", uris)
		}
		tres, err := c.ListResourceTemplates(ctx, mcp.ListResourceTemplatesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(tres.ResourceTemplates) != 1 || tres.ResourceTemplates[0].URITemplate.Raw() != "test://item/{id}" ||
			tres.ResourceTemplates[0].Description != "an item" {
			t.Errorf("templates %+v", tres.ResourceTemplates)
		}
	})
	t.Run("read resource", func(t *testing.T) {
		for _, tc := range []struct{ uri, want string }{
			{"test://readme", "hello"}, {"test://item/42", "item 42"},
		} {
			req := mcp.ReadResourceRequest{}
			req.Params.URI = tc.uri
			res, err := c.ReadResource(ctx, req)
			if err != nil {
				t.Fatalf("%s: %v", tc.uri, err)
			}
			if len(res.Contents) != 1 {
				t.Fatalf("%s: %+v", tc.uri, res)
			}
			if tx, ok := res.Contents[0].(mcp.TextResourceContents); !ok || tx.Text != tc.want || tx.URI != tc.uri {
				t.Errorf("%s: %+v", tc.uri, res.Contents[0])
			}
		}
		req := mcp.ReadResourceRequest{}
		req.Params.URI = "test://blob"
		res, err := c.ReadResource(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if b, ok := res.Contents[0].(mcp.BlobResourceContents); !ok || b.Blob != "AAEC" {
			t.Errorf("blob %+v", res.Contents)
		}
		req.Params.URI = "test://down"
		_, err = c.ReadResource(ctx, req)
		if err == nil || !strings.Contains(err.Error(), "Upstream server failed") || strings.Contains(err.Error(), "deadbeef") {
			t.Errorf("down: %v", err)
		}
		req.Params.URI = "other://x"
		if _, err := c.ReadResource(ctx, req); err == nil {
			t.Error("unlisted resource read")
		}
	})
}

func TestCatalogHTTPWithMCPGoClient(t *testing.T) {
	s, fc := newCatalogServer(t)
	url := startHTTP(t, s)
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := newNotes()
	c.OnNotification(n.add)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init, err := c.Initialize(ctx, mcp.InitializeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !mcp.IsModernProtocol(c.ProtocolVersion()) {
		t.Fatalf("protocol %s", c.ProtocolVersion())
	}
	if p, r := init.Capabilities.Prompts, init.Capabilities.Resources; p == nil || !p.ListChanged || r == nil || !r.ListChanged {
		t.Fatalf("capabilities %+v", init.Capabilities)
	}
	catalogSuite(t, c)

	t.Run("list_changed on Refresh", func(t *testing.T) {
		stop, err := c.ListenAsync(ctx, mcp.SubscriptionFilter{ToolsListChanged: true, PromptsListChanged: true, ResourcesListChanged: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		waitListChanged(t, s, n) // the stream is open

		fc.mu.Lock()
		fc.prompts = append(slices.Clone(fc.prompts), Prompt{Name: "late"})
		fc.mu.Unlock()
		s.Refresh()
		waitNote(t, n, mcp.MethodNotificationPromptsListChanged)
		res, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
		if err != nil || len(res.Prompts) != 3 {
			t.Fatalf("prompts %+v %v", res, err)
		}
		req := mcp.GetPromptRequest{}
		req.Params.Name = "late"
		if gp, err := c.GetPrompt(ctx, req); err != nil || gp.Messages[0].Content.(mcp.TextContent).Text != "late" {
			t.Fatalf("late: %+v %v", gp, err)
		}

		fc.mu.Lock()
		fc.resources = fc.resources[:1] // blob and down are gone
		fc.templates = nil
		fc.mu.Unlock()
		s.Refresh()
		waitNote(t, n, mcp.MethodNotificationResourcesListChanged)
		rres, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
		if err != nil || len(rres.Resources) != 1 || rres.Resources[0].URI != "test://readme" {
			t.Fatalf("resources %+v %v", rres, err)
		}
		tres, err := c.ListResourceTemplates(ctx, mcp.ListResourceTemplatesRequest{})
		if err != nil || len(tres.ResourceTemplates) != 0 {
			t.Fatalf("templates %+v %v", tres, err)
		}
		rreq := mcp.ReadResourceRequest{}
		rreq.Params.URI = "test://item/1"
		if _, err := c.ReadResource(ctx, rreq); err == nil {
			t.Error("read through a removed template")
		}
	})
}

// waitNote waits for a notification with method m.
func waitNote(t *testing.T, n *notes, m string) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case got := <-n.ch:
			if got == m {
				return
			}
		case <-deadline:
			t.Fatalf("no %s", m)
		}
	}
}

func TestCatalogStdioWithMCPGoClient(t *testing.T) {
	s, _ := newCatalogServer(t)
	c, stop := startStdio(t, s)
	defer stop()
	if _, err := c.Initialize(context.Background(), mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	catalogSuite(t, c)
}

// TestCatalogResultsVerbatim: mcp-go's handlers take typed results; what
// the Catalog returned reaches a (2025-11-25) client as the same JSON.
func TestCatalogResultsVerbatim(t *testing.T) {
	s, _ := newCatalogServer(t)
	r := newRawSession(t, startHTTP(t, s))
	for _, tc := range []struct{ name, req, want string }{
		{"prompt", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"greet","arguments":{"who":"bob"}}}`,
			strings.Replace(greetBody, "WHO", "bob", 1)},
		{"text resource", `{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"test://readme"}}`, readmeBody},
		{"blob resource", `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"test://blob"}}`, blobBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, _ := r.post(tc.req)
			if len(msgs) != 1 {
				t.Fatalf("%s", msgs)
			}
			var m struct{ Result json.RawMessage }
			if err := json.Unmarshal(msgs[0], &m); err != nil || m.Result == nil {
				t.Fatalf("%s", msgs[0])
			}
			if !sameJSON(t, m.Result, []byte(tc.want)) {
				t.Errorf("result\n got: %s\nwant: %s", m.Result, tc.want)
			}
		})
	}
	t.Run("upstream error", func(t *testing.T) {
		msgs, _ := r.post(`{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"test://down"}}`)
		if len(msgs) != 1 || !sameJSON(t, msgs[0], []byte(`{"jsonrpc":"2.0","id":4,"error":{"code":-32054,"message":"Upstream server failed"}}`)) {
			t.Errorf("%s", msgs)
		}
	})
	t.Run("list definitions", func(t *testing.T) {
		msgs, _ := r.post(`{"jsonrpc":"2.0","id":5,"method":"resources/list"}`)
		if len(msgs) != 1 || !strings.Contains(string(msgs[0]), `{"annotations":{"priority":1},"uri":"test://readme","name":"readme","mimeType":"text/plain"}`) {
			t.Errorf("%s", msgs)
		}
		msgs, _ = r.post(`{"jsonrpc":"2.0","id":6,"method":"prompts/list"}`)
		if len(msgs) != 1 || !strings.Contains(string(msgs[0]), `{"name":"greet","title":"Greet","description":"greets","arguments":[{"name":"who","required":true}]}`) {
			t.Errorf("%s", msgs)
		}
	})
}

// TestNoCatalogNoCapabilities: without a Catalog, prompts and resources
// are neither advertised nor served.
func TestNoCatalogNoCapabilities(t *testing.T) {
	s, _ := newServer(t, Config{})
	c, stop := startStdio(t, s)
	defer stop()
	init, err := c.Initialize(context.Background(), mcp.InitializeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if init.Capabilities.Prompts != nil || init.Capabilities.Resources != nil {
		t.Fatalf("capabilities %+v", init.Capabilities)
	}
	if _, err := c.ListPrompts(context.Background(), mcp.ListPromptsRequest{}); err == nil {
		t.Error("prompts/list answered")
	}
}
