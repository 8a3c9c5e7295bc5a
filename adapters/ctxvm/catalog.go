package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/nbd-wtf/go-nostr"
	"github.com/yosida95/uritemplate/v3"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/pricing"
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

// ItemPricer is an optional ability of a Vendor: it sells prompts and
// resources (vend's Vendor implements it). A prompt or resource it prices
// above 0 is listed with its price (_meta and cap tags) and its
// prompts/get or resources/read is sold through Vendor.CallItem like a
// tools/call; the others stay free.
type ItemPricer interface {
	// ItemPrice returns the least and most a prompts/get (ItemPrompt,
	// the exposed name) or resources/read (ItemResource, a URI or URI
	// template) costs; 0 when free or unknown.
	ItemPrice(kind vend.ItemKind, name string) (lo, hi vend.Msat)
}

// itemPrice is the listed price of a prompt or resource; 0 when the Vendor
// sells none.
func (s *Server) itemPrice(kind vend.ItemKind, name string) (lo, hi vend.Msat) {
	if ip, ok := s.cfg.Vendor.(ItemPricer); ok {
		return ip.ItemPrice(kind, name)
	}
	return 0, 0
}

// itemCap is the ContextVM cap tag of a priced prompt or resource:
// ["cap","prompt:<name>"|"resource:<uri>","<sats or lo-hi>","sats"].
func itemCap(kind vend.ItemKind, name string, lo, hi vend.Msat) nostr.Tag {
	return nostr.Tag{"cap", string(kind) + ":" + name, pricing.CapAmount(lo, hi), "sats"}
}

// priceMeta is the value of _meta["capvend/price"] of a priced item:
// {"amount": lo, "unit": "sats"}, plus "max_amount" when it varies.
func priceMeta(lo, hi vend.Msat) map[string]any {
	price := map[string]any{"amount": lo.SatsCeil(), "unit": "sats"}
	if hi.SatsCeil() > lo.SatsCeil() {
		price["max_amount"] = hi.SatsCeil()
	}
	return price
}

// withPrice sets _meta["capvend/price"] in a definition's members,
// keeping the rest of its _meta.
func withPrice(fields map[string]json.RawMessage, lo, hi vend.Msat) {
	meta := map[string]json.RawMessage{}
	if raw, ok := fields["_meta"]; ok {
		if json.Unmarshal(raw, &meta) != nil || meta == nil {
			meta = map[string]json.RawMessage{}
		}
	}
	meta["capvend/price"], _ = json.Marshal(priceMeta(lo, hi))
	fields["_meta"], _ = json.Marshal(meta)
}

// serveCatalog answers prompts/list, prompts/get, resources/list,
// resources/templates/list and resources/read from the Catalog: free and
// unrecorded, except a priced prompt or resource (see ItemPricer). Lists
// carry the prices of priced entries in _meta and as cap tags. Lists are
// not paginated (a cursor is ignored).
func (s *Server) serveCatalog(ctx context.Context, r *request, out *outbox) (json.RawMessage, *rpcError, nostr.Tags) {
	cat := s.cfg.Catalog
	switch r.msg.Method {
	case "prompts/list":
		var ps []vend.Prompt
		if cat != nil {
			ps = cat.Prompts()
		}
		defs := make([]json.RawMessage, 0, len(ps))
		var tags nostr.Tags
		seen := map[string]bool{}
		for _, p := range ps {
			if d, tag := s.definition(vend.ItemPrompt, p.Definition, "name", p.Name, "", seen); d != nil {
				defs = append(defs, d)
				tags = append(tags, tag...)
			}
		}
		return listResult("prompts", defs), nil, tags
	case "resources/list":
		var rs []vend.Resource
		if cat != nil {
			rs = cat.Resources()
		}
		defs := make([]json.RawMessage, 0, len(rs))
		var tags nostr.Tags
		seen := map[string]bool{}
		for _, res := range rs {
			if d, tag := s.definition(vend.ItemResource, res.Definition, "uri", res.URI, res.URI, seen); d != nil {
				defs = append(defs, d)
				tags = append(tags, tag...)
			}
		}
		return listResult("resources", defs), nil, tags
	case "resources/templates/list":
		var ts []vend.ResourceTemplate
		if cat != nil {
			ts = cat.ResourceTemplates()
		}
		defs := make([]json.RawMessage, 0, len(ts))
		var tags nostr.Tags
		seen := map[string]bool{}
		for _, t := range ts {
			if d, tag := s.definition(vend.ItemResource, t.Definition, "uriTemplate", t.URITemplate, t.URITemplate, seen); d != nil {
				defs = append(defs, d)
				tags = append(tags, tag...)
			}
		}
		return listResult("resourceTemplates", defs), nil, tags
	case "prompts/get":
		res, rerr := s.getPrompt(ctx, r, out)
		return res, rerr, nil
	case "resources/read":
		res, rerr := s.readResource(ctx, r, out)
		return res, rerr, nil
	}
	return nil, &rpcError{Code: rpcerr.CodeMethodNotFound, Message: "Method not found"}, nil
}

// definition returns def (an MCP Prompt, Resource or ResourceTemplate
// object) with its member key set to value, and name set to defaultName
// when it has none (the member is required; the stock client validates
// it); a priced item (of kind, named value) gets its price in _meta and
// its cap tag is returned. It returns nil, and logs, for a definition that
// is not a JSON object or a value already in seen.
func (s *Server) definition(kind vend.ItemKind, def json.RawMessage, key, value, defaultName string, seen map[string]bool) (json.RawMessage, nostr.Tags) {
	if seen[value] || value == "" {
		return nil, nil
	}
	fields := map[string]json.RawMessage{}
	if !listable(def) {
		s.log.Warn("catalog entry not listed: bad definition", key, value)
		return nil, nil
	}
	if len(def) > 0 {
		json.Unmarshal(def, &fields)
	}
	fields[key], _ = json.Marshal(value)
	if _, ok := fields["name"]; !ok && defaultName != "" {
		fields["name"], _ = json.Marshal(defaultName)
	}
	var tags nostr.Tags
	if lo, hi := s.itemPrice(kind, value); hi > 0 {
		withPrice(fields, lo, hi)
		tags = nostr.Tags{itemCap(kind, value, lo, hi)}
	}
	b, err := json.Marshal(fields)
	if err != nil {
		s.log.Warn("catalog entry not listed: bad definition", key, value)
		return nil, nil
	}
	seen[value] = true
	return b, tags
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

// getPrompt serves prompts/get of a listed prompt: sold through the
// Vendor when priced.
func (s *Server) getPrompt(ctx context.Context, r *request, out *outbox) (json.RawMessage, *rpcError) {
	var p struct {
		Name      string            `json:"name"`
		Arguments map[string]string `json:"arguments"`
		Meta      map[string]any    `json:"_meta"`
	}
	if err := json.Unmarshal(r.msg.Params, &p); err != nil || p.Name == "" {
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
	if _, hi := s.itemPrice(vend.ItemPrompt, p.Name); hi > 0 {
		args, _ := json.Marshal(p.Arguments)
		body, rerr := s.sell(ctx, s.callRequest(r, out, vend.ItemPrompt, p.Name, args, p.Meta), out)
		if rerr != nil {
			return nil, rerr
		}
		if body, err := withMember(body, "messages"); err == nil {
			return body, nil
		}
		return nil, &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
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
// listed template: sold through the Vendor when priced.
func (s *Server) readResource(ctx context.Context, r *request, out *outbox) (json.RawMessage, *rpcError) {
	var p struct {
		URI  string         `json:"uri"`
		Meta map[string]any `json:"_meta"`
	}
	if err := json.Unmarshal(r.msg.Params, &p); err != nil || p.URI == "" {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params"}
	}
	if !s.readable(p.URI) {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Unknown resource: " + p.URI}
	}
	if _, hi := s.itemPrice(vend.ItemResource, p.URI); hi > 0 {
		body, rerr := s.sell(ctx, s.callRequest(r, out, vend.ItemResource, p.URI, json.RawMessage(`{}`), p.Meta), out)
		if rerr != nil {
			return nil, rerr
		}
		if body, err := withMember(body, "contents"); err == nil {
			return body, nil
		}
		return nil, &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
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
// -32054 for an upstream failure, -32602 for a vend.InvalidParamsError
// (its reason names nothing internal), else -32603, never the details.
func (s *Server) catalogError(ctx context.Context, method, key, what string, err error) *rpcError {
	w := &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
	lvl := slog.LevelError
	var ip *vend.InvalidParamsError
	switch {
	case errors.Is(err, vend.ErrUpstream):
		w = &rpcError{Code: rpcerr.CodeUpstream, Message: "Upstream server failed"}
		lvl = slog.LevelInfo
	case errors.As(err, &ip): // not for sale, or a URI not in normal form (vend.Vendor.Offered)
		w = &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params: " + ip.Reason}
		lvl = slog.LevelInfo
	}
	s.log.Log(ctx, lvl, "catalog request answered with an error", logKeyMethod, method, key, what, logKeyCode, w.Code, logKeyErr, err)
	return w
}
