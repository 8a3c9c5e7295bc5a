package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/vend"
)

// addCatalog gives a test server (named name) prompts, resources and a
// template:
//
//	prompt greet(who)         -> "<name>: hello <who>"
//	prompt broken             -> a handler error
//	resource test://shared    -> "<name>" (every test server lists it)
//	resource <name>://readme  -> "readme of <name>"
//	template <name>://item/{id} -> "<name>:<uri>"
//	tool add_catalog(name)    -> adds prompt <name> and resource <server>://<name>
func addCatalog(s *server.MCPServer, name string) {
	s.AddPrompt(mcp.NewPrompt("greet", mcp.WithPromptDescription("greets someone"),
		mcp.WithArgument("who", mcp.RequiredArgument(), mcp.ArgumentDescription("whom to greet"))),
		func(ctx context.Context, r mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return mcp.NewGetPromptResult("a greeting", []mcp.PromptMessage{
				mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(name+": hello "+r.Params.Arguments["who"])),
			}), nil
		})
	s.AddPrompt(mcp.NewPrompt("broken"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return nil, errors.New("prompt broke")
	})
	text := func(uri, txt string) []mcp.ResourceContents {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "text/plain", Text: txt}}
	}
	s.AddResource(mcp.NewResource("test://shared", "shared", mcp.WithMIMEType("text/plain")),
		func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return text(r.Params.URI, name), nil
		})
	s.AddResource(mcp.NewResource(name+"://readme", "readme", mcp.WithResourceDescription("the readme")),
		func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return text(r.Params.URI, "readme of "+name), nil
		})
	// Listed, and matching the template below: priced by the template
	// unless it has a price of its own.
	s.AddResource(mcp.NewResource(name+"://item/featured", "featured item"),
		func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return text(r.Params.URI, "featured of "+name), nil
		})
	s.AddResourceTemplate(mcp.NewResourceTemplate(name+"://item/{id}", "item"),
		func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return text(r.Params.URI, name+":"+r.Params.URI), nil
		})
	s.AddTool(mcp.NewTool("add_catalog", mcp.WithString("name", mcp.Required())),
		func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := r.GetString("name", "x")
			s.AddPrompt(mcp.NewPrompt(n), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				return mcp.NewGetPromptResult("", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(n))}), nil
			})
			s.AddResource(mcp.NewResource(name+"://"+n, n), func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return text(r.Params.URI, n), nil
			})
			return mcp.NewToolResultText("added"), nil
		})
}

// waitCatalog waits until m lists every prompt name and resource URI in
// want.
func waitCatalog(t *testing.T, m *Manager, e *events, want ...string) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		have := map[string]bool{}
		for _, p := range m.Prompts() {
			have[p.Name] = true
		}
		for _, r := range m.Resources() {
			have[r.URI] = true
		}
		for _, tl := range m.ResourceTemplates() {
			have[tl.URITemplate] = true
		}
		missing := false
		for _, w := range want {
			if !have[w] {
				missing = true
			}
		}
		if !missing {
			return
		}
		select {
		case <-e.changed:
		case <-deadline:
			t.Fatalf("%v not all listed; have %v", want, have)
		}
	}
}

// promptText is the text of a GetPromptResult's only message.
func promptText(t *testing.T, body json.RawMessage) string {
	t.Helper()
	var r struct {
		Messages []struct {
			Role    string
			Content struct{ Type, Text string }
		}
	}
	if err := json.Unmarshal(body, &r); err != nil || len(r.Messages) != 1 {
		t.Fatalf("bad prompt result %s: %v", body, err)
	}
	return r.Messages[0].Role + " " + r.Messages[0].Content.Text
}

// resourceText is the text of a ReadResourceResult's only contents.
func resourceText(t *testing.T, body json.RawMessage) string {
	t.Helper()
	var r struct {
		Contents []struct{ URI, MIMEType, Text string }
	}
	if err := json.Unmarshal(body, &r); err != nil || len(r.Contents) != 1 {
		t.Fatalf("bad read result %s: %v", body, err)
	}
	return r.Contents[0].Text
}

func TestCatalog(t *testing.T) {
	hs := newTestServer("http-upstream")
	h := startHTTP(t, hs)
	e := newEvents()
	m, err := New(e.config(
		ServerConfig{Name: "web", Prefix: "w_", URL: h.url()},
		stdioConfig(t, "local", "l_"),
	))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitCatalog(t, m, e, "w_greet", "l_greet", "test://shared", "http-upstream://readme", "stdio-upstream://readme",
		"http-upstream://item/{id}", "stdio-upstream://item/{id}")
	ctx := context.Background()

	t.Run("listing", func(t *testing.T) {
		for _, p := range m.Prompts() {
			var def mcp.Prompt
			if err := json.Unmarshal(p.Definition, &def); err != nil || def.Name != p.Name {
				t.Errorf("%s: definition %s (%v)", p.Name, p.Definition, err)
			}
			if p.UpstreamName == "greet" && (def.Description != "greets someone" || len(def.Arguments) != 1 ||
				def.Arguments[0].Name != "who" || !def.Arguments[0].Required) {
				t.Errorf("%s: definition %s", p.Name, p.Definition)
			}
			if want := map[string]string{"web": "w_", "local": "l_"}[p.Server] + p.UpstreamName; p.Name != want {
				t.Errorf("prompt %s of %s: want %s", p.Name, p.Server, want)
			}
		}
		shared := 0
		for _, r := range m.Resources() {
			if r.URI == "test://shared" {
				shared++
				if r.Server != "web" {
					t.Errorf("test://shared from %s, want the first configured (web)", r.Server)
				}
			}
			var def mcp.Resource
			if err := json.Unmarshal(r.Definition, &def); err != nil || def.URI != r.URI {
				t.Errorf("%s: definition %s (%v)", r.URI, r.Definition, err)
			}
		}
		if shared != 1 {
			t.Errorf("test://shared listed %d times", shared)
		}
		if n := len(m.ResourceTemplates()); n != 2 {
			t.Errorf("%d templates", n)
		}
	})

	t.Run("items", func(t *testing.T) {
		p, ok := m.PromptItem("l_greet")
		if !ok || p.Kind != vend.ItemPrompt || p.Server != "local" || p.UpstreamName != "greet" ||
			string(p.InputSchema) != `{"properties":{"who":{"type":"string"}},"required":["who"],"type":"object"}` {
			t.Errorf("PromptItem(l_greet) = %+v %v (schema %s)", p, ok, p.InputSchema)
		}
		if _, ok := m.PromptItem("greet"); ok {
			t.Error("PromptItem(greet): an unprefixed name found")
		}
		for _, tc := range []struct {
			uri, server, key string
			templates        []string
		}{
			{"test://shared", "web", "test://shared", nil},
			{"stdio-upstream://readme", "local", "stdio-upstream://readme", nil},
			{"stdio-upstream://item/42", "local", "stdio-upstream://item/{id}", nil},
			{"http-upstream://item/{id}", "web", "http-upstream://item/{id}", nil},
			// A listed URI matching a template: the template is a price key too.
			{"stdio-upstream://item/featured", "local", "stdio-upstream://item/featured", []string{"stdio-upstream://item/{id}"}},
		} {
			if r, ok := m.ResourceItem(tc.uri); !ok || r.Kind != vend.ItemResource || r.Name != tc.uri || r.Server != tc.server ||
				r.UpstreamName != tc.key || !slices.Equal(r.Templates, tc.templates) {
				t.Errorf("ResourceItem(%s) = %+v %v, want %q %q %q", tc.uri, r, ok, tc.server, tc.key, tc.templates)
			}
		}
		if _, ok := m.ResourceItem("nowhere://x"); ok {
			t.Error("ResourceItem(nowhere://x) found")
		}
	})

	t.Run("get prompt", func(t *testing.T) {
		for _, tc := range []struct{ name, want string }{
			{"w_greet", "user http-upstream: hello bob"}, {"l_greet", "user stdio-upstream: hello bob"},
		} {
			body, err := m.GetPrompt(ctx, tc.name, map[string]string{"who": "bob"})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got := promptText(t, body); got != tc.want {
				t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
			}
			if strings.Contains(string(body), "serverInfo") || strings.Contains(string(body), "resultType") {
				t.Errorf("%s: upstream decorations kept: %s", tc.name, body)
			}
		}
		if _, err := m.GetPrompt(ctx, "l_broken", nil); !errors.Is(err, vend.ErrUpstream) {
			t.Errorf("broken prompt: %v", err)
		}
		if _, err := m.GetPrompt(ctx, "greet", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("unprefixed name: %v", err)
		}
	})

	t.Run("read resource", func(t *testing.T) {
		for _, tc := range []struct{ uri, want string }{
			{"test://shared", "http-upstream"},
			{"http-upstream://readme", "readme of http-upstream"},
			{"stdio-upstream://readme", "readme of stdio-upstream"},
			{"stdio-upstream://item/42", "stdio-upstream:stdio-upstream://item/42"},
			{"http-upstream://item/7", "http-upstream:http-upstream://item/7"},
		} {
			body, err := m.ReadResource(ctx, tc.uri)
			if err != nil {
				t.Fatalf("%s: %v", tc.uri, err)
			}
			if got := resourceText(t, body); got != tc.want {
				t.Errorf("%s: %q, want %q", tc.uri, got, tc.want)
			}
		}
		if _, err := m.ReadResource(ctx, "nowhere://x"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown uri: %v", err)
		}
	})

	t.Run("list_changed", func(t *testing.T) {
		// stdio: the child adds a prompt and a resource and notifies.
		if _, err := m.CallTool(ctx, tool(t, m, "l_add_catalog"), json.RawMessage(`{"name":"extra"}`), nil, nil); err != nil {
			t.Fatal(err)
		}
		waitCatalog(t, m, e, "l_extra", "stdio-upstream://extra")
		// http: the server adds them and notifies on the listen stream.
		hs.AddPrompt(mcp.NewPrompt("late"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return mcp.NewGetPromptResult("", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleAssistant, mcp.NewTextContent("late"))}), nil
		})
		hs.AddResource(mcp.NewResource("http-upstream://late", "late"), func(ctx context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: r.Params.URI, Text: "late"}}, nil
		})
		waitCatalog(t, m, e, "w_late", "http-upstream://late")
		body, err := m.GetPrompt(ctx, "w_late", nil)
		if err != nil || promptText(t, body) != "assistant late" {
			t.Fatalf("w_late: %s %v", body, err)
		}
		body, err = m.ReadResource(ctx, "stdio-upstream://extra")
		if err != nil || resourceText(t, body) != "extra" {
			t.Fatalf("extra: %s %v", body, err)
		}
	})

	t.Run("down upstream", func(t *testing.T) {
		h.stop()
		e.waitState(t, "web down")
		waitCatalog(t, m, e, "w_greet", "test://shared", "http-upstream://item/{id}") // kept while down
		for name, f := range map[string]func() error{
			"prompt":   func() error { _, err := m.GetPrompt(ctx, "w_greet", nil); return err },
			"resource": func() error { _, err := m.ReadResource(ctx, "test://shared"); return err },
			"template": func() error { _, err := m.ReadResource(ctx, "http-upstream://item/1"); return err },
		} {
			err := f()
			if !errors.Is(err, vend.ErrUpstream) || !strings.Contains(err.Error(), `upstream "web" is down`) {
				t.Errorf("%s: %v", name, err)
			}
		}
		// The other upstream still answers.
		body, err := m.GetPrompt(ctx, "l_greet", map[string]string{"who": "x"})
		if err != nil || promptText(t, body) != "user stdio-upstream: hello x" {
			t.Fatalf("%s %v", body, err)
		}
	})
}

// TestPromptsOnlyUpstream: an upstream without tools is still used for its
// prompts and resources.
func TestPromptsOnlyUpstream(t *testing.T) {
	s := server.NewMCPServer("prompts-only", "1", server.WithPromptCapabilities(true))
	s.AddPrompt(mcp.NewPrompt("hi"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("hi"))}), nil
	})
	h := startHTTP(t, s)
	e := newEvents()
	m, err := New(e.config(ServerConfig{Name: "p", Prefix: "p_", URL: h.url()}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	waitCatalog(t, m, e, "p_hi")
	if n := len(m.Tools()); n != 0 {
		t.Errorf("%d tools", n)
	}
	body, err := m.GetPrompt(context.Background(), "p_hi", nil)
	if err != nil || promptText(t, body) != "user hi" {
		t.Fatalf("%s %v", body, err)
	}
	if n := len(m.Resources()); n != 0 {
		t.Errorf("%d resources", n)
	}
	_ = fmt.Sprint
}

// Listings gives each upstream's own names, as prices are keyed: tool and
// prompt names without the prefix, URIs and templates, including those
// another upstream hides (test://shared); none before the lists arrive.
func TestListings(t *testing.T) {
	hs := newTestServer("http-upstream")
	h := startHTTP(t, hs)
	e := newEvents()
	m, err := New(e.config(
		ServerConfig{Name: "web", Prefix: "w_", URL: h.url()},
		stdioConfig(t, "local", "l_"),
	))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(m.Listings()); n != 0 {
		t.Fatalf("%d listings before Run", n)
	}
	run(t, m)
	waitCatalog(t, m, e, "w_greet", "l_greet", "http-upstream://item/{id}", "stdio-upstream://item/{id}")
	ls := m.Listings()
	for server, name := range map[string]string{"web": "http-upstream", "local": "stdio-upstream"} {
		l, ok := ls[server]
		if !ok || !l.ToolsKnown || !l.PromptsKnown || !l.ResourcesKnown {
			t.Fatalf("%s: %+v", server, l)
		}
		if !slices.Contains(l.Prompts, "greet") || !slices.Contains(l.Resources, "test://shared") ||
			!slices.Contains(l.Resources, name+"://readme") || !slices.Equal(l.Templates, []string{name + "://item/{id}"}) {
			t.Errorf("%s: %+v", server, l)
		}
		for _, tool := range l.Tools {
			if strings.HasPrefix(tool, "w_") || strings.HasPrefix(tool, "l_") {
				t.Errorf("%s lists tool %q with its prefix", server, tool)
			}
		}
		if len(l.Tools) == 0 {
			t.Errorf("%s: no tools", server)
		}
	}
}
