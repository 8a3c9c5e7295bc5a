package ctxvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// Announcement kinds (see docs/CONTEXTVM.md, Announcements).
const (
	// ContextVM (CEP-6): replaceable, one per kind and pubkey.
	KindAnnounceServer            = 11316
	KindAnnounceTools             = 11317
	KindAnnounceResources         = 11318
	KindAnnounceResourceTemplates = 11319
	KindAnnouncePrompts           = 11320
	KindRelayList                 = 10002 // NIP-65

	// DVMCP (2025-03-26 rev1/rev1.1): addressable, by pubkey and d tag.
	// 31319 is prompts here, resource templates in ContextVM; DVMCP puts
	// resource templates in a second 31318 (another d tag).
	KindDVMCPAnnounceServer    = 31316
	KindDVMCPAnnounceTools     = 31317
	KindDVMCPAnnounceResources = 31318
	KindDVMCPAnnouncePrompts   = 31319

	// DVMCP 2024-11-05: NIP-89 handler information of kind 5910 jobs.
	KindHandlerInfo = 31990
	kindLegacyJob   = 5910 // DVMCP 2024-11-05 job requests (the k tag of 31990)
	KindDeletion    = 5    // NIP-09

	// KindProfile is the server's profile (CEP-23: NIP-01 kind 0
	// metadata of the server key), with Config.Profile.
	KindProfile = 0
)

// Announcement retry backoff after a failed publication.
const (
	announceRetryMin = 5 * time.Second
	announceRetryMax = 5 * time.Minute
)

// Address names one announcement: its kind and, for addressable kinds
// (30000-39999), its d tag. Replaceable kinds have D "".
type Address struct {
	Kind int
	D    string
}

// Coordinate is the NIP-01 event coordinate of a under pubkey,
// "<kind>:<pubkey>:<d>" (d empty for replaceable kinds), as NIP-09 a tags
// use it.
func (a Address) Coordinate(pubkey string) string {
	return strconv.Itoa(a.Kind) + ":" + pubkey + ":" + a.D
}

// ServerID is the DVMCP server identifier of the server whose pubkey (hex)
// is pubkey: the pubkey itself. It is the d tag of the 31316 and 31990
// announcements, the prefix of the other DVMCP d tags, and what DVMCP
// clients put in their s tags. Derived from the key alone, it survives a
// renamed server and `capvend unannounce` needs no running server to know it.
func ServerID(pubkey string) string { return pubkey }

// ServerID returns the server's DVMCP server identifier (see ServerID).
func (s *Server) ServerID() string { return ServerID(s.pk) }

// AnnouncementAddresses returns the address of every announcement a server
// with pubkey publishes (when Config.Announce is set): what
// `capvend unannounce` asks relays to delete. Whether or not a Catalog is
// configured, the list is the same. The profile (KindProfile, with
// Config.Profile) is not in it: it names the key, not what it sells.
func AnnouncementAddresses(pubkey string) []Address {
	id := ServerID(pubkey)
	return []Address{
		{KindAnnounceServer, ""},
		{KindAnnounceTools, ""},
		{KindAnnounceResources, ""},
		{KindAnnounceResourceTemplates, ""},
		{KindAnnouncePrompts, ""},
		{KindRelayList, ""},
		{KindDVMCPAnnounceServer, id},
		{KindDVMCPAnnounceTools, id + "/tools/list"},
		{KindDVMCPAnnounceResources, id + "/resources/list"},
		{KindDVMCPAnnounceResources, id + "/resources/templates/list"},
		{KindDVMCPAnnouncePrompts, id + "/prompts/list"},
		{KindHandlerInfo, id},
	}
}

// announcement is one unsigned announcement event.
type announcement struct {
	Address
	content string
	tags    nostr.Tags
}

// fingerprint identifies content and tags: an announcement whose
// fingerprint was published last is not published again.
func (a announcement) fingerprint() string {
	h := sha256.New()
	b, _ := json.Marshal([]any{a.content, a.tags})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// announcer is the state of the announcement loop. kick is made by New;
// everything else belongs to the loop's goroutine.
type announcer struct {
	kick  chan struct{} // a pending Refresh (buffered 1: coalesced)
	retry time.Duration // first backoff after a failure

	last    map[Address]string          // fingerprint last published
	created map[Address]nostr.Timestamp // created_at last published

	roundDone func(failed int) // tests: called after each round
}

func newAnnouncer() announcer {
	return announcer{kick: make(chan struct{}, 1), retry: announceRetryMin}
}

// refresh asks the loop for a new round. It never blocks.
func (a *announcer) refresh() {
	select {
	case a.kick <- struct{}{}:
	default: // a round is pending already
	}
}

// startAnnouncing runs the announcement loop when Config.Announce is set
// and returns a channel closed once the loop has stopped (after ctx ends).
func (s *Server) startAnnouncing(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if !s.cfg.Announce {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		s.announceLoop(ctx)
	}()
	return done
}

// announceLoop publishes the announcements now, then after each Refresh
// (AnnounceDelay later, Refreshes in between coalesced), and after a
// failure with an exponential backoff, until ctx ends.
func (s *Server) announceLoop(ctx context.Context) {
	backoff := time.Duration(0)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		failed := s.announceRound(ctx)
		if ctx.Err() != nil {
			return
		}
		if s.ann.roundDone != nil {
			s.ann.roundDone(failed)
		}
		retry.Stop()
		if failed > 0 {
			backoff = min(max(backoff*2, s.ann.retry), announceRetryMax)
			retry.Reset(backoff)
			s.log.Warn("announcements not published; retrying", "failed", failed, "retry_in", backoff)
		} else {
			backoff = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
		case <-s.ann.kick:
			if !s.settle(ctx, s.ann.kick) {
				return
			}
		}
	}
}

// settle waits AnnounceDelay after a Refresh's kick, so that Refreshes
// coming close together make one round: kicks during the wait are taken
// as this round's. It returns false when ctx ended first.
func (s *Server) settle(ctx context.Context, kick <-chan struct{}) bool {
	t := time.NewTimer(s.cfg.AnnounceDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	select {
	case <-kick:
	default:
	}
	return true
}

// announceRound publishes every announcement whose content or tags
// changed since it was last published, and returns how many failed
// (they are tried again next round).
func (s *Server) announceRound(ctx context.Context) (failed int) {
	if s.ann.last == nil {
		s.ann.last = map[Address]string{}
		s.ann.created = map[Address]nostr.Timestamp{}
	}
	for _, a := range s.announcements() {
		if ctx.Err() != nil {
			return failed
		}
		fp := a.fingerprint()
		if s.ann.last[a.Address] == fp {
			continue
		}
		// A replacement must be newer than what it replaces: relays keep
		// the lower id of two events of the same second.
		created := nostr.Timestamp(s.cfg.Now().Unix())
		if prev, ok := s.ann.created[a.Address]; ok && created <= prev {
			created = prev + 1
		}
		ev := nostr.Event{Kind: a.Kind, CreatedAt: created, Tags: a.tags, Content: a.content}
		if err := s.sign(&ev); err != nil {
			s.log.Error("announcement not signed", "kind", a.Kind)
			failed++
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
		err := s.publish(pctx, ev)
		cancel()
		if err != nil {
			s.log.Warn("announcement not published", "kind", a.Kind, "d", a.D, logKeyErr, err)
			failed++
			continue
		}
		s.ann.last[a.Address] = fp
		s.ann.created[a.Address] = created
		s.log.Debug("announcement published", "kind", a.Kind, "d", a.D, logKeyEvent, ev.ID)
	}
	return failed
}

// announcements builds every announcement from the Vendor's tools and
// prices and the Catalog as they are now.
func (s *Server) announcements() []announcement {
	id := s.ServerID()
	initRes := string(s.initializeResult(nil))
	toolsRes, toolCaps := s.listTools()
	vt := s.cfg.Vendor.Tools()

	// ContextVM server: discovery tags and every price.
	out := []announcement{{
		Address: Address{Kind: KindAnnounceServer}, content: initRes,
		tags: append(s.cvmDiscoveryTags(), toolCaps...),
	}, {
		Address: Address{Kind: KindAnnounceTools}, content: string(toolsRes), tags: toolCaps,
	}}
	var resources, templates, prompts catalogList
	if s.cfg.Catalog != nil {
		resources = s.announceResources()
		templates = s.announceResourceTemplates()
		prompts = s.announcePrompts()
		out = append(out,
			announcement{Address: Address{Kind: KindAnnounceResources}, content: resources.content, tags: resources.cvmCaps},
			announcement{Address: Address{Kind: KindAnnounceResourceTemplates}, content: templates.content, tags: templates.cvmCaps},
			announcement{Address: Address{Kind: KindAnnouncePrompts}, content: prompts.content, tags: prompts.cvmCaps},
		)
	}
	relays := nostr.Tags{}
	for _, r := range s.cfg.Relays {
		relays = append(relays, nostr.Tag{"r", r})
	}
	out = append(out, announcement{Address: Address{Kind: KindRelayList}, tags: relays})

	// DVMCP: d, k / s tags, bare-name cap tags (with the price when
	// priced), content as rev1.1 and the DVMCP bridge: the bare result.
	dv := nostr.Tags{{"d", id}, {"k", strconv.Itoa(KindMessage)}}
	for _, t := range s.discoveryTags() {
		if t[0] == "support_encryption" {
			t = nostr.Tag{"support_encryption", "true"} // DVMCP's form
		}
		dv = append(dv, t)
	}
	out = append(out, announcement{Address: Address{KindDVMCPAnnounceServer, id}, content: initRes, tags: dv})
	list := func(kind int, d string, content string, caps nostr.Tags) announcement {
		return announcement{Address: Address{kind, d}, content: content,
			tags: append(nostr.Tags{{"d", d}, {"s", id}}, caps...)}
	}
	var dvCaps nostr.Tags
	for _, t := range vt {
		lo, hi := s.cfg.Vendor.ListedPrice(t)
		if hi > 0 {
			dvCaps = append(dvCaps, capTag(t.Name, lo, hi))
		} else {
			dvCaps = append(dvCaps, nostr.Tag{"cap", t.Name})
		}
	}
	out = append(out, list(KindDVMCPAnnounceTools, id+"/tools/list", string(toolsRes), dvCaps))
	if s.cfg.Catalog != nil {
		out = append(out,
			list(KindDVMCPAnnounceResources, id+"/resources/list", resources.content, resources.caps),
			list(KindDVMCPAnnounceResources, id+"/resources/templates/list", templates.content, templates.caps),
			list(KindDVMCPAnnouncePrompts, id+"/prompts/list", prompts.content, prompts.caps),
		)
	}

	// DVMCP 2024-11-05 (NIP-89): name, about and the tools in the content.
	var listed struct {
		Tools []json.RawMessage `json:"tools"`
	}
	_ = json.Unmarshal(toolsRes, &listed)
	legacy, _ := json.Marshal(struct {
		Name  string            `json:"name"`
		About string            `json:"about,omitempty"`
		Tools []json.RawMessage `json:"tools"`
	}{s.cfg.Name, s.cfg.About, listed.Tools})
	nip89 := nostr.Tags{{"d", id}, {"k", strconv.Itoa(kindLegacyJob)}, {"capabilities", "mcp-1.0"}, {"t", "mcp"}}
	for _, t := range vt {
		nip89 = append(nip89, nostr.Tag{"t", t.Name})
	}
	out = append(out, announcement{Address: Address{KindHandlerInfo, id}, content: string(legacy), tags: nip89})
	if s.cfg.Profile {
		out = append(out, announcement{Address: Address{Kind: KindProfile}, content: s.profile(), tags: nostr.Tags{}})
	}
	return out
}

// profile is the content of the server's CEP-23 profile: NIP-01
// metadata of the configured name, about, picture and website (those
// set), in that order.
func (s *Server) profile() string {
	b, _ := json.Marshal(struct {
		Name    string `json:"name,omitempty"`
		About   string `json:"about,omitempty"`
		Picture string `json:"picture,omitempty"`
		Website string `json:"website,omitempty"`
	}{s.cfg.Name, s.cfg.About, s.cfg.Picture, s.cfg.Website})
	return string(b)
}

// capTag is a DVMCP cap tag of a priced capability: its bare name and
// price in sats ("lo-hi" for a range).
func capTag(name string, lo, hi vend.Msat) nostr.Tag {
	return nostr.Tag{"cap", name, pricing.CapAmount(lo, hi), "sats"}
}

// catalogList is one list of the Catalog as announced: the list result
// JSON, the DVMCP cap tags (one bare name per item, with the price when
// priced) and the ContextVM cap tags (one per priced item, as in list
// answers: ["cap","prompt:<name>"|"resource:<uri>","<sats>","sats"]).
type catalogList struct {
	content string
	caps    nostr.Tags
	cvmCaps nostr.Tags
}

// definitionList builds {"<key>":[...]} from MCP definitions, each with
// field set to its exposed value (a prompt's name, a resource's uri) and,
// when priced, _meta["capvend/price"]; definitions that are not JSON
// objects are skipped (logged).
func (s *Server) definitionList(kind vend.ItemKind, key, field string, n int, item func(i int) (string, json.RawMessage)) catalogList {
	items := make([]map[string]json.RawMessage, 0, n)
	var caps, cvmCaps nostr.Tags
	capped := map[string]bool{}
	for i := range n {
		v, def := item(i)
		m := map[string]json.RawMessage{}
		if len(def) > 0 {
			if err := json.Unmarshal(def, &m); err != nil || m == nil {
				s.log.Warn("not announced: bad definition", "list", key, "item", v)
				continue
			}
		}
		m[field], _ = json.Marshal(v)
		lo, hi := s.itemPrice(kind, v)
		if hi > 0 {
			withPrice(m, lo, hi)
			if !capped[v] { // one cap tag per item, even if listed twice
				capped[v] = true
				cvmCaps = append(cvmCaps, itemCap(kind, v, lo, hi))
			}
		}
		items = append(items, m)
		name := v
		var str string
		if raw, ok := m["name"]; ok && json.Unmarshal(raw, &str) == nil && str != "" {
			name = str
		}
		if hi > 0 {
			caps = append(caps, capTag(name, lo, hi))
		} else {
			caps = append(caps, nostr.Tag{"cap", name})
		}
	}
	b, _ := json.Marshal(map[string]any{key: items})
	return catalogList{content: string(b), caps: caps, cvmCaps: cvmCaps}
}

func (s *Server) announceResources() catalogList {
	rs := s.cfg.Catalog.Resources()
	return s.definitionList(vend.ItemResource, "resources", "uri", len(rs), func(i int) (string, json.RawMessage) { return rs[i].URI, rs[i].Definition })
}

func (s *Server) announceResourceTemplates() catalogList {
	ts := s.cfg.Catalog.ResourceTemplates()
	return s.definitionList(vend.ItemResource, "resourceTemplates", "uriTemplate", len(ts), func(i int) (string, json.RawMessage) {
		return ts[i].URITemplate, ts[i].Definition
	})
}

func (s *Server) announcePrompts() catalogList {
	ps := s.cfg.Catalog.Prompts()
	return s.definitionList(vend.ItemPrompt, "prompts", "name", len(ps), func(i int) (string, json.RawMessage) { return ps[i].Name, ps[i].Definition })
}

// UnannounceResult is what Unannounce published.
type UnannounceResult struct {
	Event    nostr.Event // the signed kind 5 deletion request
	Found    int         // announcement events found on the relays (e tags)
	Accepted []string    // relays that accepted the deletion request
}

// ErrNotAccepted is returned by Unannounce when no relay accepted the
// deletion request.
var ErrNotAccepted = errors.New("no relay accepted the deletion request")

// Unannounce asks relays to delete every announcement the server key sk
// (64 hex) publishes: it looks for our pubkey's announcement events on the
// relays, then publishes one NIP-09 kind 5 event to every relay with an a
// tag per address of AnnouncementAddresses (the coordinate with an empty
// d for replaceable kinds), a k tag per kind, and an e tag per event found
// (relays that only honour e tags need them for replaceable kinds), content
// reason. It waits up to timeout for each step (query, publication).
// It returns ErrNotAccepted, wrapping the last relay's refusal, when no
// relay accepted the request. Idempotent; a running server with announce
// set publishes its announcements again on its next change or restart.
func Unannounce(ctx context.Context, sk string, relays []string, reason string, timeout time.Duration) (UnannounceResult, error) {
	var res UnannounceResult
	if !validSecretKey(sk) {
		return res, errors.New("ctxvm: not a valid secret key")
	}
	if len(relays) == 0 {
		return res, errors.New("ctxvm: no relays")
	}
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		return res, errors.New("ctxvm: not a valid secret key")
	}
	poolCtx, closePool := context.WithCancel(ctx)
	defer closePool()
	pool := nostr.NewSimplePool(poolCtx)
	defer closeRelays(pool)

	addrs := AnnouncementAddresses(pk)
	var kinds []int
	for _, a := range addrs {
		if !slices.Contains(kinds, a.Kind) {
			kinds = append(kinds, a.Kind)
		}
	}
	qctx, cancel := context.WithTimeout(ctx, timeout)
	var ids []string
	for re := range pool.FetchMany(qctx, relays, nostr.Filter{Authors: []string{pk}, Kinds: kinds}) {
		if re.Event != nil && re.PubKey == pk && !slices.Contains(ids, re.ID) {
			ids = append(ids, re.ID)
		}
	}
	cancel()
	slices.Sort(ids)

	tags := nostr.Tags{}
	for _, a := range addrs {
		tags = append(tags, nostr.Tag{"a", a.Coordinate(pk)})
	}
	for _, k := range kinds {
		tags = append(tags, nostr.Tag{"k", strconv.Itoa(k)})
	}
	for _, id := range ids {
		tags = append(tags, nostr.Tag{"e", id})
	}
	ev := nostr.Event{Kind: KindDeletion, CreatedAt: nostr.Now(), Tags: tags, Content: reason}
	if err := ev.Sign(sk); err != nil {
		return res, errors.New("ctxvm: signing the deletion request failed")
	}
	res.Event, res.Found = ev, len(ids)

	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for r := range pool.PublishMany(pctx, relays, ev) {
		if r.Error == nil {
			res.Accepted = append(res.Accepted, r.RelayURL)
		} else {
			last = fmt.Errorf("%s: %w", r.RelayURL, r.Error)
		}
	}
	if len(res.Accepted) == 0 {
		if last == nil {
			return res, ErrNotAccepted
		}
		return res, fmt.Errorf("%w (%w)", ErrNotAccepted, last)
	}
	slices.Sort(res.Accepted)
	return res, nil
}
