package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/vend"
)

// clientName is how capvend introduces itself to upstreams.
const clientName = "capvend"

// stableAfter is how long a session must have stayed up for the next
// reconnect to start again from the minimum delay.
const stableAfter = 10 * time.Second

// upstream is one configured server and its current session.
type upstream struct {
	m   *Manager
	cfg ServerConfig
	log *slog.Logger

	mu      sync.Mutex
	sess    *client.Client // nil while down
	listed  bool           // sess listed its tools (and the fronts were told): see Status.Listed
	tools   []vend.Item    // last known list, kept while down
	lastErr error
	// last known prompts, resources and templates, kept while down
	prompts   []Prompt
	resources []Resource
	templates []ResourceTemplate
	// known are the lists that arrived once (see Manager.Listings).
	known lists

	// progress routes the upstream's notifications/progress to the call
	// that asked for them, by the token the Manager chose.
	progressMu sync.Mutex
	progress   map[string]*progressRoute
	seq        atomic.Uint64

	// calls in flight with their context and ElicitFunc, for
	// elicitations mcp-go cannot tie to a call (see elicit.go).
	callsMu sync.Mutex
	calls   map[uint64]inflightCall

	listChanged      chan struct{} // a tools list_changed arrived: re-list
	promptsChanged   chan struct{} // a prompts list_changed arrived
	resourcesChanged chan struct{} // a resources list_changed arrived
	check            chan struct{} // a call saw a transport error: ping now

	// h1 is the raw forwarder's HTTP/1.1 client (nil: httpClient); see
	// h1Client.
	h1Once sync.Once
	h1     *h1Client
	// plainHeaders holds plainHeader's answers, by protocol version.
	plainHeaders sync.Map
	// demuxes holds the stdio sessions' demuxes (stdiodemux.go), by
	// their mcp-go transport.
	demuxes sync.Map

	// legacyHTTP is set once an HTTP upstream turned out to speak only
	// protocols before 2026-07-28: it is then dialled with a GET stream,
	// the only way such a server sends list_changed. Only run's goroutine
	// touches it.
	legacyHTTP bool
}

// errRedial asks run to dial again at once.
var errRedial = errors.New("upstream speaks a protocol before 2026-07-28: redialling with a GET stream")

// progressRoute is one call's progress forwarding. fn runs under mu and
// never after the call returned (done).
type progressRoute struct {
	callerToken json.RawMessage
	fn          func(json.RawMessage)
	mu          sync.Mutex
	done        bool
}

// addProgressRoute routes the upstream's progress notifications for a call
// to fn, under the caller's progressToken, and returns the token to send
// upstream and a function that ends the route (after which fn is not
// called).
func (u *upstream) addProgressRoute(progressToken json.RawMessage, fn func(json.RawMessage)) (tok string, done func()) {
	tok = "capvend-" + strconv.FormatUint(u.seq.Add(1), 10)
	route := &progressRoute{callerToken: progressToken, fn: fn}
	u.progressMu.Lock()
	u.progress[tok] = route
	u.progressMu.Unlock()
	return tok, func() {
		u.progressMu.Lock()
		delete(u.progress, tok)
		u.progressMu.Unlock()
		route.mu.Lock()
		route.done = true
		route.mu.Unlock()
	}
}

func newUpstream(m *Manager, sc ServerConfig) *upstream {
	return &upstream{
		m:                m,
		cfg:              sc,
		log:              m.log.With(logKeyServer, sc.Name),
		progress:         map[string]*progressRoute{},
		calls:            map[uint64]inflightCall{},
		listChanged:      make(chan struct{}, 1),
		promptsChanged:   make(chan struct{}, 1),
		resourcesChanged: make(chan struct{}, 1),
		check:            make(chan struct{}, 1),
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (u *upstream) toolList() []vend.Item {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tools
}

func (u *upstream) catalogLists() ([]Prompt, []Resource, []ResourceTemplate) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.prompts, u.resources, u.templates
}

// lists is a set of the lists an upstream can offer.
type lists uint8

const (
	listTools lists = 1 << iota
	listPrompts
	listResources
	listAll = listTools | listPrompts | listResources
)

// offered returns the lists caps advertises, and those it says it sends
// list_changed for.
func offered(caps mcp.ServerCapabilities) (have, changes lists) {
	if caps.Tools != nil {
		have |= listTools
		if caps.Tools.ListChanged {
			changes |= listTools
		}
	}
	if caps.Prompts != nil {
		have |= listPrompts
		if caps.Prompts.ListChanged {
			changes |= listPrompts
		}
	}
	if caps.Resources != nil {
		have |= listResources
		if caps.Resources.ListChanged {
			changes |= listResources
		}
	}
	return have, changes
}

// run keeps the upstream connected until ctx ends.
func (u *upstream) run(ctx context.Context) {
	defer func() {
		if h := u.h1Client(); h != nil {
			h.close()
		}
	}()
	backoff := u.m.cfg.MinBackoff
	for ctx.Err() == nil {
		start := time.Now()
		wasUp, err := u.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRedial) {
			u.log.Info("upstream is pre-2026-07-28; reconnecting with a GET stream")
			continue
		}
		u.mu.Lock()
		u.lastErr = err
		u.mu.Unlock()
		if wasUp && time.Since(start) >= stableAfter {
			backoff = u.m.cfg.MinBackoff
		}
		u.log.Warn("upstream unavailable", logKeyErr, err, logKeyDelay, backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, u.m.cfg.MaxBackoff)
	}
}

// session connects once, serves until the connection is lost or ctx ends,
// and tears the connection down. wasUp says whether it got as far as
// listing tools.
func (u *upstream) session(ctx context.Context) (wasUp bool, err error) {
	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel below
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	c, exited, stop, err := u.dial(sctx)
	if err != nil {
		return false, err
	}
	defer stop()

	c.OnNotification(u.onNotification)
	cctx, ccancel := context.WithTimeout(sctx, u.m.cfg.ConnectTimeout)
	defer ccancel()
	if err := c.Start(sctx); err != nil {
		return false, fmt.Errorf("start: %w", err)
	}
	init, err := c.Initialize(cctx, mcp.InitializeRequest{Params: mcp.InitializeParams{
		ClientInfo: mcp.Implementation{Name: clientName, Version: "1"},
	}})
	if err != nil {
		return false, fmt.Errorf("initialize: %w", err)
	}
	if u.cfg.URL != "" && !u.legacyHTTP && !mcp.IsModernProtocol(c.ProtocolVersion()) {
		u.legacyHTTP = true
		return false, errRedial
	}
	have, changes := offered(init.Capabilities)
	if have == 0 {
		return false, errors.New("upstream offers no tools, prompts or resources")
	}
	// The session is usable before the lists are published (OnChange),
	// so that a client that sees them can use them at once.
	u.mu.Lock()
	u.sess = c
	u.mu.Unlock()
	if err := u.relist(cctx, c, listAll, have); err != nil {
		u.mu.Lock()
		u.sess = nil
		u.mu.Unlock()
		return false, err
	}
	ccancel()

	u.mu.Lock()
	u.lastErr = nil
	u.listed = true // after relist's OnChange: the fronts offer the tools now
	u.mu.Unlock()
	u.log.Info("upstream connected", logKeyProto, c.ProtocolVersion(), logKeyTools, len(u.toolList()))
	u.state(true, nil)
	defer func() {
		u.mu.Lock()
		u.sess, u.listed = nil, false
		u.mu.Unlock()
		u.state(false, err)
	}()

	// With protocol 2026-07-28 an upstream sends list_changed only on a
	// subscriptions/listen stream; its end also tells us an HTTP upstream
	// went away. Before that protocol, notifications come unasked.
	lost := make(chan error, 1)
	if mcp.IsModernProtocol(c.ProtocolVersion()) && changes != 0 {
		filter := mcp.SubscriptionFilter{
			ToolsListChanged:     changes&listTools != 0,
			PromptsListChanged:   changes&listPrompts != 0,
			ResourcesListChanged: changes&listResources != 0,
		}
		wg.Go(func() {
			err := c.Listen(sctx, filter)
			if sctx.Err() != nil {
				return
			}
			if err == nil || isTransportErr(err) {
				lost <- fmt.Errorf("listen stream ended: %v", err)
				return
			}
			u.log.Warn("upstream refused subscriptions/listen; relying on pings", logKeyErr, err)
		})
	}

	ping := time.NewTicker(u.m.cfg.PingInterval)
	defer ping.Stop()
	for {
		var which lists
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case err := <-exited:
			return true, fmt.Errorf("child exited: %v", err)
		case err := <-lost:
			return true, err
		case <-u.listChanged:
			which = listTools
		case <-u.promptsChanged:
			which = listPrompts
		case <-u.resourcesChanged:
			which = listResources
		case <-ping.C:
		case <-u.check:
		}
		if which != 0 {
			lctx, lcancel := context.WithTimeout(sctx, u.m.cfg.ConnectTimeout)
			err := u.relist(lctx, c, which, have)
			lcancel()
			if err != nil {
				if isTransportErr(err) {
					return true, err
				}
				u.log.Warn("re-listing failed", logKeyErr, err)
			}
		}
		if err := u.ping(sctx, c); err != nil {
			return true, err
		}
	}
}

func (u *upstream) ping(ctx context.Context, c *client.Client) error {
	pctx, cancel := context.WithTimeout(ctx, u.m.cfg.ConnectTimeout)
	defer cancel()
	//lint:ignore SA1019 a legacy (pre-2026-07-28) upstream answers ping; on a modern one Ping sends nothing
	if err := c.Ping(pctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

func (u *upstream) state(up bool, err error) {
	if f := u.m.cfg.OnState; f != nil {
		f(u.cfg.Name, up, err)
	}
}

// relist fetches the lists in which (those not in have are emptied) and
// publishes those that changed, then calls OnChange once if any did. A
// tools/list failure is returned; a prompts or resources listing failure
// is returned only if the transport broke, else logged, keeping the last
// known list (an upstream with broken prompts still sells its tools).
func (u *upstream) relist(ctx context.Context, c *client.Client, which, have lists) error {
	var (
		tools     []vend.Item
		prompts   []Prompt
		resources []Resource
		templates []ResourceTemplate
		got       lists // lists fetched (or emptied) to publish
	)
	if which&listTools != 0 {
		got |= listTools
		if have&listTools != 0 {
			res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
			if err != nil {
				return fmt.Errorf("tools/list: %w", err)
			}
			tools = toVendTools(u.cfg, res.Tools)
		}
	}
	if which&listPrompts != 0 {
		var err error
		if have&listPrompts != 0 {
			prompts, err = fetchPrompts(ctx, c, u.cfg)
		}
		switch {
		case err == nil:
			got |= listPrompts
		case isTransportErr(err):
			return err
		default:
			u.log.Warn("listing prompts failed; keeping the last list", logKeyErr, err)
		}
	}
	if which&listResources != 0 {
		var err error
		if have&listResources != 0 {
			resources, templates, err = fetchResources(ctx, c, u.cfg)
		}
		switch {
		case err == nil:
			got |= listResources
		case isTransportErr(err):
			return err
		default:
			u.log.Warn("listing resources failed; keeping the last list", logKeyErr, err)
		}
	}

	u.mu.Lock()
	u.known |= got
	var changed lists
	if got&listTools != 0 && !sameTools(u.tools, tools) {
		u.tools = tools
		changed |= listTools
	}
	if got&listPrompts != 0 && !sameJSON(u.prompts, prompts) {
		u.prompts = prompts
		changed |= listPrompts
	}
	if got&listResources != 0 && (!sameJSON(u.resources, resources) || !sameJSON(u.templates, templates)) {
		u.resources, u.templates = resources, templates
		changed |= listResources
	}
	u.mu.Unlock()
	if changed == 0 {
		return nil
	}
	if changed&listTools != 0 {
		u.m.rebuild()
		u.log.Info("upstream tools changed", logKeyTools, len(tools))
	}
	if changed&(listPrompts|listResources) != 0 {
		u.m.rebuildCatalog()
		p, r, t := u.catalogLists()
		u.log.Info("upstream prompts or resources changed", logKeyPrompts, len(p), logKeyRes, len(r), logKeyTemplate, len(t))
	}
	if f := u.m.cfg.OnChange; f != nil {
		f()
	}
	return nil
}

func sameTools(a, b []vend.Item) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// onNotification runs on the transport's read loop: it must not do I/O on
// the session (a request from here would deadlock a stdio transport).
func (u *upstream) onNotification(n mcp.JSONRPCNotification) {
	switch n.Method {
	case string(mcp.MethodNotificationToolsListChanged):
		signal(u.listChanged)
	case string(mcp.MethodNotificationPromptsListChanged):
		signal(u.promptsChanged)
	case string(mcp.MethodNotificationResourcesListChanged):
		signal(u.resourcesChanged)
	case vend.NotifyProgress:
		u.routeProgress(n)
	}
}

func (u *upstream) routeProgress(n mcp.JSONRPCNotification) {
	raw, err := json.Marshal(n.Params)
	if err != nil {
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return
	}
	var tok string
	if err := json.Unmarshal(fields["progressToken"], &tok); err != nil {
		return // not one of ours: ours are strings
	}
	u.progressMu.Lock()
	route, ok := u.progress[tok]
	u.progressMu.Unlock()
	if !ok {
		return
	}
	fields["progressToken"] = route.callerToken
	out, err := json.Marshal(fields)
	if err != nil {
		return
	}
	route.mu.Lock()
	defer route.mu.Unlock()
	if !route.done {
		route.fn(out)
	}
}

// call forwards one tools/call.
func (u *upstream) call(ctx context.Context, name string, args, progressToken json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	u.mu.Lock()
	c := u.sess
	u.mu.Unlock()
	if c == nil {
		return nil, fmt.Errorf("upstream %q is down: %w", u.cfg.Name, vend.ErrUpstream)
	}
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	if progress != nil && len(progressToken) > 0 {
		tok, done := u.addProgressRoute(progressToken, progress)
		defer done()
		req.Params.Meta = &mcp.Meta{ProgressToken: tok}
	}
	req.Params.Meta = u.withClientPubkey(ctx, req.Params.Meta)
	defer u.inflight(ctx)()
	res, err := c.CallTool(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("upstream %q: call %q: %w", u.cfg.Name, name, ctx.Err())
		}
		if isTransportErr(err) {
			signal(u.check)
		}
		return nil, fmt.Errorf("upstream %q: call %q: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	return u.resultBody(name, res)
}

// resultBody is the JSON of an upstream's CallToolResult as CallTool
// returns it (callRaw too).
func (u *upstream) resultBody(name string, res *mcp.CallToolResult) (json.RawMessage, error) {
	// The protocol's decorations belong to the hop, not to the result:
	// the front adds its own.
	res.ResultType = ""
	if res.Meta != nil {
		delete(res.Meta.AdditionalFields, mcp.MetaKeyServerInfo)
		if res.Meta.ProgressToken == nil && len(res.Meta.AdditionalFields) == 0 {
			res.Meta = nil
		}
	}
	body, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: call %q: encode result: %w: %w", u.cfg.Name, name, vend.ErrUpstream, err)
	}
	return body, nil
}

// dial opens a transport and returns a client on it (not started), a
// channel that receives when a stdio child exits (nil for HTTP), and a
// function closing everything, bounded by StopTimeout.
func (u *upstream) dial(ctx context.Context) (*client.Client, <-chan error, func(), error) {
	if u.cfg.URL != "" {
		opts := []transport.StreamableHTTPCOption{
			transport.WithHTTPBasicClient(httpClient),
			transport.WithHTTPHeaders(u.cfg.Headers),
			transport.WithHTTPLogger(u.log),
		}
		if u.legacyHTTP {
			//lint:ignore SA1019 a legacy upstream sends its notifications on the standalone GET stream
			opts = append(opts, transport.WithContinuousListening())
		}
		tr, err := transport.NewStreamableHTTP(u.cfg.URL, opts...)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("http transport: %w", err)
		}
		c := client.NewClient(tr, client.WithElicitationHandler(elicitHandler{u}))
		return c, nil, func() { _ = c.Close() }, nil
	}

	// The child is started here, not by mcp-go's stdio transport, so that
	// capvend owns its Wait and learns at once when it dies.
	cmd := exec.Command(u.cfg.Command, u.cfg.Args...)
	cmd.Dir = u.cfg.Dir
	cmd.Env = childEnv(os.Getenv, u.cfg.Env)
	cmd.Stderr = &logWriter{log: u.log}
	cmd.WaitDelay = u.m.cfg.StopTimeout
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("stdin pipe: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("start %s: %w", u.cfg.Command, err)
	}
	waited := make(chan struct{})
	var waitErr error
	exited := make(chan error, 1)
	go func() {
		waitErr = cmd.Wait()
		close(waited)
		exited <- waitErr
	}()
	demux, out := newStdioDemux(stdout, stdin) // see stdiodemux.go
	go demux.run()
	tr := transport.NewIO(out, demux.stdin, nil)
	u.demuxes.Store(tr, demux)
	c := client.NewClient(tr, client.WithElicitationHandler(elicitHandler{u}))
	stop := func() {
		_ = c.Close() // closes stdin: a well-behaved server exits on EOF
		demux.close()
		t := time.NewTimer(u.m.cfg.StopTimeout)
		defer t.Stop()
		select {
		case <-waited:
		case <-t.C:
			_ = cmd.Process.Kill()
			<-waited
		}
		<-demux.done // Wait closed stdout
		u.demuxes.Delete(tr)
	}
	return c, exited, stop, nil
}

// logWriter logs a child's stderr line by line at debug level.
type logWriter struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.log.Debug("upstream stderr", logKeyLine, string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 4096 { // a runaway line: log what we have
		w.log.Debug("upstream stderr", logKeyLine, string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)

// inheritedEnv are the only variables of capvend's own environment a stdio
// upstream gets: capvend's environment holds its secrets' paths and
// whatever its operator exported, which an upstream (someone else's code,
// maybe) has no business reading.
var inheritedEnv = []string{"PATH", "HOME"}

// childEnv is the environment of a stdio upstream: PATH and HOME from
// capvend's (getenv), then the configured "KEY=value" pairs, which win.
func childEnv(getenv func(string) string, configured []string) []string {
	env := make([]string, 0, len(inheritedEnv)+len(configured))
	for _, k := range inheritedEnv {
		if v := getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return append(env, configured...)
}
