package mcpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// Catalog is the free, pass-through part of what the front serves:
// prompts, resources and resource templates. The wiring adapts the
// upstream Manager to it.
//
// What is not priced is served for free, nothing recorded: definitions as
// the Catalog gives them (names, URIs and URI templates as listed),
// results converted from the Catalog's JSON to mcp-go's typed results
// (its handlers take no raw JSON) and back, which keeps every member
// mcp-go models (tested against the JSON for text, image and
// embedded-resource messages, annotations, _meta, text and blob
// contents). A read of a URI neither listed nor matching a listed
// template, or a get of an unlisted prompt, is refused by mcp-go. Catalog
// errors wrapping vend.ErrUpstream become -32054 "Upstream server
// failed"; others -32603. A priced prompt or resource (the Vendor is an
// ItemPricer) is listed with its price like a tool and sold through
// Vendor.CallItem (itemRequest), answered with the same notifications and
// errors, explicit gating as the 402 error (CodePaymentRequired402).
type Catalog interface {
	// Prompts returns the prompts to list now. The result is not modified
	// by the caller.
	Prompts() []Prompt
	// GetPrompt renders the prompt listed as name with args and returns
	// an MCP GetPromptResult as JSON. Errors wrapping vend.ErrUpstream are
	// answered as such, a *vend.InvalidParamsError as invalid params; any
	// other as an internal error.
	GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error)
	// Resources returns the resources to list now (not modified by the
	// caller).
	Resources() []Resource
	// ResourceTemplates returns the resource templates to list now (not
	// modified by the caller).
	ResourceTemplates() []ResourceTemplate
	// ReadResource reads uri (a listed resource, or one matching a listed
	// template) and returns an MCP ReadResourceResult as JSON. Errors as
	// for GetPrompt.
	ReadResource(ctx context.Context, uri string) (json.RawMessage, error)
}

// Prompt, Resource and ResourceTemplate are vend's catalog entries.
type (
	Prompt           = vend.Prompt
	Resource         = vend.Resource
	ResourceTemplate = vend.ResourceTemplate
)

// Log attribute keys of the catalog.
const (
	logKeyPrompt = "prompt"
	logKeyURI    = "uri"
)

// catalogState is what Refresh last registered with mcp-go, by key, as
// JSON, to register only what changed (each registration makes mcp-go
// send a list_changed).
type catalogState struct {
	mu        sync.Mutex
	prompts   map[string][]byte
	resources map[string][]byte
	templates map[string][]byte
}

// refreshCatalog registers the Catalog's current prompts, resources and
// templates with mcp-go, changing only what differs from the last call.
// New definitions replace old ones in place (AddPrompts, AddResources),
// so a concurrent list never sees an empty set; gone ones are deleted.
func (s *Server) refreshCatalog() {
	cat := s.cfg.Catalog
	if cat == nil {
		return
	}
	st := &s.catalog
	st.mu.Lock()
	defer st.mu.Unlock()

	// Prompts.
	next := map[string][]byte{}
	var addP []server.ServerPrompt
	for _, p := range cat.Prompts() {
		var mp mcp.Prompt
		if err := unmarshalDef(p.Definition, &mp); err != nil {
			s.log.Warn("prompt not listed: bad definition", logKeyPrompt, p.Name, logKeyErr, err)
			continue
		}
		mp.Name = p.Name
		mp.Meta = s.itemMeta(mp.Meta, vend.ItemPrompt, p.Name)
		b, _ := json.Marshal(mp)
		if _, dup := next[p.Name]; dup {
			continue
		}
		next[p.Name] = b
		if !bytes.Equal(st.prompts[p.Name], b) {
			addP = append(addP, server.ServerPrompt{Prompt: mp, Handler: s.handleGetPrompt})
		}
	}
	if gone := removed(st.prompts, next); len(gone) > 0 {
		s.mcp.DeletePrompts(gone...)
	}
	if len(addP) > 0 {
		s.mcp.AddPrompts(addP...)
	}
	st.prompts = next

	// Resources.
	next = map[string][]byte{}
	var addR []server.ServerResource
	for _, r := range cat.Resources() {
		var mr mcp.Resource
		if err := unmarshalDef(r.Definition, &mr); err != nil {
			s.log.Warn("resource not listed: bad definition", logKeyURI, r.URI, logKeyErr, err)
			continue
		}
		mr.URI = r.URI
		mr.Meta = s.itemMeta(mr.Meta, vend.ItemResource, r.URI)
		b, _ := json.Marshal(mr)
		if _, dup := next[r.URI]; dup {
			continue
		}
		next[r.URI] = b
		if !bytes.Equal(st.resources[r.URI], b) {
			addR = append(addR, server.ServerResource{Resource: mr, Handler: s.handleReadResource})
		}
	}
	if gone := removed(st.resources, next); len(gone) > 0 {
		s.mcp.DeleteResources(gone...)
	}
	if len(addR) > 0 {
		s.mcp.AddResources(addR...)
	}
	st.resources = next

	// Templates: mcp-go v1.2.1 has no global delete, so a removal
	// re-registers the whole set.
	next = map[string][]byte{}
	var all, addT []server.ServerResourceTemplate
	for _, t := range cat.ResourceTemplates() {
		var mt mcp.ResourceTemplate
		if err := unmarshalDef(t.Definition, &mt); err != nil {
			s.log.Warn("resource template not listed: bad definition", logKeyURI, t.URITemplate, logKeyErr, err)
			continue
		}
		var ut mcp.URITemplate
		raw, _ := json.Marshal(t.URITemplate)
		if err := ut.UnmarshalJSON(raw); err != nil {
			s.log.Warn("resource template not listed: bad URI template", logKeyURI, t.URITemplate, logKeyErr, err)
			continue
		}
		mt.URITemplate = &ut
		mt.Meta = s.itemMeta(mt.Meta, vend.ItemResource, t.URITemplate)
		b, _ := json.Marshal(mt)
		if _, dup := next[t.URITemplate]; dup {
			continue
		}
		next[t.URITemplate] = b
		entry := server.ServerResourceTemplate{Template: mt, Handler: s.handleReadResource}
		all = append(all, entry)
		if !bytes.Equal(st.templates[t.URITemplate], b) {
			addT = append(addT, entry)
		}
	}
	switch {
	case len(removed(st.templates, next)) > 0:
		s.mcp.SetResourceTemplates(all...)
	case len(addT) > 0:
		s.mcp.AddResourceTemplates(addT...)
	}
	st.templates = next
}

// unmarshalDef decodes a definition into v. For a ResourceTemplate, the
// uriTemplate member is left out (it is set from URITemplate).
func unmarshalDef(def json.RawMessage, v any) error {
	if len(def) == 0 {
		return nil
	}
	if _, ok := v.(*mcp.ResourceTemplate); ok {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(def, &fields); err != nil {
			return err
		}
		delete(fields, "uriTemplate")
		b, err := json.Marshal(fields)
		if err != nil {
			return err
		}
		def = b
	}
	return json.Unmarshal(def, v)
}

// removed returns the keys of old that are not in next.
func removed(old, next map[string][]byte) []string {
	var out []string
	for k := range old {
		if _, ok := next[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// handleGetPrompt is the mcp-go handler of every prompt: a priced one is
// sold through the Vendor, a free one fetched from the Catalog.
func (s *Server) handleGetPrompt(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	name := req.Params.Name
	var body json.RawMessage
	var err error
	if _, hi := s.priced(vend.ItemPrompt, name); hi > 0 {
		args := json.RawMessage(`{}`)
		if req.Params.Arguments != nil {
			args, _ = json.Marshal(req.Params.Arguments)
		}
		cr, cerr := s.itemRequest(ctx, vend.ItemPrompt, name, args, req.Header, req.Params.Meta)
		body, err = s.sell(ctx, cr, cerr)
		if err != nil {
			return nil, err
		}
	} else if body, err = s.cfg.Catalog.GetPrompt(ctx, name, req.Params.Arguments); err != nil {
		return nil, s.catalogError(ctx, "prompts/get", logKeyPrompt, name, err)
	}
	res, err := mcp.ParseGetPromptResult(&body)
	if err != nil {
		return nil, s.catalogError(ctx, "prompts/get", logKeyPrompt, name, fmt.Errorf("invalid result: %w", err))
	}
	if res.Messages == nil {
		res.Messages = []mcp.PromptMessage{} // required member
	}
	return res, nil
}

// handleReadResource is the mcp-go handler of every resource and template.
// mcp-go's handlers return only the contents: the result's own _meta and
// cache hints are not passed on.
func (s *Server) handleReadResource(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	uri := req.Params.URI
	var body json.RawMessage
	var err error
	if _, hi := s.priced(vend.ItemResource, uri); hi > 0 {
		cr, cerr := s.itemRequest(ctx, vend.ItemResource, uri, json.RawMessage(`{}`), req.Header, req.Params.Meta)
		body, err = s.sell(ctx, cr, cerr)
		if err != nil {
			return nil, err
		}
	} else if body, err = s.cfg.Catalog.ReadResource(ctx, uri); err != nil {
		return nil, s.catalogError(ctx, "resources/read", logKeyURI, uri, err)
	}
	res, err := mcp.ParseReadResourceResult(&body)
	if err != nil {
		return nil, s.catalogError(ctx, "resources/read", logKeyURI, uri, fmt.Errorf("invalid result: %w", err))
	}
	return res.Contents, nil
}

// sell runs a priced prompts/get or resources/read through the Vendor
// (payment notifications on the request's stream, as for tools) and
// returns the result body, or the error for mcp-go marked with its wire
// error (see toWire). Over HTTP, a request that wants 402 answers gets
// them as a tools/call does (http402.go): 402 with the challenges, 401
// for a refused L402 credential (credErr: a malformed one, refused
// before the Vendor sees the request), 400 for a refused X-Cashu token;
// mcp-go's own answer is then dropped.
func (s *Server) sell(ctx context.Context, cr vend.CallRequest, credErr error) (json.RawMessage, error) {
	if credErr != nil {
		if s.answerHTTP(ctx, &cr, credErr) {
			return nil, errAnsweredOverHTTP
		}
		return nil, s.markError(credErr, cr.Name)
	}
	res, err := s.cfg.Vendor.CallItem(ctx, cr)
	if err == nil && !json.Valid(res.Body) {
		err = fmt.Errorf("invalid result body")
	}
	if s.answerHTTP(ctx, &cr, err) {
		return nil, errAnsweredOverHTTP
	}
	if w, ok := s.gatingError(&cr, err); ok {
		s.log.Debug("priced "+string(cr.Kind)+" answered: payment required", logKeyTool, cr.Name, logKeyTransport, cr.Transport)
		return nil, s.markWire(w, err)
	}
	if err != nil {
		w := toWire(err, cr.Name)
		lvl := rpcerr.LogLevel(w.Code)
		s.log.Log(ctx, lvl, "priced "+string(cr.Kind)+" answered with an error", logKeyTool, cr.Name, logKeyTransport, cr.Transport, logKeyCode, w.Code, logKeyErr, err)
		return nil, s.markError(err, cr.Name)
	}
	return res.Body, nil
}

// errAnsweredOverHTTP is what a prompts/get or resources/read handler
// returns when answerHTTP wrote the request's answer: mcp-go's error
// response to it is dropped by the writer.
var errAnsweredOverHTTP = errors.New("answered over HTTP")

// catalogError logs err and returns it marked for the writers (see
// toWire): an upstream failure or an internal error, without details.
func (s *Server) catalogError(ctx context.Context, method, key, what string, err error) error {
	w := toWire(err, "")
	lvl := slog.LevelInfo
	if w.Code == rpcerr.CodeInternal {
		lvl = slog.LevelError
	}
	s.log.Log(ctx, lvl, "catalog request answered with an error", logKeyMethod, method, key, what, logKeyCode, w.Code, logKeyErr, err)
	return s.markError(err, "")
}

// itemMeta is the _meta of a listed prompt, resource or template: m with
// the item's price when it has one.
func (s *Server) itemMeta(m *mcp.Meta, kind vend.ItemKind, name string) *mcp.Meta {
	lo, hi := s.priced(kind, name)
	return withPrice(m, lo, hi)
}
