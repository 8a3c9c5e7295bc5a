// Package upstream connects capvend to the MCP servers whose tools it sells.
//
// # What it owns
//
// A Manager keeps one MCP client session per configured upstream (a stdio
// child process or a Streamable HTTP URL) and implements vend.ToolSource
// over all of them: Tools lists every upstream's tools under its prefix,
// CallTool forwards a call to the upstream that owns the tool and passes
// its progress notifications back. Prompts, resources and resource
// templates are passed through for free: listed on connect from every
// upstream that advertises the capability (following pagination), listed
// again on their list_changed, and routed (GetPrompt by exposed name,
// ReadResource by URI). Prompts get the upstream's Prefix like tools;
// resource URIs and templates are kept as they are (a URI already names
// its resource), the first configured upstream winning a clash. Every
// upstream client declares elicitation: an upstream's request for input
// during a call is answered through the vend.ElicitFunc in the call's
// context (vend.WithElicit), or declined when there is none (elicit.go).
// The Manager is also a vend.RawToolSource: vend posts free calls to an
// HTTP upstream on protocol 2026-07-28 as bytes (raw.go).
//
// # Lifecycle
//
// New does no I/O and starts nothing. Run connects every upstream,
// reconnects with exponential backoff (100 ms doubling to 30 s) when one
// fails, when its stdio child dies or when its HTTP listen stream breaks,
// and returns when its context ends, after stopping the children. A
// list_changed of tools, prompts or resources makes the Manager list them
// again and call Config.OnChange if the set changed. While an upstream is
// down its last known tools, prompts and resources stay listed (so
// clients and Nostr announcements do not churn on a short outage) and
// requests to it fail at once with an error wrapping vend.ErrUpstream. An
// upstream never reached has no tools.
//
// # How it fits
//
// It imports vend (the interfaces it implements) and pricing, and
// mcp-go's client. internal/cli makes it the Vendor's ToolSource and,
// through an adapter, the fronts' Catalog.
package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// Log attribute keys.
const (
	logKeyServer = "upstream"
	logKeyErr    = "err"
	logKeyTools  = "tools"
	logKeyDelay  = "retry_in"
	logKeyTool   = "tool"
	logKeyKept   = "kept"
	logKeyProto  = "protocol"
	logKeyLine   = "line"
)

// Defaults for Config's zero values.
const (
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	DefaultPingInterval   = 30 * time.Second
	DefaultConnectTimeout = 30 * time.Second
	DefaultStopTimeout    = 5 * time.Second
)

// ServerConfig describes one upstream MCP server. Exactly one of Command
// (stdio) and URL (Streamable HTTP) is set.
type ServerConfig struct {
	// Name identifies the upstream in logs, in vend.Item.Server and in
	// price rules. Unique among upstreams.
	Name string
	// Prefix is prepended to the upstream's tool and prompt names to form
	// the names clients see (may be empty). Resource URIs keep theirs.
	Prefix string

	// Command, Args, Env and Dir start a stdio upstream. The child's
	// environment is PATH and HOME from capvend's and Env ("KEY=value",
	// winning over those two): nothing else of capvend's environment.
	Command string
	Args    []string
	Env     []string
	Dir     string

	// URL is a Streamable HTTP endpoint (http or https), with optional
	// extra request Headers (e.g. an Authorization header).
	URL     string
	Headers map[string]string

	// ClientPubkey gives the upstream the Nostr client's pubkey
	// (ContextVM's CEP-16): tools/call, prompts/get and resources/read
	// requests whose ctx carries one (vend.WithClientPubkey) get it as
	// params._meta.clientPubkey (64 hex). No client's _meta reaches an
	// upstream, so the value is always the signer's own.
	ClientPubkey bool
}

// metaClientPubkey is the _meta key of the client's pubkey (CEP-16).
const metaClientPubkey = "clientPubkey"

// clientPubkey is the pubkey to put in the _meta of a request of u's
// made with ctx, or "".
func (u *upstream) clientPubkey(ctx context.Context) string {
	if !u.cfg.ClientPubkey {
		return ""
	}
	return vend.ClientPubkeyFrom(ctx)
}

// withClientPubkey returns meta (nil: a new one) with the client's
// pubkey when u gives it and ctx has one.
func (u *upstream) withClientPubkey(ctx context.Context, meta *mcp.Meta) *mcp.Meta {
	pk := u.clientPubkey(ctx)
	if pk == "" {
		return meta
	}
	if meta == nil {
		meta = &mcp.Meta{}
	}
	if meta.AdditionalFields == nil {
		meta.AdditionalFields = map[string]any{}
	}
	meta.AdditionalFields[metaClientPubkey] = pk
	return meta
}

// Config configures a Manager.
type Config struct {
	Servers []ServerConfig
	Logger  *slog.Logger // nil: slog.Default()

	// OnChange is called after the tools, prompts, resources or resource
	// templates of an upstream changed (connected for the first time,
	// re-listed after list_changed or a reconnect). It runs on the upstream's goroutine: it must not block
	// for long, and must not call back into CallTool synchronously.
	OnChange func()
	// OnState, if set, is called when an upstream goes up (err nil) or
	// down (err says why). Same rules as OnChange.
	OnState func(server string, up bool, err error)

	MinBackoff     time.Duration // first retry delay; 0: DefaultMinBackoff
	MaxBackoff     time.Duration // retry delay cap; 0: DefaultMaxBackoff
	PingInterval   time.Duration // health check of a connected upstream; 0: DefaultPingInterval
	ConnectTimeout time.Duration // bound on connect+initialize+list; 0: DefaultConnectTimeout
	StopTimeout    time.Duration // grace for a child to exit on stdin EOF before it is killed; 0: DefaultStopTimeout
}

// Validate reports the first problem in c, or nil.
func (c Config) Validate() error {
	names := map[string]bool{}
	for i, s := range c.Servers {
		if s.Name == "" {
			return fmt.Errorf("upstream #%d: name is empty", i)
		}
		if names[s.Name] {
			return fmt.Errorf("upstream %q: duplicate name", s.Name)
		}
		names[s.Name] = true
		switch {
		case s.Command != "" && s.URL != "":
			return fmt.Errorf("upstream %q: set either command or url, not both", s.Name)
		case s.Command == "" && s.URL == "":
			return fmt.Errorf("upstream %q: set command or url", s.Name)
		case s.URL != "":
			u, err := url.Parse(s.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("upstream %q: url must be an absolute http(s) URL", s.Name)
			}
		}
	}
	if c.MinBackoff < 0 || c.MaxBackoff < 0 || c.PingInterval < 0 || c.ConnectTimeout < 0 || c.StopTimeout < 0 {
		return errors.New("upstream: durations must not be negative")
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
}

// Manager is the set of upstream MCP servers. It is safe for concurrent use.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	upstreams []*upstream
	byName    map[string]*upstream

	// rebuildMu serialises rebuilds, so that a rebuild that read older
	// lists cannot store its snapshot after one that read newer lists.
	rebuildMu sync.Mutex

	mu    sync.RWMutex
	tools []vend.Item // snapshot returned by Tools; replaced, never mutated
	cat   catalog     // prompts and resources; replaced, never mutated

	running atomic.Bool
}

var _ vend.ToolSource = (*Manager)(nil)

// New validates cfg and returns a Manager. It does no I/O and starts no
// goroutine; call Run.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	m := &Manager{cfg: cfg, log: cfg.Logger, byName: map[string]*upstream{}}
	for _, sc := range cfg.Servers {
		sc.Args = slices.Clone(sc.Args)
		sc.Env = slices.Clone(sc.Env)
		u := newUpstream(m, sc)
		m.upstreams = append(m.upstreams, u)
		m.byName[sc.Name] = u
	}
	return m, nil
}

// Run connects every upstream and keeps them connected until ctx ends, then
// closes the sessions, stops the stdio children and returns ctx's error.
// It may be called once.
func (m *Manager) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errors.New("upstream: Run called twice")
	}
	var wg sync.WaitGroup
	for _, u := range m.upstreams {
		wg.Go(func() { u.run(ctx) })
	}
	wg.Wait()
	return ctx.Err()
}

// Tools returns every upstream's tools under their exposed names, in
// configuration order then upstream order, without prices. It takes a
// snapshot under a lock and does no I/O. When two upstreams expose the same
// name, the first configured wins (the other is logged and hidden). The
// caller must not modify the result.
func (m *Manager) Tools() []vend.Item {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.tools
}

// rebuild recomputes the Tools snapshot from the upstreams' lists.
func (m *Manager) rebuild() {
	m.rebuildMu.Lock()
	defer m.rebuildMu.Unlock()
	var all []vend.Item
	seen := map[string]string{}
	for _, u := range m.upstreams {
		for _, t := range u.toolList() {
			if other, dup := seen[t.Name]; dup {
				m.log.Warn("tool name exposed by two upstreams; keeping the first",
					logKeyTool, t.Name, logKeyServer, u.cfg.Name, logKeyKept, other)
				continue
			}
			seen[t.Name] = u.cfg.Name
			all = append(all, t)
		}
	}
	m.mu.Lock()
	m.tools = all
	m.mu.Unlock()
}

// CallTool runs t on its upstream (t.Server, under t.UpstreamName) with args
// and returns the upstream's CallToolResult as JSON. A tool that ran and
// failed is a result with isError true, not an error.
//
// If progressToken and progress are both non-nil, the upstream is asked for
// progress under a token of the Manager's own (callers' tokens may collide)
// and each notifications/progress it sends for the call is passed to
// progress with progressToken put back, until CallTool returns.
//
// Errors: an unknown upstream, an upstream that is down (returned at once,
// without waiting for a reconnect), a transport failure or a JSON-RPC error
// from the upstream all wrap vend.ErrUpstream; the end of ctx is returned
// wrapped as is. Not idempotent: every call runs the tool.
func (m *Manager) CallTool(ctx context.Context, t vend.Item, args json.RawMessage, progressToken json.RawMessage, progress func(params json.RawMessage)) (json.RawMessage, error) {
	u := m.byName[t.Server]
	if u == nil {
		return nil, fmt.Errorf("upstream %q is not configured: %w", t.Server, vend.ErrUpstream)
	}
	return u.call(ctx, t.UpstreamName, args, progressToken, progress)
}

// Status is an upstream's connection state, for health endpoints.
type Status struct {
	Server string
	Up     bool // connected: calls can be made
	// Listed: connected, and its tools (prompts, resources) were listed
	// and published (Config.OnChange returned): a client asking now
	// sees them.
	Listed  bool
	Tools   int
	LastErr string // why it last went down or failed to connect; "" if never
}

// Status returns the state of every upstream, in configuration order.
func (m *Manager) Status() []Status {
	out := make([]Status, 0, len(m.upstreams))
	for _, u := range m.upstreams {
		u.mu.Lock()
		s := Status{Server: u.cfg.Name, Up: u.sess != nil, Listed: u.listed, Tools: len(u.tools)}
		if u.lastErr != nil {
			s.LastErr = u.lastErr.Error()
		}
		u.mu.Unlock()
		out = append(out, s)
	}
	return out
}

// toVendTools converts an upstream's tool list to exposed vend.Tools.
func toVendTools(sc ServerConfig, tools []mcp.Tool) []vend.Item {
	out := make([]vend.Item, 0, len(tools))
	for _, t := range tools {
		schema := t.RawInputSchema
		if schema == nil {
			b, err := json.Marshal(t.InputSchema)
			if err == nil {
				schema = b
			}
		}
		var ann json.RawMessage
		if t.Annotations != (mcp.ToolAnnotation{}) {
			if b, err := json.Marshal(t.Annotations); err == nil {
				ann = b
			}
		}
		title := t.Title
		if title == "" {
			title = t.Annotations.Title
		}
		out = append(out, vend.Item{
			Name:         sc.Prefix + t.Name,
			Server:       sc.Name,
			UpstreamName: t.Name,
			Title:        title,
			Description:  t.Description,
			InputSchema:  schema,
			Annotations:  ann,
			// Idempotent stays false: upstream hints are not trusted
			// with money; the price book decides.
		})
	}
	return out
}

// isTransportErr reports whether err means the connection to the upstream
// is broken (as opposed to a JSON-RPC error answer).
func isTransportErr(err error) bool {
	var te *transport.Error
	return errors.As(err, &te)
}
