package ctxvm

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm/oversized"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// Event kinds.
const (
	KindMessage  = 25910 // a ContextVM JSON-RPC message
	KindGiftWrap = 1059  // a NIP-44 encrypted, signed KindMessage
)

// Transport is vend.CallRequest.Transport of calls arriving here.
const Transport = "nostr-ctxvm"

// Defaults of Config fields left zero.
const (
	DefaultWindow           = 5 * time.Minute
	DefaultMaxContentBytes  = 64 << 10
	DefaultPublishTimeout   = 10 * time.Second
	DefaultShutdownGrace    = 30 * time.Second
	DefaultMaxInFlight      = 1_000
	DefaultFirstAnswerDelay = 200 * time.Millisecond
	DefaultAnnounceDelay    = time.Second
	latestProtocol          = "2025-11-25"
)

// Encryption is the server's encryption policy.
type Encryption string

const (
	EncryptionOptional Encryption = "optional" // answer encrypted iff asked encrypted
	EncryptionRequired Encryption = "required" // refuse plaintext requests
	EncryptionDisabled Encryption = "disabled" // ignore gift wraps
)

// Vendor sells tool calls. vend's engine implements it.
type Vendor interface {
	// Tools returns the exposed tools with their prices.
	Tools() []vend.Item
	// CallItem runs one priced call (a tool call, prompt get or resource read); errors are vend's sentinel and typed
	// errors (anything else is reported as an internal error).
	CallItem(ctx context.Context, r vend.CallRequest) (vend.CallResult, error)
	// ListedPrice returns the least and most a call of t can cost.
	ListedPrice(t vend.Item) (lo, hi vend.Msat)
}

// PayerKnower is what a Vendor may also do: tell whether a client (a
// pubkey) paid for a call before. Such a client's requests still enter
// when MaxInFlight requests are in flight, up to a reserve of a tenth
// more: identities are free on Nostr, a payment history is not.
type PayerKnower interface {
	KnownPayer(client string) bool
}

// Catalog is the free, pass-through part of what the server offers:
// prompts, resources and resource templates (the same contract as
// mcpfront.Catalog).
type Catalog interface {
	// Prompts returns the prompts to list now (not modified by the caller).
	Prompts() []vend.Prompt
	// GetPrompt renders the prompt listed as name with args and returns an
	// MCP GetPromptResult as JSON. Errors wrapping vend.ErrUpstream are
	// answered as such, a *vend.InvalidParamsError as invalid params; any
	// other as an internal error.
	GetPrompt(ctx context.Context, name string, args map[string]string) (json.RawMessage, error)
	// Resources returns the resources to list now (not modified by the caller).
	Resources() []vend.Resource
	// ResourceTemplates returns the resource templates to list now (not
	// modified by the caller).
	ResourceTemplates() []vend.ResourceTemplate
	// ReadResource reads uri and returns an MCP ReadResourceResult as
	// JSON. Errors as for GetPrompt.
	ReadResource(ctx context.Context, uri string) (json.RawMessage, error)
}

// Config configures a Server.
type Config struct {
	Vendor  Vendor
	Catalog Catalog // prompts and resources; nil: none
	// Replies keeps answers for replays (see ReplyStore); nil: a replay of
	// a free call, prompt or resource read after the go-nostr pool
	// forgot its id is served again.
	Replies ReplyStore
	// Claims, when several servers share the secret key (and a ledger),
	// makes each request served by one of them: a server claims the
	// request's event id for Instance before answering it and drops it
	// if another claimed it first. Nil: every request is served (one
	// server).
	Claims vend.RequestClaimer
	// Instance names this server among those sharing Claims (required
	// with Claims).
	Instance string
	// Members, with Claims, shards the requests across the live servers
	// sharing the key: each serves the requests it owns (rendezvous
	// hashing of the request's event id over the member set) and drops
	// the others before checking their signature, writing no claim in
	// steady state; a claim is written only during a membership change.
	// See docs/CONTEXTVM.md, "Several servers, one key". Nil: every server
	// claims every request.
	Members Members
	// ShardSample is how often the member set is read (0:
	// DefaultShardSample); a change is in force after 3 samples, and
	// served without claims after 9.
	ShardSample time.Duration
	// MemberTTL is how long this server's member lease lasts unrenewed
	// (renewed every third of it; 0: DefaultMemberTTL): a dead server's
	// requests are taken over within MemberTTL plus 3 samples.
	MemberTTL time.Duration
	// SeenFor is how long Run drops copies of an event it let in (the
	// same request delivered again by another relay or a client sending
	// it again); 0: one minute. With Claims, a request a dead instance
	// claimed is served when sent again after the claim's takeover time
	// (ledger.Options.ClaimTakeover) and SeenFor: capvend sets both alike.
	SeenFor time.Duration

	SecretKey string   // the server's secret key, 64 hex characters (see LoadSecretKey)
	Relays    []string // ws:// or wss:// URLs; at least one

	Name    string // serverInfo.name and the name tag; "": "capvend"
	Version string // serverInfo.version; "": "dev"
	About   string // discovery tags, omitted when empty
	Website string
	Picture string
	PMIs    []string // payment methods the server takes, advertised in pmi tags

	Encryption Encryption // "": EncryptionOptional
	// Window is how far created_at may be from now. 0: DefaultWindow.
	Window time.Duration
	// MaxContentBytes bounds an event's content (a gift wrap's too).
	// 0: DefaultMaxContentBytes.
	MaxContentBytes int
	// PublishTimeout bounds one publication. 0: DefaultPublishTimeout.
	PublishTimeout time.Duration
	// ShutdownGrace is how long Run lets requests in flight finish after
	// its context ends. 0: DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// FirstAnswerDelay holds the first event to a client not answered
	// before for this long. Relays handle a client's subscription and
	// its first request concurrently (khatru runs each message on its own
	// goroutine), and kind 25910 is ephemeral: an answer published
	// before the client's subscription is in place is lost, and the
	// client waits for nothing. 0: DefaultFirstAnswerDelay; negative:
	// none.
	FirstAnswerDelay time.Duration
	// MaxInFlight bounds the requests being served at once: parsed,
	// quoted, run, answered. A call waiting for its payment holds no
	// slot from its payment_required on (the Vendor bounds those: vend's
	// MaxUnpaidTotal, shedding the oldest), so unpaid quotes cannot
	// starve new requests. Events arriving beyond it are dropped, but
	// those of a client the Vendor knows paid before (see PayerKnower),
	// which have a reserve of a tenth more. 0: DefaultMaxInFlight.
	MaxInFlight int
	// MaxRequestBytes bounds a request that comes as CEP-22 frames (its
	// reassembled JSON-RPC message); 0: DefaultMaxRequestBytes. A client's
	// transfers hold at most twice that at once, 4 of them.
	MaxRequestBytes int
	// MaxReassemblyBytes bounds the bytes of the transfers of all
	// clients being reassembled at once; 0: DefaultMaxReassemblyBytes.
	MaxReassemblyBytes int
	// PowDifficulty is the NIP-13 proof of work (leading zero bits of the
	// request event's id, committed in its nonce tag) required of a
	// request that gets a free call or an unpaid quote; 0: none. See
	// docs/CONTEXTVM.md, Proof of work and load.
	PowDifficulty int

	// slowMain, when set, drops the events of the main subscription it
	// returns true for, as if they were still queued there (tests of the
	// lanes, lanes.go).
	slowMain func(*nostr.Event) bool

	// Announce publishes the announcements (docs/CONTEXTVM.md) at start
	// and after each Refresh that changed them.
	Announce bool
	// Profile, with Announce, publishes the server's CEP-23 profile with
	// the announcements: a kind 0 event whose content is the NIP-01
	// metadata {name, about, picture, website} of the fields above.
	Profile bool
	// AnnounceDelay is how long after a Refresh the announcements are
	// rebuilt (Refreshes meanwhile are coalesced). 0: DefaultAnnounceDelay.
	AnnounceDelay time.Duration
	// ElicitTimeout is how long a ContextVM client has to answer an
	// elicitation (see docs/CONTEXTVM.md, Elicitation).
	// 0: DefaultElicitTimeout.
	ElicitTimeout time.Duration
	// Allow, when not empty, is the only clients (hex pubkeys) served;
	// Deny is clients never served (it wins over Allow). See
	// docs/CONTEXTVM.md, Access lists.
	Allow, Deny []string

	Logger *slog.Logger     // nil: slog.Default()
	Now    func() time.Time // nil: time.Now
}

// Server is the ContextVM front. Create it with New, run it with Run.
type Server struct {
	cfg    Config
	log    *slog.Logger
	pk     string            // our pubkey, hex
	priv   *btcec.PrivateKey // our key, parsed once
	signer *signer           // priv, ready to sign (sign.go)
	keys   keyCache          // clients' parsed pubkeys

	// publish sends one event to the relays (tests replace it).
	publish func(ctx context.Context, ev nostr.Event) error
	// sleep waits d or until ctx ends (tests replace it).
	sleep func(ctx context.Context, d time.Duration)

	mu   sync.Mutex
	seen map[string]bool // clients that got their discovery tags
	// inflight holds the claim keys of requests being served (see
	// startReplay): nil until answered, then the answer being stored.
	inflight map[string][]byte
	bigOK    map[string]bool // clients that take oversized transfers (transfer.go)

	ready chan struct{} // closed once every relay confirmed the subscription
	slots chan struct{} // one token per request in flight
	// paying holds the tokens of requests of known payers let in beyond
	// MaxInFlight (see PayerKnower).
	paying chan struct{}

	// started is when Run started: gift wraps older than that are
	// relays' stored copies of requests a previous run had.
	started nostr.Timestamp
	// legacyUntil is when answers stored under claimKey stop being
	// looked up (legacyReplies).
	legacyUntil time.Time

	ann     announcer                        // announcements (announce.go)
	access  accessList                       // Config.Allow and Deny (access.go)
	sess    sessionStore                     // ContextVM clients (sessions.go)
	pool    atomic.Pointer[nostr.SimplePool] // Run's relay pool, nil when not running (RelaysConnected)
	lists   listWatch                        // list_changed (sessions.go)
	elicits elicitations                     // elicitations waiting for an answer (elicit.go)
	shard   *shard                           // with Config.Members (shard.go)
	relays  relayStates                      // the main subscription on each relay (relays.go)
	info    relayInfo                        // the relays' advertised limits (publish.go)
	pubs    publishStats                     // the outcomes of our publications (publish.go)
	recv    *oversized.Receiver              // oversized requests being reassembled (transfer.go)
}

// slotKey is the context key of the function that gives a request's
// MaxInFlight slot back before the request ends (see outbox.notify).
type slotKey struct{}

// Log attribute keys.
const (
	logKeyClient = "client"
	logKeyEvent  = "event"
	logKeyMethod = "method"
	logKeyTool   = "tool"
	logKeyCode   = "code"
	logKeyErr    = "err"
	logKeyRelay  = "relay"
	logKeyReason = "reason"
)

// maxSessions bounds the memory of which clients got discovery tags; when
// full it is cleared (a client then gets the tags once more).
const maxSessions = 100_000

// New checks cfg and returns a Server. It does no I/O and starts no
// goroutine.
func New(cfg Config) (*Server, error) {
	if cfg.Vendor == nil {
		return nil, errors.New("ctxvm: Vendor is nil")
	}
	if len(cfg.Relays) == 0 {
		return nil, errors.New("ctxvm: no relays")
	}
	if cfg.Claims != nil && cfg.Instance == "" {
		return nil, errors.New("ctxvm: Claims without an Instance")
	}
	if cfg.Members != nil && cfg.Claims == nil {
		return nil, errors.New("ctxvm: Members without Claims")
	}
	if !validSecretKey(cfg.SecretKey) {
		return nil, errors.New("ctxvm: SecretKey is not a valid secret key")
	}
	switch cfg.Encryption {
	case "":
		cfg.Encryption = EncryptionOptional
	case EncryptionOptional, EncryptionRequired, EncryptionDisabled:
	default:
		return nil, fmt.Errorf("ctxvm: unknown encryption %q", cfg.Encryption)
	}
	access, err := newAccessList(cfg.Allow, cfg.Deny)
	if err != nil {
		return nil, err
	}
	if cfg.ShardSample < 0 || cfg.MemberTTL < 0 || cfg.SeenFor < 0 {
		return nil, errors.New("ctxvm: negative shard durations")
	}
	if cfg.MaxRequestBytes < 0 || cfg.MaxReassemblyBytes < 0 {
		return nil, errors.New("ctxvm: negative limit")
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.MaxReassemblyBytes == 0 {
		cfg.MaxReassemblyBytes = DefaultMaxReassemblyBytes
	}
	if cfg.Window < 0 || cfg.MaxContentBytes < 0 || cfg.PublishTimeout < 0 || cfg.ShutdownGrace < 0 || cfg.MaxInFlight < 0 || cfg.AnnounceDelay < 0 || cfg.ElicitTimeout < 0 {
		return nil, errors.New("ctxvm: negative limit")
	}
	if cfg.Name == "" {
		cfg.Name = "capvend"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxContentBytes == 0 {
		cfg.MaxContentBytes = DefaultMaxContentBytes
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.FirstAnswerDelay == 0 {
		cfg.FirstAnswerDelay = DefaultFirstAnswerDelay
	}
	if cfg.AnnounceDelay == 0 {
		cfg.AnnounceDelay = DefaultAnnounceDelay
	}
	if cfg.ElicitTimeout == 0 {
		cfg.ElicitTimeout = DefaultElicitTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Relays = append([]string(nil), cfg.Relays...)
	pk, err := nostr.GetPublicKey(cfg.SecretKey)
	if err != nil {
		return nil, errors.New("ctxvm: SecretKey is not a valid secret key")
	}
	skBytes, _ := hex.DecodeString(cfg.SecretKey)
	priv, _ := btcec.PrivKeyFromBytes(skBytes)
	s := &Server{cfg: cfg, log: cfg.Logger, pk: pk, priv: priv, signer: newSigner(priv), seen: map[string]bool{}, inflight: map[string][]byte{}, bigOK: map[string]bool{},
		ready: make(chan struct{}),
		slots: make(chan struct{}, cfg.MaxInFlight), paying: make(chan struct{}, max(1, cfg.MaxInFlight/10)), ann: newAnnouncer(), lists: newListWatch(), access: access}
	s.relays.init(cfg.Relays)
	s.recv = oversized.NewReceiver(oversized.Policy{MaxBytes: int64(cfg.MaxRequestBytes), MaxTotalBytes: int64(cfg.MaxReassemblyBytes)})
	if cfg.Members != nil {
		s.shard = &shard{m: cfg.Members, me: cfg.Instance, name: MemberLease(pk, cfg.Instance), prefix: memberPrefix(pk),
			sample: cmp.Or(cfg.ShardSample, DefaultShardSample), ttl: cmp.Or(cfg.MemberTTL, DefaultMemberTTL), now: cfg.Now, log: s.log}
	}
	s.sleep = func(ctx context.Context, d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return s, nil
}

// Refresh tells the server that the tools, their prices or the catalog
// may have changed (an upstream's list_changed, a config reload): Run
// then announces them again and notifies recent ContextVM clients of the
// lists that did change (see docs/CONTEXTVM.md, list_changed). It never
// blocks.
func (s *Server) Refresh() {
	s.ann.refresh()
	s.lists.refresh()
}

// PublicKey returns the server's pubkey (hex).
func (s *Server) PublicKey() string { return s.pk }

// Ready is closed once every relay has confirmed the subscription
// (EOSE): requests published after that are seen. It stays open while a
// relay is unreachable. For tests and readiness probes.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Run subscribes to the relays and serves requests until ctx ends; call it
// once per Server. Then it stops reading, lets requests in flight finish
// for up to ShutdownGrace (their publications included), cancels the rest,
// closes its relay connections and returns nil.
func (s *Server) Run(ctx context.Context) error {
	// The lanes end with the subscription, but one may be connecting to a
	// relay: closing the pool ends that, so they are waited for after.
	var lanesWG sync.WaitGroup
	defer lanesWG.Wait()
	// The pool outlives ctx by the grace period: answers still go out.
	poolCtx, closePool := context.WithCancel(context.WithoutCancel(ctx))
	defer closePool()
	pool := nostr.NewSimplePool(poolCtx, nostr.WithRelayOptions(trustRelays{}))
	defer closeRelays(pool)
	s.pool.Store(pool)
	defer s.pool.Store(nil)
	if s.publish == nil {
		s.publish = func(ctx context.Context, ev nostr.Event) error { return s.publishPool(ctx, pool, ev) }
	}

	kinds := []int{KindMessage, KindJobRequest}
	if s.cfg.Encryption != EncryptionDisabled {
		kinds = append(kinds, KindGiftWrap, KindEphemeralGiftWrap)
	}
	// Since the window, not now: relays match live events against since
	// too, and a request replayed after a restart must reach us (vend
	// answers it from the ledger). Relays store gift wraps (kind 1059)
	// and NIP-90 job requests (5910): those made before this run are
	// dropped (see parse), or a restart would answer every request of
	// the last Window again and re-run free calls.
	since := nostr.Timestamp(s.cfg.Now().Add(-s.cfg.Window).Unix())
	s.started = nostr.Timestamp(s.cfg.Now().Unix())
	s.legacyUntil = s.cfg.Now().Add(2 * s.cfg.Window)
	filter := nostr.Filter{Kinds: kinds, Tags: nostr.TagMap{"p": []string{s.pk}}, Since: &since}

	// With a shard, requests are read a little after ctx ends (see
	// startShard).
	readCtx, stopShard, err := s.startShard(ctx)
	if err != nil {
		return err
	}
	defer stopShard()
	subCtx, stopSub := context.WithCancel(readCtx)
	defer stopSub()
	events := s.startMain(subCtx, pool, filter, &lanesWG)
	fast := s.startLanes(subCtx, pool, filter, &lanesWG) // see Lanes in lanes.go
	seen := laneSeen{keep: s.cfg.SeenFor}

	// Requests run on work, which ends ShutdownGrace after ctx.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	handlers := newWorkers(workerIdle) // see workers.go
	defer handlers.stop()
	s.log.Info("contextvm front listening", "pubkey", s.pk, "relays", len(s.cfg.Relays))
	announced := s.startAnnouncing(ctx)
	watched := s.startListWatch(ctx)
	// The relays' limits, read before the first answers need them; and
	// the sweep of oversized requests that never complete.
	var bgWG sync.WaitGroup
	bgWG.Add(2)
	go func() { defer bgWG.Done(); s.fetchRelayInfo(ctx) }()
	go func() { defer bgWG.Done(); s.sweepTransfers(ctx) }()
loop:
	for {
		var ev *nostr.Event
		select {
		case ev = <-fast: // the lanes first
		default:
			select {
			case <-readCtx.Done():
				break loop
			case ev = <-fast:
			case ev = <-events:
				if s.cfg.slowMain != nil && s.cfg.slowMain(ev) {
					continue
				}
			}
		}
		if ev == nil || !seen.admit(ev.ID, time.Now()) {
			continue
		}
		slots := s.slot(ev)
		if slots == nil {
			s.log.Warn("nostr event dropped: too many requests in flight", logKeyEvent, ev.ID)
			continue
		}
		wg.Add(1)
		handlers.run(func() {
			var once sync.Once
			free := func() { once.Do(func() { <-slots }) }
			defer func() { free(); wg.Done() }()
			ctx := context.WithValue(work, slotKey{}, free)
			if s.knownPayer(ev.PubKey) {
				ctx = vend.Urgent(ctx) // its ledger reads go first
			}
			s.handle(ctx, ev)
		})
	}
	stopSub()
	<-announced
	<-watched
	bgWG.Wait()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	grace := time.NewTimer(s.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		stopWork()
		<-done
	}
	return nil
}

// slot takes a MaxInFlight slot for ev and returns the channel to give
// it back to: s.slots, or when they are all taken and ev's author paid
// before, s.paying; nil when ev is to be dropped. (A gift wrap's author
// is a throwaway key: it gets a slot or nothing.)
func (s *Server) slot(ev *nostr.Event) chan struct{} {
	select {
	case s.slots <- struct{}{}:
		return s.slots
	default:
	}
	if !s.knownPayer(ev.PubKey) {
		return nil
	}
	select {
	case s.paying <- struct{}{}:
		return s.paying
	default:
		return nil
	}
}

// knownPayer reports whether the Vendor knows pubkey paid before (see
// PayerKnower).
func (s *Server) knownPayer(pubkey string) bool {
	pk, ok := s.cfg.Vendor.(PayerKnower)
	return ok && pk.KnownPayer(pubkey)
}

// listTools is the tools/list result and its cap tags.
func (s *Server) listTools() (json.RawMessage, nostr.Tags) {
	type tool struct {
		Name        string          `json:"name"`
		Title       string          `json:"title,omitempty"`
		Description string          `json:"description,omitempty"`
		InputSchema json.RawMessage `json:"inputSchema"`
		Annotations json.RawMessage `json:"annotations,omitempty"`
		Meta        map[string]any  `json:"_meta,omitempty"`
	}
	vt := s.cfg.Vendor.Tools()
	tools := make([]tool, 0, len(vt))
	var tags nostr.Tags
	for _, t := range vt {
		mt := tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema}
		if len(mt.InputSchema) == 0 || !json.Valid(mt.InputSchema) {
			mt.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		if len(t.Annotations) > 0 && json.Valid(t.Annotations) {
			mt.Annotations = t.Annotations
		}
		lo, hi := s.cfg.Vendor.ListedPrice(t)
		if hi > 0 {
			price := map[string]any{"amount": lo.SatsCeil(), "unit": "sats"}
			if hi.SatsCeil() > lo.SatsCeil() {
				price["max_amount"] = hi.SatsCeil()
			}
			mt.Meta = map[string]any{"capvend/price": price}
			tags = append(tags, nostr.Tag{"cap", "tool:" + t.Name, pricing.CapAmount(lo, hi), "sats"})
		}
		tools = append(tools, mt)
	}
	b, _ := json.Marshal(map[string]any{"tools": tools})
	return b, tags
}

// discoveryTags are the tags of a client's first answer.
func (s *Server) discoveryTags() nostr.Tags {
	var tags nostr.Tags
	add := func(k, v string) {
		if v != "" {
			tags = append(tags, nostr.Tag{k, v})
		}
	}
	add("name", s.cfg.Name)
	add("about", s.cfg.About)
	add("website", s.cfg.Website)
	add("picture", s.cfg.Picture)
	if s.cfg.Encryption != EncryptionDisabled {
		tags = append(tags, nostr.Tag{"support_encryption"}, nostr.Tag{tagEphemeral})
	}
	for _, p := range s.cfg.PMIs {
		add("pmi", p)
	}
	return tags
}

// cvmDiscoveryTags are the discovery tags of ContextVM answers and
// announcements: discoveryTags and support_oversized_transfer (CEP-22;
// DVMCP has no such thing).
func (s *Server) cvmDiscoveryTags() nostr.Tags {
	return append(s.discoveryTags(), nostr.Tag{oversized.TagSupport})
}

// newClient says whether client has not had an answer yet (not marking
// it: firstAnswer does).
func (s *Server) newClient(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.seen[client]
}

// firstAnswer says whether client has not had an answer yet, and
// remembers that it now has.
func (s *Server) firstAnswer(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[client] {
		return false
	}
	if len(s.seen) >= maxSessions {
		clear(s.seen)
	}
	s.seen[client] = true
	return true
}

// RelaysConnected returns how many of the configured relays Run is
// connected to now (0 when it is not running).
func (s *Server) RelaysConnected() int {
	pool := s.pool.Load()
	if pool == nil {
		return 0
	}
	n := 0
	pool.Relays.Range(func(_ string, r *nostr.Relay) bool {
		if r != nil && r.IsConnected() {
			n++
		}
		return true
	})
	return n
}

// Sessions returns how many ContextVM clients have a session (served
// within the window and not yet dropped).
func (s *Server) Sessions() int {
	s.sess.mu.Lock()
	defer s.sess.mu.Unlock()
	return len(s.sess.m)
}
