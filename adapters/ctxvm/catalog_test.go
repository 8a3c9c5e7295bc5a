package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// fakeCatalog lists prompts greet, down, broken and a duplicate greet;
// resources test://readme, test://down, test://bad, test://noname and
// one with a bad definition; the template test://item/{id}. "down" fails
// upstream, "broken" fails otherwise, test://bad returns no JSON object,
// test://item/%37 is refused as invalid params.
type fakeCatalog struct{}

func (fakeCatalog) Prompts() []vend.Prompt {
	return []vend.Prompt{
		{Name: "greet", Definition: json.RawMessage(`{"name":"upstream_greet","description":"greets","arguments":[{"name":"who","required":true}]}`)},
		{Name: "down"},
		{Name: "broken", Definition: json.RawMessage(`{}`)},
		{Name: "greet", Definition: json.RawMessage(`{"description":"a duplicate"}`)},
		{Name: "bad", Definition: json.RawMessage(`[1]`)},
	}
}

func (fakeCatalog) Resources() []vend.Resource {
	return []vend.Resource{
		{URI: "test://readme", Definition: json.RawMessage(`{"uri":"up://readme","name":"readme","mimeType":"text/plain"}`)},
		{URI: "test://down", Definition: json.RawMessage(`{"name":"down"}`)},
		{URI: "test://bad", Definition: json.RawMessage(`{"name":"bad"}`)},
		{URI: "test://noname"},
		{URI: "test://unlisted", Definition: json.RawMessage(`"not an object"`)},
	}
}

func (fakeCatalog) ResourceTemplates() []vend.ResourceTemplate {
	return []vend.ResourceTemplate{{URITemplate: "test://item/{id}", Definition: json.RawMessage(`{"name":"item","description":"an item"}`)}}
}

func (fakeCatalog) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	switch name {
	case "greet":
		b, _ := json.Marshal(map[string]any{"description": "a greeting", "messages": []any{
			map[string]any{"role": "user", "content": map[string]any{"type": "text", "text": "hello " + args["who"]}}}})
		return b, nil
	case "down":
		return nil, fmt.Errorf("%w: connection to deadbeef refused", vend.ErrUpstream)
	case "broken":
		return nil, errors.New("deadbeef: disk on fire")
	}
	return nil, errors.New("not listed: " + name)
}

func (fakeCatalog) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	switch {
	case uri == "test://readme":
		return json.RawMessage(`{"contents":[{"uri":"test://readme","mimeType":"text/plain","text":"hello"}],"_meta":{"k":"v"}}`), nil
	case uri == "test://down":
		return nil, fmt.Errorf("%w: deadbeef", vend.ErrUpstream)
	case uri == "test://bad":
		return json.RawMessage(`"deadbeef"`), nil
	case uri == "test://item/%37": // as vend.Vendor.Offered refuses it
		return nil, &vend.InvalidParamsError{Tool: uri, Reason: "the URI is not in normal form (RFC 3986): read test://item/7"}
	case strings.HasPrefix(uri, "test://item/"):
		return json.RawMessage(`{"contents":[{"uri":"` + uri + `","text":"item ` + strings.TrimPrefix(uri, "test://item/") + `"}]}`), nil
	}
	return nil, errors.New("not listed: " + uri)
}

// ask sends one request and returns its answer.
func (c *client) ask(t *testing.T, content string) reply {
	t.Helper()
	r, _ := c.expect(c.send(content))
	return r
}

func TestCatalog(t *testing.T) {
	relay := testkit.Relay(t)
	s := startServer(t, relay, &fakeVendor{}, func(cfg *Config) { cfg.Catalog = fakeCatalog{} })
	c := newClient(t, relay, s.PublicKey())

	r := c.ask(t, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`)
	var init struct {
		Capabilities map[string]json.RawMessage `json:"capabilities"`
	}
	json.Unmarshal(r.Result, &init)
	for _, k := range []string{"tools", "prompts", "resources"} {
		if init.Capabilities[k] == nil {
			t.Errorf("capabilities lack %s: %s", k, r.Result)
		}
	}

	t.Run("lists", func(t *testing.T) {
		for _, tc := range []struct{ method, want string }{
			{"prompts/list", `{"prompts":[{"arguments":[{"name":"who","required":true}],"description":"greets","name":"greet"},{"name":"down"},{"name":"broken"}]}`},
			{"resources/list", `{"resources":[{"mimeType":"text/plain","name":"readme","uri":"test://readme"},{"name":"down","uri":"test://down"},{"name":"bad","uri":"test://bad"},{"name":"test://noname","uri":"test://noname"}]}`},
			{"resources/templates/list", `{"resourceTemplates":[{"description":"an item","name":"item","uriTemplate":"test://item/{id}"}]}`},
		} {
			r := c.ask(t, `{"jsonrpc":"2.0","id":1,"method":"`+tc.method+`","params":{"cursor":"x"}}`)
			if r.Error != nil || string(r.Result) != tc.want {
				t.Errorf("%s: %s %+v\nwant %s", tc.method, r.Result, r.Error, tc.want)
			}
		}
	})

	t.Run("get and read", func(t *testing.T) {
		for _, tc := range []struct {
			req  string
			want string // the result, or the error as "code message"
		}{
			{`"prompts/get","params":{"name":"greet","arguments":{"who":"bob"}}`, `{"description":"a greeting","messages":[{"content":{"text":"hello bob","type":"text"},"role":"user"}]}`},
			{`"prompts/get","params":{"name":"down"}`, "-32054 Upstream server failed"},
			{`"prompts/get","params":{"name":"broken"}`, "-32603 Internal error"},
			{`"prompts/get","params":{"name":"nope"}`, "-32602 Unknown prompt: nope"},
			{`"prompts/get","params":{"name":"greet","arguments":{"who":1}}`, "-32602 Invalid params"},
			{`"prompts/get","params":{}`, "-32602 Invalid params"},
			{`"prompts/get"`, "-32602 Invalid params"},
			{`"resources/read","params":{"uri":"test://readme"}`, `{"contents":[{"uri":"test://readme","mimeType":"text/plain","text":"hello"}],"_meta":{"k":"v"}}`},
			{`"resources/read","params":{"uri":"test://item/42"}`, `{"contents":[{"uri":"test://item/42","text":"item 42"}]}`},
			{`"resources/read","params":{"uri":"test://down"}`, "-32054 Upstream server failed"},
			{`"resources/read","params":{"uri":"test://item/%37"}`, "-32602 Invalid params: the URI is not in normal form (RFC 3986): read test://item/7"},
			{`"resources/read","params":{"uri":"test://bad"}`, "-32603 Internal error"},
			{`"resources/read","params":{"uri":"other://x"}`, "-32602 Unknown resource: other://x"},
			{`"prompts/get","params":{"name":"bad"}`, "-32602 Unknown prompt: bad"},
			{`"resources/read","params":{"uri":"test://unlisted"}`, "-32602 Unknown resource: test://unlisted"},
			{`"resources/read","params":{}`, "-32602 Invalid params"},
		} {
			r := c.ask(t, `{"jsonrpc":"2.0","id":"x","method":`+tc.req+`}`)
			got := string(r.Result)
			if r.Error != nil {
				got = fmt.Sprintf("%d %s", r.Error.Code, r.Error.Message)
				if r.Error.Data != nil {
					got += fmt.Sprint(" ", r.Error.Data)
				}
			}
			if got != tc.want {
				t.Errorf("%s: got %s, want %s", tc.req, got, tc.want)
			}
		}
	})
}

// TestNoCatalog: without a Catalog nothing is advertised, lists are empty
// and nothing can be got or read.
func TestNoCatalog(t *testing.T) {
	relay := testkit.Relay(t)
	s := startServer(t, relay, &fakeVendor{}, nil)
	c := newClient(t, relay, s.PublicKey())
	r := c.ask(t, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`)
	if got := string(r.Result); !strings.Contains(got, `"capabilities":{"tools":{"listChanged":true}}`) {
		t.Errorf("initialize %s", got)
	}
	for method, want := range map[string]string{
		"prompts/list":             `{"prompts":[]}`,
		"resources/list":           `{"resources":[]}`,
		"resources/templates/list": `{"resourceTemplates":[]}`,
	} {
		if r := c.ask(t, `{"jsonrpc":"2.0","id":1,"method":"`+method+`"}`); string(r.Result) != want {
			t.Errorf("%s: %s %+v", method, r.Result, r.Error)
		}
	}
	for _, req := range []string{`"prompts/get","params":{"name":"greet"}`, `"resources/read","params":{"uri":"test://readme"}`} {
		r := c.ask(t, `{"jsonrpc":"2.0","id":2,"method":`+req+`}`)
		if r.Error == nil || r.Error.Code != rpcerr.CodeInvalidParams || !strings.HasPrefix(r.Error.Message, "Unknown ") {
			t.Errorf("%s: %s %+v", req, r.Result, r.Error)
		}
	}
}
