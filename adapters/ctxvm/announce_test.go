package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// priceVendor is fakeVendor with tools and prices that change.
type priceVendor struct {
	fakeVendor
	tmu   sync.Mutex
	tools []vend.Item
}

func newPriceVendor() *priceVendor { return &priceVendor{tools: slices.Clone(fakeTools)} }

func (p *priceVendor) Tools() []vend.Item {
	p.tmu.Lock()
	defer p.tmu.Unlock()
	return slices.Clone(p.tools)
}

func (p *priceVendor) setPrice(name string, m vend.Msat) {
	p.tmu.Lock()
	defer p.tmu.Unlock()
	for i := range p.tools {
		if p.tools[i].Name == name {
			p.tools[i].Price = m
		}
	}
}

func (p *priceVendor) remove(name string) {
	p.tmu.Lock()
	defer p.tmu.Unlock()
	p.tools = slices.DeleteFunc(p.tools, func(t vend.Item) bool { return t.Name == name })
}

// listCatalog lists what it holds (for announcements); it serves nothing.
type listCatalog struct {
	mu        sync.Mutex
	prompts   []vend.Prompt
	resources []vend.Resource
	templates []vend.ResourceTemplate
}

func newListCatalog() *listCatalog {
	return &listCatalog{
		prompts: []vend.Prompt{{Name: "review", Definition: json.RawMessage(`{"name":"upstream_review","description":"review code","arguments":[{"name":"code","required":true}]}`)}},
		resources: []vend.Resource{{URI: "file:///readme.md", Definition: json.RawMessage(`{"uri":"file:///x","name":"readme.md","mimeType":"text/markdown"}`)},
			{URI: "file:///bad", Definition: json.RawMessage(`[1]`)}},
		templates: []vend.ResourceTemplate{{URITemplate: "file:///{path}", Definition: json.RawMessage(`{"name":"Project Files"}`)}},
	}
}

func (c *listCatalog) Prompts() []vend.Prompt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.prompts)
}

func (c *listCatalog) Resources() []vend.Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.resources)
}

func (c *listCatalog) ResourceTemplates() []vend.ResourceTemplate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.templates)
}

func (c *listCatalog) GetPrompt(context.Context, string, map[string]string) (json.RawMessage, error) {
	return nil, errors.New("not served")
}

func (c *listCatalog) ReadResource(context.Context, string) (json.RawMessage, error) {
	return nil, errors.New("not served")
}

func (c *listCatalog) addPrompt(p vend.Prompt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prompts = append(c.prompts, p)
}

// numAnnouncements is how many announcements a server with a Catalog
// publishes: every address of AnnouncementAddresses.
var numAnnouncements = len(AnnouncementAddresses(strings.Repeat("0", 64)))

// published records what a Server publishes; fail, when set, decides
// which publications fail.
type published struct {
	mu   sync.Mutex
	evs  []nostr.Event
	fail func(nostr.Event) error
}

func (p *published) publish(_ context.Context, ev nostr.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		if err := p.fail(ev); err != nil {
			return err
		}
	}
	p.evs = append(p.evs, ev)
	return nil
}

func (p *published) all() []nostr.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.evs)
}

// announceRecorder is a Server announcing to a recorder (its relay is
// unreachable) and the channel of its rounds' failure counts.
func announceRecorder(t *testing.T, v Vendor, mod func(*Config)) (*Server, *published, chan int) {
	t.Helper()
	cfg := Config{Vendor: v, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{"ws://127.0.0.1:1"}, Logger: quietLog(),
		Name: "test server", Announce: true, AnnounceDelay: 10 * time.Millisecond, ShutdownGrace: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &published{}
	s.publish = p.publish
	rounds := make(chan int, 100)
	s.ann.roundDone = func(failed int) { rounds <- failed }
	return s, p, rounds
}

// runServer runs s until the test ends.
func runServer(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a deadlock guard
			t.Error("Run did not return")
		}
	})
}

// nextRound waits for the next announcement round and returns its
// failure count.
func nextRound(t *testing.T, rounds chan int) int {
	t.Helper()
	select {
	case f := <-rounds:
		return f
	case <-time.After(30 * time.Second): // a deadlock guard
		t.Fatal("no announcement round")
	}
	return 0
}

// addressOf is the Address an announcement event fills.
func addressOf(ev nostr.Event) Address {
	a := Address{Kind: ev.Kind}
	if nostr.IsAddressableKind(ev.Kind) {
		if d := ev.Tags.Find("d"); d != nil {
			a.D = d[1]
		}
	}
	return a
}

func addresses(evs []nostr.Event) []Address {
	out := make([]Address, 0, len(evs))
	for _, ev := range evs {
		out = append(out, addressOf(ev))
	}
	slices.SortFunc(out, func(a, b Address) int {
		if a.Kind != b.Kind {
			return a.Kind - b.Kind
		}
		return strings.Compare(a.D, b.D)
	})
	return out
}

// queryAnnouncements returns the announcements of pubkey the relay holds
// once there are want of them (or fails the test after a while).
func queryAnnouncements(t *testing.T, relay, pubkey string, want int) []nostr.Event {
	t.Helper()
	r, err := nostr.RelayConnect(context.Background(), relay)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var kinds []int
	for _, a := range AnnouncementAddresses(pubkey) {
		kinds = append(kinds, a.Kind)
	}
	deadline := time.Now().Add(30 * time.Second) // a deadlock guard
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		evs, err := r.QuerySync(ctx, nostr.Filter{Authors: []string{pubkey}, Kinds: kinds})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == want {
			out := make([]nostr.Event, len(evs))
			for i, ev := range evs {
				out[i] = *ev
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay holds %d announcements, want %d", len(evs), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAnnounceAtStart(t *testing.T) {
	relay := testkit.Relay(t)
	s := startServer(t, relay, &fakeVendor{}, func(c *Config) {
		c.Announce = true
		c.Catalog = newListCatalog()
		c.Website = "https://example.com"
	})
	evs := queryAnnouncements(t, relay, s.PublicKey(), numAnnouncements)
	want := AnnouncementAddresses(s.PublicKey())
	if got := addresses(evs); !slices.Equal(got, addresses(evsOf(want))) {
		t.Fatalf("announced %v, want %v", got, want)
	}
	by := map[Address]nostr.Event{}
	for _, ev := range evs {
		if ok, _ := ev.CheckSignature(); !ok || ev.PubKey != s.PublicKey() {
			t.Fatalf("badly signed %v", ev)
		}
		by[addressOf(ev)] = ev
	}
	pk := s.PublicKey()
	for _, tc := range []struct {
		addr Address
		tags [][]string // must be there
		not  []string   // tag names that must not
		has  string     // in the content
	}{
		{Address{KindAnnounceServer, ""}, [][]string{{"name", "test server"}, {"about", "sells echoes"}, {"website", "https://example.com"},
			{"support_encryption"}, {"pmi", vend.PMILightning}, {"cap", "tool:paid", "21", "sats"}, {"cap", "tool:gated", "5", "sats"}},
			[]string{"d"}, `"serverInfo":{"name":"test server","version":"dev"}`},
		{Address{KindAnnounceTools, ""}, [][]string{{"cap", "tool:paid", "21", "sats"}, {"cap", "tool:gated", "5", "sats"}}, []string{"d", "name"}, `{"tools":[{"name":"free"`},
		{Address{KindAnnounceResources, ""}, nil, []string{"cap", "d"}, `{"resources":[{"mimeType":"text/markdown","name":"readme.md","uri":"file:///readme.md"}]}`},
		{Address{KindAnnounceResourceTemplates, ""}, nil, []string{"cap", "d"}, `{"resourceTemplates":[{"name":"Project Files","uriTemplate":"file:///{path}"}]}`},
		{Address{KindAnnouncePrompts, ""}, nil, []string{"cap", "d"}, `"name":"review"`},
		{Address{KindRelayList, ""}, [][]string{{"r", relay}}, []string{"d"}, ""},
		{Address{KindDVMCPAnnounceServer, pk}, [][]string{{"d", pk}, {"k", "25910"}, {"name", "test server"}, {"support_encryption", "true"}}, []string{"s", "cap"}, `"protocolVersion"`},
		{Address{KindDVMCPAnnounceTools, pk + "/tools/list"}, [][]string{{"d", pk + "/tools/list"}, {"s", pk}, {"cap", "free"}, {"cap", "paid", "21", "sats"}, {"cap", "gated", "5", "sats"}}, []string{"k"}, `{"tools":[`},
		{Address{KindDVMCPAnnounceResources, pk + "/resources/list"}, [][]string{{"s", pk}, {"cap", "readme.md"}}, nil, `{"resources":[`},
		{Address{KindDVMCPAnnounceResources, pk + "/resources/templates/list"}, [][]string{{"s", pk}, {"cap", "Project Files"}}, nil, `{"resourceTemplates":[`},
		{Address{KindDVMCPAnnouncePrompts, pk + "/prompts/list"}, [][]string{{"s", pk}, {"cap", "review"}}, nil, `{"prompts":[`},
		{Address{KindHandlerInfo, pk}, [][]string{{"d", pk}, {"k", "5910"}, {"capabilities", "mcp-1.0"}, {"t", "mcp"}, {"t", "free"}, {"t", "paid"}, {"t", "gated"}}, nil, `"name":"test server","about":"sells echoes","tools":[{"name":"free"`},
	} {
		ev := by[tc.addr]
		for _, want := range tc.tags {
			if !hasTag(ev.Tags, want...) {
				t.Errorf("%v lacks tag %v: %v", tc.addr, want, ev.Tags)
			}
		}
		for _, name := range tc.not {
			if ev.Tags.Find(name) != nil {
				t.Errorf("%v has a %s tag: %v", tc.addr, name, ev.Tags)
			}
		}
		if !strings.Contains(ev.Content, tc.has) || (tc.has != "" && !json.Valid([]byte(ev.Content))) {
			t.Errorf("%v content %s lacks %s", tc.addr, ev.Content, tc.has)
		}
	}
	if n := len(slices.Collect(by[Address{KindDVMCPAnnounceTools, pk + "/tools/list"}].Tags.FindAll("cap"))); n != 3 {
		t.Errorf("31317 has %d cap tags, want one per tool", n)
	}
	if n := len(slices.Collect(by[Address{KindAnnounceTools, ""}].Tags.FindAll("cap"))); n != 2 {
		t.Errorf("11317 has %d cap tags, want one per priced tool", n)
	}
	// The tools list is what tools/list answers.
	res, _ := s.listTools()
	if got := by[Address{KindAnnounceTools, ""}].Content; got != string(res) {
		t.Errorf("11317 content %s, tools/list %s", got, res)
	}
}

// evsOf turns addresses into bare events (for addresses()).
func evsOf(as []Address) []nostr.Event {
	out := make([]nostr.Event, 0, len(as))
	for _, a := range as {
		ev := nostr.Event{Kind: a.Kind}
		if a.D != "" {
			ev.Tags = nostr.Tags{{"d", a.D}}
		}
		out = append(out, ev)
	}
	return out
}

// A Refresh republishes what changed and only that; Refreshes are
// coalesced; an unchanged Refresh publishes nothing.
func TestAnnounceRefresh(t *testing.T) {
	v := newPriceVendor()
	cat := newListCatalog()
	s, pub, rounds := announceRecorder(t, v, func(c *Config) { c.Catalog = cat; c.AnnounceDelay = 50 * time.Millisecond })
	// Refreshes pending when a round ends (on the loop's goroutine: the
	// test makes none then).
	pending := make(chan int, 100)
	s.ann.roundDone = func(failed int) { pending <- len(s.ann.kick); rounds <- failed }
	runServer(t, s)
	if f := nextRound(t, rounds); f != 0 {
		t.Fatalf("%d failed", f)
	}
	<-pending
	if got := addresses(pub.all()); !slices.Equal(got, addresses(evsOf(AnnouncementAddresses(s.PublicKey())))) {
		t.Fatalf("announced %v", got)
	}
	pk := s.PublicKey()
	step := func(name string, change func(), want ...Address) {
		t.Helper()
		before := len(pub.all())
		change()
		for range 5 {
			s.Refresh() // coalesced into one round
		}
		nextRound(t, rounds)
		if n := <-pending; n != 0 {
			t.Errorf("%s: %d refresh pending after the round: not coalesced", name, n)
		}
		got := pub.all()[before:]
		if !slices.Equal(addresses(got), addresses(evsOf(want))) {
			t.Errorf("%s: republished %v, want %v", name, addresses(got), want)
		}
		for _, ev := range got {
			if prev := last(pub.all()[:before], addressOf(ev)); prev != nil && ev.CreatedAt <= prev.CreatedAt {
				t.Errorf("%s: %v not newer than what it replaces", name, addressOf(ev))
			}
		}
	}
	toolKinds := []Address{{KindAnnounceServer, ""}, {KindAnnounceTools, ""}, {KindDVMCPAnnounceTools, pk + "/tools/list"}, {KindHandlerInfo, pk}}
	step("price", func() { v.setPrice("paid", 42_000) }, toolKinds...)
	if ev := last(pub.all(), Address{KindDVMCPAnnounceTools, pk + "/tools/list"}); !hasTag(ev.Tags, "cap", "paid", "42", "sats") {
		t.Errorf("new price not announced: %v", ev.Tags)
	}
	step("nothing", func() {})
	step("prompt", func() { cat.addPrompt(vend.Prompt{Name: "new"}) }, Address{KindAnnouncePrompts, ""}, Address{KindDVMCPAnnouncePrompts, pk + "/prompts/list"})
	step("tool removed", func() { v.remove("gated") }, toolKinds...)
	if ev := last(pub.all(), Address{KindAnnounceTools, ""}); strings.Contains(ev.Content, "gated") || hasTag(ev.Tags, "cap", "tool:gated", "5", "sats") {
		t.Errorf("removed tool still announced: %s %v", ev.Content, ev.Tags)
	}
}

// last is the last event of evs at a (nil if none).
func last(evs []nostr.Event, a Address) *nostr.Event {
	for i := len(evs) - 1; i >= 0; i-- {
		if addressOf(evs[i]) == a {
			return &evs[i]
		}
	}
	return nil
}

// A failed publication is retried after a backoff; what succeeded is not
// published again.
func TestAnnounceRetry(t *testing.T) {
	s, pub, rounds := announceRecorder(t, &fakeVendor{}, nil)
	s.ann.retry = 10 * time.Millisecond
	fails := 2
	pub.fail = func(ev nostr.Event) error {
		if ev.Kind == KindAnnounceTools && fails > 0 {
			fails--
			return errors.New("blocked: no")
		}
		return nil
	}
	runServer(t, s)
	for _, want := range []int{1, 1, 0} {
		if f := nextRound(t, rounds); f != want {
			t.Fatalf("round failed %d, want %d", f, want)
		}
	}
	// No Catalog: no resource or prompt lists.
	want := []Address{{KindAnnounceServer, ""}, {KindAnnounceTools, ""}, {KindRelayList, ""}, {KindDVMCPAnnounceServer, s.PublicKey()},
		{KindDVMCPAnnounceTools, s.PublicKey() + "/tools/list"}, {KindHandlerInfo, s.PublicKey()}}
	if got := addresses(pub.all()); !slices.Equal(got, addresses(evsOf(want))) {
		t.Fatalf("published %v, want each of %v once", got, want)
	}
}

// A relay refusing announcements neither blocks the server nor the other
// relays; Refresh never blocks.
func TestAnnounceRelayRefuses(t *testing.T) {
	refusing := testkit.NewRelay()
	refusing.RejectEvent = append(refusing.RejectEvent, func(_ context.Context, ev *nostr.Event) (bool, string) {
		return ev.Kind != KindMessage, "blocked: no announcements here"
	})
	bad := testkit.ServeRelay(t, refusing)
	good := testkit.Relay(t)

	t.Run("other relay", func(t *testing.T) {
		s := startServer(t, bad, &fakeVendor{}, func(c *Config) { c.Announce = true; c.Relays = []string{bad, good} })
		queryAnnouncements(t, good, s.PublicKey(), 6)
	})
	t.Run("only relay", func(t *testing.T) {
		cfg := Config{Vendor: &fakeVendor{}, SecretKey: nostr.GeneratePrivateKey(), Relays: []string{bad}, Logger: quietLog(),
			Announce: true, AnnounceDelay: time.Millisecond, ShutdownGrace: time.Second}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.ann.retry = 10 * time.Millisecond
		rounds := make(chan int, 100)
		s.ann.roundDone = func(f int) { rounds <- f }
		runServer(t, s)
		for range 2 { // failed, then retried and failed again
			if f := nextRound(t, rounds); f != 6 {
				t.Fatalf("round failed %d, want 6", f)
			}
		}
		for range 100 {
			s.Refresh()
		}
		<-s.Ready()
		c := newClient(t, bad, s.PublicKey())
		req := c.send(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		if r, ev := c.expect(req); string(r.Result) != "{}" {
			t.Fatalf("ping answer %s", ev.Content)
		}
	})
}

func TestRefreshWithoutAnnounce(t *testing.T) {
	s, _ := recorder(t, nil)
	for range 100 {
		s.Refresh() // must not block with no loop reading
	}
}

func TestUnannounce(t *testing.T) {
	relay := testkit.Relay(t)
	sk := nostr.GeneratePrivateKey()
	s := startServer(t, relay, &fakeVendor{}, func(c *Config) { c.Announce = true; c.Catalog = newListCatalog(); c.SecretKey = sk })
	pk := s.PublicKey()
	evs := queryAnnouncements(t, relay, pk, numAnnouncements)

	res, err := Unannounce(context.Background(), sk, []string{relay}, "gone", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Accepted, []string{relay}) || res.Found != numAnnouncements {
		t.Errorf("accepted by %v, found %d", res.Accepted, res.Found)
	}
	ev := res.Event
	if ev.Kind != KindDeletion || ev.PubKey != pk || ev.Content != "gone" {
		t.Errorf("deletion %v", ev)
	}
	var want nostr.Tags
	for _, a := range AnnouncementAddresses(pk) {
		want = append(want, nostr.Tag{"a", a.Coordinate(pk)})
	}
	for _, k := range []string{"11316", "11317", "11318", "11319", "11320", "10002", "31316", "31317", "31318", "31319", "31990"} {
		want = append(want, nostr.Tag{"k", k})
	}
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	slices.Sort(ids)
	for _, id := range ids {
		want = append(want, nostr.Tag{"e", id})
	}
	if !slices.EqualFunc(ev.Tags, want, func(a, b nostr.Tag) bool { return slices.Equal(a, b) }) {
		t.Errorf("tags\n%v\nwant\n%v", ev.Tags, want)
	}
	if want[6][1] != "31316:"+pk+":"+pk || want[0][1] != "11316:"+pk+":" {
		t.Errorf("coordinates %v %v", want[0], want[6])
	}
	// khatru honours NIP-09: nothing is left.
	queryAnnouncements(t, relay, pk, 0)

	t.Run("refused", func(t *testing.T) {
		rl := testkit.NewRelay()
		rl.RejectEvent = append(rl.RejectEvent, func(context.Context, *nostr.Event) (bool, string) { return true, "blocked: no" })
		_, err := Unannounce(context.Background(), sk, []string{testkit.ServeRelay(t, rl)}, "", 10*time.Second)
		if !errors.Is(err, ErrNotAccepted) || !strings.Contains(err.Error(), "blocked: no") {
			t.Fatalf("err %v", err)
		}
	})
}
