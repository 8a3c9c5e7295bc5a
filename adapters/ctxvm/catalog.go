package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/yosida95/uritemplate/v3"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// Log attribute keys of the catalog.
const (
	logKeyPrompt = "prompt"
	logKeyURI    = "uri"
)

// capabilities is initialize's capabilities: tools, and prompts and
// resources when there is a Catalog, each with listChanged (Run notifies
// recent clients after a Refresh that changed a list).
func (s *Server) capabilities() map[string]any {
	listChanged := map[string]any{"listChanged": true} // see Server.Refresh
	c := map[string]any{"tools": listChanged}
	if s.cfg.Catalog != nil {
		c["prompts"] = listChanged
		c["resources"] = listChanged
	}
	return c
}

// serveCatalog answers prompts/list, prompts/get, resources/list,
// resources/templates/list and resources/read from the Catalog, free and
// unrecorded. Lists are not paginated (a cursor is ignored).
func (s *Server) serveCatalog(ctx context.Context, r *request) (json.RawMessage, *rpcError) {
	cat := s.cfg.Catalog
	switch r.msg.Method {
	case "prompts/list":
		var ps []vend.Prompt
		if cat != nil {
			ps = cat.Prompts()
		}
		defs := make([]json.RawMessage, 0, len(ps))
		seen := map[string]bool{}
		for _, p := range ps {
			if d := s.definition(p.Definition, "name", p.Name, "", seen); d != nil {
				defs = append(defs, d)
			}
		}
		return listResult("prompts", defs), nil
	case "resources/list":
		var rs []vend.Resource
		if cat != nil {
			rs = cat.Resources()
		}
		defs := make([]json.RawMessage, 0, len(rs))
		seen := map[string]bool{}
		for _, res := range rs {
			if d := s.definition(res.Definition, "uri", res.URI, res.URI, seen); d != nil {
				defs = append(defs, d)
			}
		}
		return listResult("resources", defs), nil
	case "resources/templates/list":
		var ts []vend.ResourceTemplate
		if cat != nil {
			ts = cat.ResourceTemplates()
		}
		defs := make([]json.RawMessage, 0, len(ts))
		seen := map[string]bool{}
		for _, t := range ts {
			if d := s.definition(t.Definition, "uriTemplate", t.URITemplate, t.URITemplate, seen); d != nil {
				defs = append(defs, d)
			}
		}
		return listResult("resourceTemplates", defs), nil
	case "prompts/get":
		return s.getPrompt(ctx, r.msg.Params)
	case "resources/read":
		return s.readResource(ctx, r.msg.Params)
	}
	return nil, &rpcError{Code: rpcerr.CodeMethodNotFound, Message: "Method not found"}
}

// definition returns def (an MCP Prompt, Resource or ResourceTemplate
// object) with its member key set to value, and name set to defaultName
// when it has none (the member is required; the stock client validates
// it). It returns nil, and logs, for a definition that is not a JSON
// object or a value already in seen.
func (s *Server) definition(def json.RawMessage, key, value, defaultName string, seen map[string]bool) json.RawMessage {
	if seen[value] || value == "" {
		return nil
	}
	fields := map[string]json.RawMessage{}
	if !listable(def) {
		s.log.Warn("catalog entry not listed: bad definition", key, value)
		return nil
	}
	if len(def) > 0 {
		json.Unmarshal(def, &fields)
	}
	fields[key], _ = json.Marshal(value)
	if _, ok := fields["name"]; !ok && defaultName != "" {
		fields["name"], _ = json.Marshal(defaultName)
	}
	b, err := json.Marshal(fields)
	if err != nil {
		s.log.Warn("catalog entry not listed: bad definition", key, value)
		return nil
	}
	seen[value] = true
	return b
}

// listable says whether a definition is listed (see definition): absent
// or a JSON object.
func listable(def json.RawMessage) bool {
	if len(def) == 0 {
		return true
	}
	var fields map[string]json.RawMessage
	return json.Unmarshal(def, &fields) == nil && fields != nil
}

func listResult(member string, defs []json.RawMessage) json.RawMessage {
	b, _ := json.Marshal(map[string]any{member: defs})
	return b
}

// getPrompt serves prompts/get of a listed prompt.
func (s *Server) getPrompt(ctx context.Context, params json.RawMessage) (json.RawMessage, *rpcError) {
	var p struct {
		Name      string            `json:"name"`
		Arguments map[string]string `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.Name == "" {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params"}
	}
	listed := false
	if cat := s.cfg.Catalog; cat != nil {
		for _, lp := range cat.Prompts() {
			if lp.Name == p.Name && listable(lp.Definition) {
				listed = true
				break
			}
		}
	}
	if !listed {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Unknown prompt: " + p.Name}
	}
	body, err := s.cfg.Catalog.GetPrompt(ctx, p.Name, p.Arguments)
	if err == nil {
		body, err = withMember(body, "messages")
	}
	if err != nil {
		return nil, s.catalogError(ctx, "prompts/get", logKeyPrompt, p.Name, err)
	}
	return body, nil
}

// readResource serves resources/read of a listed URI, or one matching a
// listed template.
func (s *Server) readResource(ctx context.Context, params json.RawMessage) (json.RawMessage, *rpcError) {
	var p struct {
		URI string `json:"uri"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.URI == "" {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params"}
	}
	if !s.readable(p.URI) {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Unknown resource: " + p.URI}
	}
	body, err := s.cfg.Catalog.ReadResource(ctx, p.URI)
	if err == nil {
		body, err = withMember(body, "contents")
	}
	if err != nil {
		return nil, s.catalogError(ctx, "resources/read", logKeyURI, p.URI, err)
	}
	return body, nil
}

// readable says whether uri is listed or matches a listed template.
func (s *Server) readable(uri string) bool {
	cat := s.cfg.Catalog
	if cat == nil {
		return false
	}
	for _, r := range cat.Resources() {
		if r.URI == uri && listable(r.Definition) {
			return true
		}
	}
	for _, t := range cat.ResourceTemplates() {
		if !listable(t.Definition) {
			continue
		}
		tmpl, err := uritemplate.New(t.URITemplate)
		if err == nil && tmpl.Regexp().MatchString(uri) {
			return true
		}
	}
	return false
}

// errInvalidResult is a Catalog result that is not a JSON object.
var errInvalidResult = errors.New("catalog result is not a JSON object")

// withMember checks that body is a JSON object and gives it member (a
// list the result type requires) as [] when it lacks it.
func withMember(body json.RawMessage, member string) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, errInvalidResult
	}
	if _, ok := fields[member]; ok {
		return body, nil
	}
	fields[member] = json.RawMessage(`[]`)
	return json.Marshal(fields)
}

// catalogError logs a Catalog failure and returns what the client gets:
// -32054 for an upstream failure, else -32603, never the details.
func (s *Server) catalogError(ctx context.Context, method, key, what string, err error) *rpcError {
	w := &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
	lvl := slog.LevelError
	if errors.Is(err, vend.ErrUpstream) {
		w = &rpcError{Code: rpcerr.CodeUpstream, Message: "Upstream server failed"}
		lvl = slog.LevelInfo
	}
	s.log.Log(ctx, lvl, "catalog request answered with an error", logKeyMethod, method, key, what, logKeyCode, w.Code, logKeyErr, err)
	return w
}
