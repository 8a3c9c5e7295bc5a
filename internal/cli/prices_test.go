package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/internal/capvendtest"
	"github.com/capvend/capvend/pricing"
)

// pricedToolsConfig is capvendtest.FreeToolsConfig with the price sections items
// (YAML under the upstream, indented four spaces) and a stand-in mint as
// the payment backend.
func pricedToolsConfig(t testing.TB, items string) (path, listen string) {
	t.Helper()
	path, listen = capvendtest.FreeToolsConfig(t, "")
	wallet := filepath.Join(filepath.Dir(path), "cashu-wallet")
	if err := os.Mkdir(wallet, 0o700); err != nil {
		t.Fatal(err)
	}
	capvendtest.EditConfig(t, path, "", items+fmt.Sprintf("cashu:\n  mints: [%s]\n  wallet_dir: cashu-wallet\n", capvendtest.StandInMint(t, 0)))
	return path, listen
}

// A price that names no tool, prompt or resource its upstream lists (a
// typo, or renamed upstream) stops serve once the upstream's lists
// arrive, naming it: the item it meant would otherwise be sold free.
func TestServeStopsWhenAPriceNamesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, items, want string }{
		{"tool", "    tools:\n      sha256: {price_sats: 2}\n      sha265: {price_sats: 21}\n", "tools.sha265"},
		{"prompt", "    prompts:\n      summarise: {price_sats: 3}\n", "prompts.summarise"},
		{"resource", "    resources:\n      \"example://readme.md\": {price_sats: 1}\n", "resources.example://readme.md"},
		{"resource under another scheme", "    resources:\n      \"other://{name}\": {price_sats: 1}\n      \"exmple://readme\": {price_sats: 1}\n", "resources.exmple://readme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path, _ := pricedToolsConfig(t, tc.items)
			sv := startCapvend(t, path, capvendtest.Options{NoWait: true})
			code, out := sv.Wait(), sv.Logs()
			if code == 0 || !strings.Contains(out, tc.want) {
				t.Fatalf("serve with the price %s, which names nothing upstream: exit %d, want it to stop naming it; output:\n%s", tc.want, code, out)
			}
		})
	}
}

// SIGHUP with a price that names nothing upstream is refused like any
// invalid configuration: the old prices stay, the error names it.
func TestSIGHUPRefusesAPriceNamingNothing(t *testing.T) {
	t.Parallel()
	path, _ := pricedToolsConfig(t, "    tools:\n      sha256: {price_sats: 2}\n")
	sv := startCapvend(t, path, capvendtest.Options{Process: true})
	sv.Await("upstream connected", func() bool { return strings.Contains(sv.Stderr(), "upstream connected") })
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	typo := strings.Replace(string(cfg), "sha256: {price_sats: 2}\n", "sha256: {price_sats: 2}\n      word_cuont: {price_sats: 5}\n", 1)
	if err := os.WriteFile(path, []byte(typo), 0o600); err != nil {
		t.Fatal(err)
	}
	sv.Signal(syscall.SIGHUP)
	sv.Await("the reload's outcome", func() bool {
		l := sv.Stderr()
		return strings.Contains(l, "config reload refused") || strings.Contains(l, "config reloaded")
	})
	if l := sv.Stderr(); !strings.Contains(l, "config reload refused") || !strings.Contains(l, "word_cuont") {
		t.Fatalf("SIGHUP with a price naming no upstream tool: not refused naming it; log:\n%s", l)
	}
}

// With pricing.unpriced: refuse, an item without a price of its own is
// neither listed nor sold: only the items the configuration names are
// (word_count and example://readme, free by an empty price). /readyz
// shows the choice.
func TestUnpricedRefused(t *testing.T) {
	t.Parallel()
	path, listen := capvendtest.FreeToolsConfig(t, "")
	capvendtest.EditConfig(t, path, "", "    tools:\n      word_count: {}\n    resources:\n      \"example://readme\": {}\npricing:\n  unpriced: refuse\n")
	addr := capvendtest.AdminConfig(t, path, "")
	startCapvend(t, path)
	c, err := client.NewStreamableHttpClient("http://" + listen + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "word_count" {
		t.Errorf("tools listed: %v, want only word_count", names)
	}
	for tool, ok := range map[string]bool{"word_count": true, "sha256": false, "slow_count": false} {
		req := mcp.CallToolRequest{}
		req.Params.Name = tool
		req.Params.Arguments = map[string]any{"text": "one two", "n": 1}
		res, err := c.CallTool(ctx, req)
		switch {
		case ok && (err != nil || res.IsError):
			t.Errorf("%s (named, free): %v %v", tool, res, err)
		case !ok && err == nil && !res.IsError:
			t.Errorf("%s (not named: not for sale) ran: %v", tool, res.Content)
		}
	}
	prompts, err := c.ListPrompts(ctx, mcp.ListPromptsRequest{})
	if err != nil || len(prompts.Prompts) != 0 {
		t.Errorf("prompts listed: %v %v, want none", prompts, err)
	}
	gp := mcp.GetPromptRequest{}
	gp.Params.Name, gp.Params.Arguments = "summarize", map[string]string{"text": "x"}
	if res, err := c.GetPrompt(ctx, gp); err == nil {
		t.Errorf("prompts/get summarize (not named): %v", res)
	}
	resources, err := c.ListResources(ctx, mcp.ListResourcesRequest{})
	if err != nil || len(resources.Resources) != 1 || resources.Resources[0].URI != "example://readme" {
		t.Errorf("resources listed: %v %v, want example://readme", resources, err)
	}
	rr := mcp.ReadResourceRequest{}
	rr.Params.URI = "example://readme"
	if _, err := c.ReadResource(ctx, rr); err != nil {
		t.Errorf("resources/read example://readme (named, free): %v", err)
	}
	code, body := capvendtest.Get(t, "http://"+addr+"/readyz", "")
	if code != 200 || !strings.Contains(body, "ok: prices: ") || !strings.Contains(body, "refuse") {
		t.Errorf("readyz does not show that unpriced items are refused: %d\n%s", code, body)
	}
}

// priceCheck: an upstream's first lists are checked fatally; lists
// changing later only make /readyz not ready (and log); a reload whose
// prices name nothing listed is refused, one that fixes them clears it.
func TestPriceCheck(t *testing.T) {
	load := func(tools string) *Config {
		t.Helper()
		y := "cashu:\n  mints: [http://m]\nupstreams:\n  - name: a\n    command: x\n    tools:\n" + tools +
			"  - name: b\n    command: y\n    unpriced: refuse\n"
		c, err := parseConfig("capvend.yaml", []byte(y), func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	book := func(c *Config) *pricing.Book {
		b, err := c.PriceBook()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lists := map[string]pricing.Listing{}
	var mu sync.Mutex
	listings := func() map[string]pricing.Listing {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(lists)
	}
	set := func(server string, tools ...string) {
		mu.Lock()
		lists[server] = pricing.Listing{Tools: tools, ToolsKnown: true}
		mu.Unlock()
	}
	cfg := load("      search: {price_sats: 1}\n")
	pc := newPriceCheck(cfg, book(cfg), listings, slog.New(slog.NewTextHandler(io.Discard, nil)))
	fatal := func() error {
		select {
		case err := <-pc.fatal:
			return err
		default:
			return nil
		}
	}
	if got := pc.info(); !strings.Contains(got, "unpriced items free") || !strings.Contains(got, "refused: neither listed nor sold for upstream b") {
		t.Errorf("info: %q", got)
	}

	set("a", "search", "fetch")
	pc.listed()
	if err := fatal(); err != nil || pc.stopping() || pc.ready(context.Background()) != nil {
		t.Fatalf("first lists naming every price: fatal %v, ready %v", err, pc.ready(context.Background()))
	}
	set("a", "web_search", "fetch") // renamed upstream, later
	pc.listed()
	if err := fatal(); err != nil || pc.stopping() {
		t.Fatalf("a later change stopped serve: %v", err)
	}
	if err := pc.ready(context.Background()); err == nil || !strings.Contains(err.Error(), "upstreams[0].tools.search") {
		t.Fatalf("readyz after the rename: %v", err)
	}
	set("b", "x") // b's first lists: it has no prices
	pc.listed()
	if err := fatal(); err != nil {
		t.Fatalf("b's first lists: %v", err)
	}

	next := load("      search: {price_sats: 1}\n      fetch: {price_sats: 2}\n")
	if err := pc.checkPrices(next, book(next)); err == nil || !strings.Contains(err.Error(), "upstreams[0].tools.search") {
		t.Fatalf("a reload still naming search: %v", err)
	}
	fixed := load("      web_search: {price_sats: 1}\n")
	fb := book(fixed)
	if err := pc.checkPrices(fixed, fb); err != nil {
		t.Fatalf("a reload naming what is listed: %v", err)
	}
	pc.inForce(fb)
	if err := pc.ready(context.Background()); err != nil {
		t.Fatalf("readyz once the prices are fixed: %v", err)
	}

	// An upstream connecting later with a price naming nothing: fatal.
	cfg = load("      search: {price_sats: 1}\n")
	pc = newPriceCheck(cfg, book(cfg), listings, slog.New(slog.NewTextHandler(io.Discard, nil)))
	mu.Lock()
	clear(lists)
	mu.Unlock()
	pc.listed()
	set("a", "web_search")
	pc.listed()
	if err := fatal(); err == nil || !pc.stopping() || !strings.Contains(err.Error(), "upstreams[0].tools.search") {
		t.Fatalf("a's first lists not naming search: %v", err)
	}
}
