package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// Log attribute keys of the catalog.
const (
	logKeyPrompt   = "prompt"
	logKeyURI      = "uri"
	logKeyPrompts  = "prompts"
	logKeyRes      = "resources"
	logKeyTemplate = "templates"
)

// ErrNotFound: no upstream offers the prompt, resource or template asked
// for (it was never listed, or has gone since).
var ErrNotFound = errors.New("no such prompt or resource upstream")

// Prompt is an upstream's prompt under its exposed name.
type Prompt struct {
	Name         string // the name clients use: the upstream's Prefix + UpstreamName
	Server       string // the upstream server's configured name
	UpstreamName string // the prompt's name on the upstream
	// Definition is the upstream's prompt object (MCP Prompt) as JSON, with
	// "name" set to Name.
	Definition json.RawMessage

	title, description string
	schema             json.RawMessage // JSON Schema of its arguments, for vend
}

// Resource is an upstream's resource. URIs are not prefixed: they already
// name the resource globally.
type Resource struct {
	URI        string
	Server     string          // the upstream server's configured name
	Definition json.RawMessage // the upstream's resource object (MCP Resource) as JSON
}

// ResourceTemplate is an upstream's resource template (RFC 6570), not
// prefixed either.
type ResourceTemplate struct {
	URITemplate string
	Server      string          // the upstream server's configured name
	Definition  json.RawMessage // the upstream's template object (MCP ResourceTemplate) as JSON

	tmpl *mcp.URITemplate // parsed, to route reads
}

// catalog is the Manager's snapshot of every upstream's prompts and
// resources; replaced, never mutated.
type catalog struct {
	prompts   []Prompt
	resources []Resource
	templates []ResourceTemplate
	promptBy  map[string]Prompt
	uriBy     map[string]Resource
}

// Prompts returns every upstream's prompts under their exposed names, in
// configuration order then upstream order. When two upstreams expose the
// same name, the first configured wins (the other is logged and hidden).
// It does no I/O; the caller must not modify the result.
func (m *Manager) Prompts() []Prompt {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cat.prompts
}

// Resources returns every upstream's resources, in configuration order then
// upstream order. When two upstreams expose the same URI, the first
// configured wins. It does no I/O; the caller must not modify the result.
func (m *Manager) Resources() []Resource {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cat.resources
}

// ResourceTemplates returns every upstream's resource templates, in
// configuration order then upstream order; of two identical templates the
// first configured wins. It does no I/O; the caller must not modify the
// result.
func (m *Manager) ResourceTemplates() []ResourceTemplate {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cat.templates
}

var _ vend.ItemSource = (*Manager)(nil)

// Listings returns, by upstream name, what each upstream listed last
// (kept while it is down), by the names prices are keyed under: its own
// tool and prompt names (without the prefix), its resource URIs and
// templates, whether or not another upstream's hide them. An upstream
// none of whose lists has arrived yet is absent; the lists of a kind that
// has not arrived (listing it failed) are marked unknown. No I/O.
func (m *Manager) Listings() map[string]pricing.Listing {
	out := map[string]pricing.Listing{}
	for _, u := range m.upstreams {
		u.mu.Lock()
		if u.known != 0 {
			l := pricing.Listing{ToolsKnown: u.known&listTools != 0, PromptsKnown: u.known&listPrompts != 0, ResourcesKnown: u.known&listResources != 0}
			for _, t := range u.tools {
				l.Tools = append(l.Tools, t.UpstreamName)
			}
			for _, p := range u.prompts {
				l.Prompts = append(l.Prompts, p.UpstreamName)
			}
			for _, r := range u.resources {
				l.Resources = append(l.Resources, r.URI)
			}
			for _, t := range u.templates {
				l.Templates = append(l.Templates, t.URITemplate)
			}
			out[u.cfg.Name] = l
		}
		u.mu.Unlock()
	}
	return out
}

// PromptItem implements vend.ItemSource: the prompt exposed as name, its
// upstream server and name there, and a JSON Schema of its arguments
// (strings; the required ones required). No I/O.
func (m *Manager) PromptItem(name string) (vend.Item, bool) {
	m.mu.RLock()
	p, ok := m.cat.promptBy[name]
	m.mu.RUnlock()
	if !ok {
		return vend.Item{}, false
	}
	return vend.Item{Kind: vend.ItemPrompt, Name: p.Name, Server: p.Server, UpstreamName: p.UpstreamName,
		Title: p.title, Description: p.description, InputSchema: p.schema}, true
}

// ResourceItem implements vend.ItemSource: the upstream server
// ReadResource would read uri on (Server), and the keys it may be priced
// by: UpstreamName, uri when an upstream lists it or when it is a listed
// URI template itself (for prices in lists), else the first listed
// template (in ReadResource's order) that matches it; then Templates, the
// (further) templates of Server that uri matches, so that a listed URI
// without a price of its own is priced by its template. No I/O.
func (m *Manager) ResourceItem(uri string) (vend.Item, bool) {
	m.mu.RLock()
	cat := m.cat
	m.mu.RUnlock()
	item := func(server, key string) (vend.Item, bool) {
		t := vend.Item{Kind: vend.ItemResource, Name: uri, Server: server, UpstreamName: key}
		for _, tp := range cat.templates {
			if tp.Server == server && tp.URITemplate != key && tp.tmpl != nil && tp.tmpl.Regexp().MatchString(uri) {
				t.Templates = append(t.Templates, tp.URITemplate)
			}
		}
		return t, true
	}
	if r, ok := cat.uriBy[uri]; ok {
		return item(r.Server, uri)
	}
	for _, t := range cat.templates {
		if t.URITemplate == uri {
			return vend.Item{Kind: vend.ItemResource, Name: uri, Server: t.Server, UpstreamName: uri}, true
		}
	}
	for _, t := range cat.templates {
		if t.tmpl != nil && t.tmpl.Regexp().MatchString(uri) {
			return item(t.Server, t.URITemplate)
		}
	}
	return vend.Item{}, false
}

// promptSchema is the JSON Schema of a prompt's arguments: an object of
// strings, its required arguments required. Arguments it does not declare
// are allowed (MCP does not forbid them; the upstream decides).
func promptSchema(p mcp.Prompt) json.RawMessage {
	props := map[string]any{}
	required := []string{}
	for _, a := range p.Arguments {
		props[a.Name] = map[string]any{"type": "string"}
		if a.Required {
			required = append(required, a.Name)
		}
	}
	b, _ := json.Marshal(map[string]any{"type": "object", "properties": props, "required": required})
	return b
}

// GetPrompt renders the prompt exposed as name on its upstream with args
// and returns the upstream's GetPromptResult as JSON (without the hop's
// resultType and _meta server info).
//
// Errors: a name not listed wraps ErrNotFound; an upstream that is down
// (returned at once), a transport failure or a JSON-RPC error from the
// upstream (e.g. a missing argument) wrap vend.ErrUpstream; the end of ctx
// is returned wrapped as is. Nothing is recorded here: a priced prompt is
// sold through vend, which calls this once paid.
func (m *Manager) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	m.mu.RLock()
	p, ok := m.cat.promptBy[name]
	m.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("prompt %q: %w", name, ErrNotFound)
	}
	u := m.byName[p.Server]
	req := mcp.GetPromptRequest{}
	req.Params.Name = p.UpstreamName
	req.Params.Arguments = args
	req.Params.Meta = u.withClientPubkey(ctx, nil)
	return u.request(ctx, "prompts/get "+p.UpstreamName, func(c *client.Client) (any, error) {
		res, err := c.GetPrompt(ctx, req)
		if err != nil {
			return nil, err
		}
		stripHop(&res.Result)
		return res, nil
	})
}

// ReadResource reads uri on the upstream that lists it, or else on the
// first configured upstream with a resource template matching it, and
// returns the upstream's ReadResourceResult as JSON (without the hop's
// resultType and _meta server info).
//
// Errors: a URI no upstream lists or matches wraps ErrNotFound; the others
// are those of GetPrompt.
func (m *Manager) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	m.mu.RLock()
	cat := m.cat
	m.mu.RUnlock()
	server := ""
	if r, ok := cat.uriBy[uri]; ok {
		server = r.Server
	} else {
		for _, t := range cat.templates {
			if t.tmpl != nil && t.tmpl.Regexp().MatchString(uri) {
				server = t.Server
				break
			}
		}
	}
	if server == "" {
		return nil, fmt.Errorf("resource %q: %w", uri, ErrNotFound)
	}
	u := m.byName[server]
	req := mcp.ReadResourceRequest{}
	req.Params.URI = uri
	req.Params.Meta = u.withClientPubkey(ctx, nil)
	return u.request(ctx, "resources/read "+uri, func(c *client.Client) (any, error) {
		res, err := c.ReadResource(ctx, req)
		if err != nil {
			return nil, err
		}
		stripHop(&res.Result)
		return res, nil
	})
}

// stripHop removes what the protocol adds to a result on the hop from the
// upstream (the front adds its own).
func stripHop(r *mcp.Result) {
	r.ResultType = ""
	if r.Meta != nil {
		delete(r.Meta.AdditionalFields, mcp.MetaKeyServerInfo)
		if r.Meta.ProgressToken == nil && len(r.Meta.AdditionalFields) == 0 {
			r.Meta = nil
		}
	}
}

// request runs one request on the upstream's current session and encodes
// its result, with the error conventions of CallTool.
func (u *upstream) request(ctx context.Context, what string, do func(*client.Client) (any, error)) (json.RawMessage, error) {
	u.mu.Lock()
	c := u.sess
	u.mu.Unlock()
	if c == nil {
		return nil, fmt.Errorf("upstream %q is down: %w", u.cfg.Name, vend.ErrUpstream)
	}
	res, err := do(c)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("upstream %q: %s: %w", u.cfg.Name, what, ctx.Err())
		}
		if isTransportErr(err) {
			signal(u.check)
		}
		return nil, fmt.Errorf("upstream %q: %s: %w: %w", u.cfg.Name, what, vend.ErrUpstream, err)
	}
	body, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %s: encode result: %w: %w", u.cfg.Name, what, vend.ErrUpstream, err)
	}
	return body, nil
}

// rebuildCatalog recomputes the catalog snapshot from the upstreams' lists.
func (m *Manager) rebuildCatalog() {
	m.rebuildMu.Lock()
	defer m.rebuildMu.Unlock()
	cat := catalog{promptBy: map[string]Prompt{}, uriBy: map[string]Resource{}}
	seenTmpl := map[string]string{}
	for _, u := range m.upstreams {
		prompts, resources, templates := u.catalogLists()
		for _, p := range prompts {
			if other, dup := cat.promptBy[p.Name]; dup {
				m.log.Warn("prompt name exposed by two upstreams; keeping the first",
					logKeyPrompt, p.Name, logKeyServer, u.cfg.Name, logKeyKept, other.Server)
				continue
			}
			cat.promptBy[p.Name] = p
			cat.prompts = append(cat.prompts, p)
		}
		for _, r := range resources {
			if other, dup := cat.uriBy[r.URI]; dup {
				m.log.Warn("resource URI exposed by two upstreams; keeping the first",
					logKeyURI, r.URI, logKeyServer, u.cfg.Name, logKeyKept, other.Server)
				continue
			}
			cat.uriBy[r.URI] = r
			cat.resources = append(cat.resources, r)
		}
		for _, t := range templates {
			if other, dup := seenTmpl[t.URITemplate]; dup {
				m.log.Warn("resource template exposed by two upstreams; keeping the first",
					logKeyURI, t.URITemplate, logKeyServer, u.cfg.Name, logKeyKept, other)
				continue
			}
			seenTmpl[t.URITemplate] = u.cfg.Name
			cat.templates = append(cat.templates, t)
		}
	}
	m.mu.Lock()
	m.cat = cat
	m.mu.Unlock()
}

// fetchPrompts fetches every page of the upstream's prompts.
func fetchPrompts(ctx context.Context, c *client.Client, sc ServerConfig) ([]Prompt, error) {
	res, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
	if err != nil {
		return nil, fmt.Errorf("prompts/list: %w", err)
	}
	out := make([]Prompt, 0, len(res.Prompts))
	for _, p := range res.Prompts {
		up := p.Name
		p.Name = sc.Prefix + up
		def, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("prompts/list: encode %q: %w", up, err)
		}
		out = append(out, Prompt{Name: p.Name, Server: sc.Name, UpstreamName: up, Definition: def,
			title: p.Title, description: p.Description, schema: promptSchema(p)})
	}
	return out, nil
}

// fetchResources fetches every page of the upstream's resources and
// resource templates.
func fetchResources(ctx context.Context, c *client.Client, sc ServerConfig) ([]Resource, []ResourceTemplate, error) {
	res, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("resources/list: %w", err)
	}
	resources := make([]Resource, 0, len(res.Resources))
	for _, r := range res.Resources {
		def, err := json.Marshal(r)
		if err != nil {
			return nil, nil, fmt.Errorf("resources/list: encode %q: %w", r.URI, err)
		}
		resources = append(resources, Resource{URI: r.URI, Server: sc.Name, Definition: def})
	}
	tres, err := c.ListResourceTemplates(ctx, mcp.ListResourceTemplatesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("resources/templates/list: %w", err)
	}
	templates := make([]ResourceTemplate, 0, len(tres.ResourceTemplates))
	for _, t := range tres.ResourceTemplates {
		if t.URITemplate == nil || t.URITemplate.Template == nil {
			continue // mcp-go parsed nothing: nothing to route by
		}
		def, err := json.Marshal(t)
		if err != nil {
			return nil, nil, fmt.Errorf("resources/templates/list: encode %q: %w", t.Name, err)
		}
		templates = append(templates, ResourceTemplate{URITemplate: t.URITemplate.Raw(), Server: sc.Name, Definition: def, tmpl: t.URITemplate})
	}
	return resources, templates, nil
}

// sameJSON reports whether a and b encode alike (nil and empty differ).
func sameJSON[T any](a, b []T) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
