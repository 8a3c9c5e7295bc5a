package cli

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/adapters/upstream"
)

// awaitUpstreams returns once every upstream has listed its tools (the
// fronts offer them) or failed once,
// after limit, or when ctx ends.
func awaitUpstreams(ctx context.Context, ups *upstream.Manager, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		settled := true
		for _, st := range ups.Status() {
			settled = settled && (st.Listed || st.LastErr != "")
		}
		if settled {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func upstreamServers(cfg *Config) []upstream.ServerConfig {
	out := make([]upstream.ServerConfig, 0, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		sc := upstream.ServerConfig{Name: u.Name, Prefix: u.Prefix, Command: u.Command, Args: u.Args, Dir: u.Cwd, URL: u.URL,
			ClientPubkey: u.ClientPubkey}
		if len(u.Env) > 0 {
			keys := make([]string, 0, len(u.Env))
			for k := range u.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys { // with PATH and HOME, the child's whole environment
				sc.Env = append(sc.Env, k+"="+u.Env[k])
			}
		}
		out = append(out, sc)
	}
	return out
}

// upstreamCatalog serves the upstreams' prompts and resources on the MCP
// and Nostr fronts (priced ones are sold through the Vendor instead).
type upstreamCatalog struct{ m *upstream.Manager }

var (
	_ mcpfront.Catalog = upstreamCatalog{}
	_ ctxvm.Catalog    = upstreamCatalog{}
)

func (c upstreamCatalog) Prompts() []mcpfront.Prompt {
	ps := c.m.Prompts()
	out := make([]mcpfront.Prompt, len(ps))
	for i, p := range ps {
		out[i] = mcpfront.Prompt{Name: p.Name, Definition: p.Definition}
	}
	return out
}

func (c upstreamCatalog) Resources() []mcpfront.Resource {
	rs := c.m.Resources()
	out := make([]mcpfront.Resource, len(rs))
	for i, r := range rs {
		out[i] = mcpfront.Resource{URI: r.URI, Definition: r.Definition}
	}
	return out
}

func (c upstreamCatalog) ResourceTemplates() []mcpfront.ResourceTemplate {
	ts := c.m.ResourceTemplates()
	out := make([]mcpfront.ResourceTemplate, len(ts))
	for i, t := range ts {
		out[i] = mcpfront.ResourceTemplate{URITemplate: t.URITemplate, Definition: t.Definition}
	}
	return out
}

func (c upstreamCatalog) GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error) {
	return c.m.GetPrompt(ctx, name, args)
}

func (c upstreamCatalog) ReadResource(ctx context.Context, uri string) (json.RawMessage, error) {
	return c.m.ReadResource(ctx, uri)
}
