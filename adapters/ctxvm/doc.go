// Package ctxvm is capvend's Nostr front: it serves the Vendor's priced
// tools to MCP clients that talk through Nostr relays, in the ContextVM
// dialect (the @contextvm/sdk client transport and compatible ones) and in
// the three DVMCP dialects (2025-03-26 rev1 and rev1.1, and the NIP-90 form
// of 2024-11-05). Each request is answered in its own dialect and kinds.
// It translates requests to Vendor calls and the Vendor's answers back to
// events; it knows nothing of billing or the ledger.
//
// # Wire
//
// The server subscribes, on every configured relay, to kinds 25910 and
// 5910 (and 1059 and 21059 gift wraps unless encryption is disabled)
// tagged ["p", <server pubkey>], created since Config.Window before it
// started. Relays store 1059 wraps and 5910 job requests: those made
// before the server started are dropped (a restart would answer them
// again and re-run free calls). go-nostr's pool drops an event id it has
// seen in the last minute or so; a copy arriving while the first is being
// served is dropped too. Later, a replayed tools/call, prompts/get or
// resources/read is answered with the stored first answer (Config.Replies,
// kept in the ledger across restarts; errors are not kept), and a priced
// call is anyway the same vend call (same RequestID), never charged
// twice. So a client repeating a call (explicit gating) must send a new
// event: the same content, tags and created_at second make the same
// event. Every answer is signed with the server key and tagged
// ["p", <client pubkey>] and ["e", <request event id>]. It is published to
// every relay; publishing succeeds when one relay accepts it (the others
// still get it; see Publishing for what happens when none does). A relay
// that is down does not stop the service: Run
// connects again every 5 s and subscribes again since the newest
// created_at it saw on that relay (or its last end of stored events),
// less 30 s for clients' clocks, and never more than 5 minutes (or the
// window) back, so that a gift wrap or job request published while the
// connection was down is served. The stored events of those 30 s it
// received before are dropped by id; what it served before from another
// relay is answered from the stored replies (or dropped by Run's one
// minute memory of event ids, or by a claim). Ephemeral requests (kind
// 25910) published meanwhile are lost: relays do not keep them, and the
// client asks again. Settled (closed once every relay's subscription had
// its end of stored events, or failed, RelayStates naming them) is when
// serve says it is serving. The first event to a client not answered before is
// held for Config.FirstAnswerDelay (200 ms): a relay may register a
// client's subscription after handling its first request (khatru handles
// each message on its own goroutine), and an ephemeral answer published
// before that is lost.
//
// # Dialects
//
// The dialect is read from each request (kind, content, tags):
//
//	kind 5910                                   NIP-90 (DVMCP 2024-11-05)
//	kind 25910, content without "jsonrpc"       DVMCP rev1.1
//	kind 25910, "jsonrpc":"2.0" and a method tag DVMCP rev1
//	kind 25910, "jsonrpc":"2.0", no method tag  ContextVM
//
// An s tag alone decides nothing (ContextVM drafts use it too). A method
// tag must equal the content's method.
//
// ContextVM: requests and answers are kind 25910, content the full
// JSON-RPC message ("jsonrpc":"2.0" and the request's id; a request
// without an id is a notification and gets no answer). Notifications from
// the Vendor (payment_required {amount, pay_req, pmi, description, ttl},
// payment_accepted, payment_rejected, progress ...) are kind 25910 JSON-RPC
// notifications tagged p and e.
//
// DVMCP rev1: requests kind 25910 tagged ["method", m] (and usually
// ["s", <server id>], not checked); answers kind 26910 tagged p and e,
// content the full JSON-RPC response; MCP notifications kind 21316 tagged
// p, e and ["method", m], content the JSON-RPC notification. Payment
// notifications are DVMCP's tag-only kind 21316 events:
//
//	payment_required  content "", ["status","payment-required"], ["amount","<sats>","<bolt11>"], ["invoice","<bolt11>"]
//	payment_accepted  content "", ["status","payment-accepted"], ["amount","<sats>"]
//	payment_rejected  content the reason, ["status","error"]
//
// The amount tag is the rev1 spec's (a spec client finds the bolt11 at
// amount[2]); the DVMCP bridge's discovery client reads the bolt11 from
// the invoice tag only (it never reads amount), so both find it. The
// bridge itself writes ["amount", price, unit]: its unit is always sats
// here, which the spec defines as the amount's unit. An option without a
// bolt11 (Cashu only) has ["amount","<sats>"] and ["pmi", <pmi>].
//
// DVMCP rev1.1: as rev1, but contents are simplified: a request is
// {"method", "params"} (an id, if any, is ignored), an answer is the
// result itself at the root ({} for ping) or {"error": {code, message}},
// a notification {"method", "params"}. A method starting with
// "notifications/" gets no answer.
//
// NIP-90: a kind 5910 with ["c","list-tools"] (content empty or JSON) is
// tools/list; ["c","execute-tool"] with content {"name", "parameters",
// "_meta"?} is tools/call with arguments = parameters (_meta as in
// tools/call below); another c is answered "Method not found". The answer
// is a kind 6910 tagged ["c","<command>-response"], p and e, content the
// result at the root. An execute-tool ends with kind 7000 feedback first,
// ["status","success"], or ["status","error","<message>"] when the call
// failed (the 6910 then is {"content":[{"type":"text","text":
// "<message>"}],"isError":true} tagged ["status","error"]) or the tool
// reported isError. Payment notifications become kind 7000 feedback:
// payment_required ["status","payment-required"] ["amount","<millisats>",
// "<bolt11>"], payment_accepted ["status","processing"], progress
// ["status","processing","<message>"], payment_rejected
// ["status","error","<reason>"]; other notifications are not sent.
// Untargeted job requests (no p tag) are not served.
//
// List answers carry one cap tag per priced tool: ["cap","tool:<name>",
// "<amount>","sats"] for ContextVM, ["cap","<name>","<amount>","sats"]
// (the DVMCP form) for the others. When the Vendor is an ItemPricer,
// prompts/list, resources/list and resources/templates/list answers carry
// one ["cap","prompt:<name>","<amount>","sats"] or
// ["cap","resource:<uri or URI template>","<amount>","sats"] per priced
// entry, whose definition also gets _meta["capvend/price"]; a prompts/get
// or resources/read of a priced prompt or resource is a vend.CallRequest
// like a tools/call (Kind KindPrompt or KindResource, Tool the prompt name
// or URI, the same Client, RequestID, tags and _meta), with the same
// notifications and errors.
//
// # Inbound checks
//
// Every dialect and wrapping gets the same checks. An event is dropped,
// with no answer, when its id or signature is wrong (the inner event's
// too, for a gift wrap; for a NIP-59 rumor, the seal's signature, the
// rumor's author being the seal's signer and its id its hash), its
// created_at (the request's, inside any wrap) is further than
// Config.Window from now, a content (at any layer) is larger than
// Config.MaxContentBytes, its content is not valid JSON in its dialect's
// form (one JSON object; "jsonrpc", when present, "2.0"; a string or
// number id), a method tag disagrees with the content, it is not tagged p
// with the server's pubkey, or when Config.MaxInFlight requests are being
// served already (a call waiting for its payment counts only until its
// payment_required: see Proof of work and load). Notifications and
// responses from clients get no answer;
// a ContextVM response may answer an elicitation (see Elicitation).
//
// # Methods
//
//	initialize                 InitializeResult: protocolVersion (the client's when known, else 2025-11-25),
//	                           capabilities {tools:{listChanged:true}} (and prompts, resources
//	                           alike with a Catalog),
//	                           serverInfo {name, version}
//	notifications/initialized  no answer
//	ping                       {}
//	tools/list                 {tools:[...]} and the cap tags
//	tools/call                 a vend.CallRequest (below)
//	prompts/list               {prompts:[...]}            from Config.Catalog; not paginated;
//	resources/list             {resources:[...]}          cap tags of the priced entries
//	resources/templates/list   {resourceTemplates:[...]}
//	prompts/get                the Catalog's GetPromptResult, verbatim (priced: sold as above)
//	resources/read             the Catalog's ReadResourceResult, verbatim (priced: sold as above)
//	completion/complete        forwarded to a Catalog that is a Completer; else no suggestions,
//	                           {"completion":{"values":[]}} (no upstream completes yet).
//	                           Params without ref or argument.name: -32602 "Invalid params"
//	anything else              error -32601 "Method not found"
//
// The first answer to a client (by pubkey, since the server started) and
// every initialize answer carry the discovery tags name, about, website,
// picture (those configured), support_encryption and
// support_encryption_ephemeral (unless encryption is disabled) and one pmi
// tag per payment method of Config.PMIs; ContextVM answers also
// support_oversized_transfer (see Oversized transfer).
//
// A tools/call becomes a vend.CallRequest with Transport "nostr-ctxvm"
// (ContextVM), "nostr-dvmcp" (rev1, rev1.1) or "nostr-nip90", Client the
// client's pubkey (hex; a NIP-59 rumor's, which is its seal's signer),
// RequestID the request event's id (a NIP-59 rumor's id), so a replayed
// event, even after a restart, is the same call in the ledger and is
// answered from the stored result, never charged twice. Tool and
// Arguments from params ({} when absent), ProgressToken
// params._meta.progressToken, CashuToken params._meta["capvend/cashu"]
// or a ContextVM request's direct_payment tag (see Direct payments),
// PaymentProof params._meta["capvend/preimage"], RefundInvoice
// params._meta["capvend/refund_invoice"], Credit
// params._meta["capvend/credit"] when it is a credit token, CreditSelf
// when it is true (the account of the pubkey that signed the request; see
// vend's package doc, Credit), PMIs the request's
// ["pmi", ...] tags (and params._meta["capvend/pmi"]), Explicit when the
// request has ["payment_interaction","explicit_gating"] (or
// params._meta["capvend/payment_interaction"] is "explicit_gating"). The
// Vendor's notifications are published in the request's dialect, in
// order, before the answer. A ContextVM call also gets Elicit (see
// Elicitation); DVMCP and NIP-90 calls do not (an upstream asking for
// input is declined). Every request's ctx carries the pubkey that
// signed it (vend.WithClientPubkey), for upstreams that are told who
// calls (ContextVM's CEP-16, adapters/upstream ServerConfig.ClientPubkey);
// a params._meta.clientPubkey the client wrote is ignored, and the pubkey
// is no part of the call's Arguments.
//
// Errors map to the same JSON-RPC errors as the MCP front
// (adapters/mcpfront):
//
//	vend.ErrUnknownTool           -32602 "Unknown tool: <name>"
//	*vend.InvalidParamsError      -32602 "Invalid params: <reason>"
//	*vend.PaymentRequiredError    -32042 "Payment Required"  data {instructions, payment_options}
//	*vend.PaymentPendingError     -32043 "Payment Pending"   data {instructions, retry_after}
//	vend.ErrPaymentExpired        -32050 "Payment expired"
//	vend.ErrPaymentFailed         -32051 "Payment failed"
//	vend.ErrNoPaymentMethod       -32052 "No payment method in common"
//	vend.ErrLimit                 -32053 "Limit reached"
//	vend.ErrUpstream              -32054 "Upstream server failed"
//	*vend.WorkRequiredError       -32055 "Proof of work required" data {difficulty, work, instructions}
//	vend.ErrResultExpired         -32057 "Result expired: ..." (a replay whose stored answer was pruned)
//	anything else                 -32603 "Internal error"
//
// Bad tools/call params (not an object, no name) are -32602 "Invalid
// params". No internal detail reaches the client; the full error is logged.
// NIP-90 clients get the message (not the code or data) in the 7000 error
// feedback and the 6910's text.
//
// Catalog entries are listed as the Catalog gives them, with their name,
// uri or uriTemplate member set to the listed one and a missing name set
// to the URI (MCP requires it); an entry whose definition is not a JSON
// object, or a second one of the same key, is left out. prompts/get of a
// prompt not listed is -32602 "Unknown prompt: <name>"; resources/read of
// a URI neither listed nor matching a listed template (RFC 6570) is -32602
// "Unknown resource: <uri>"; so is everything without a Catalog, whose
// lists are empty. Catalog errors wrapping vend.ErrUpstream are -32054
// "Upstream server failed", other errors and results that are not JSON
// objects -32603 "Internal error".
//
// # Direct payments (CEP-8)
//
// A ContextVM request may carry its payment in a tag,
// ["direct_payment", <pmi>, <payload>]. The server takes the PMI
// "bitcoin-cashu-v4-direct" (PMICashuDirect, the name CEP-8 and CEP-21
// use; capvend's "bitcoin-cashu-token" too), whose payload is a Cashu
// token (cashuB, or cashuA): the first such tag is the call's CashuToken,
// winning over params._meta["capvend/cashu"] (the older carrier, still
// read); tags of other PMIs are ignored. It is vend's cashu way to pay
// by another carrier, so its rules hold: in a plaintext event the token
// is refused with -32600 "Encryption required" before anything is
// spent, and its change and refunds go only into encrypted answers. A
// request that came as CEP-22 frames has its start frame's tag. A paid
// call gets
//
//	{"jsonrpc":"2.0","method":"notifications/payment_accepted",
//	 "params":{"_meta":{"change":"cashuB..."},"amount":<sats charged>,"pmi":"bitcoin-cashu-v4-direct"}}
//	tags ["p",<client>], ["e",<request>], ["change","bitcoin-cashu-v4-direct","cashuB..."]
//
// (the change tag and _meta.change only when there is change: the stock
// SDK shows its applications the message, never its tags), then the
// result. A token refused before it was redeemed (it does not cover the
// price and the mint's fees, its mint is not trusted, it is malformed or
// not in sats, it was spent) gets
// notifications/payment_rejected {"pmi", "message"} and then the
// -32051 error: the token is the client's still (spent ones aside). A
// token whose swap's outcome is unknown (the mint stopped answering) gets
// only the -32051 error, which says to retry later with the same token.
// A request event is one call (see Wire): it is charged at most once.
// DVMCP and NIP-90 requests have no direct payments (the tag is ignored).
//
// # Proof of work and load
//
// Every vend.CallRequest carries Work, the request event's NIP-13 proof
// of work: the leading zero bits of its id (the signed request inside a
// ContextVM gift wrap, the rumor of a NIP-59 one), counted only when a
// ["nonce", <n>, <target>] tag commits to a target, and then only up to
// the target (a target above what the id shows counts 0). WorkRequired is
// Config.PowDifficulty (nostr.pow_difficulty); the Vendor refuses a
// request with less that would get a free call or an unpaid quote
// (-32055 "Proof of work required", data {difficulty, work,
// instructions}); a request paying with a Cashu token needs none.
//
// Config.MaxInFlight bounds the requests being served, not the calls
// waiting for a payment: a request gives its slot back when the Vendor
// sends its payment_required, so a flood of unpaid quotes cannot drop
// new clients' events. Waiting calls are bounded by the Vendor (vend's
// MaxUnpaidTotal, which withdraws the oldest quote of the busiest client
// to make room; vend's MaxUnpaidPerClient counts per pubkey).
//
// Requests of clients that paid before (PayerLister), and with
// PowDifficulty those that did the work, also come by subscriptions of
// their own, so they do not queue behind a flood's events inside
// go-nostr (see Lanes in lanes.go); each event is served once.
//
// # Encryption
//
// A kind 1059 or 21059 (ephemeral: relays do not store it) event is a gift
// wrap: its content is NIP-44 v2 ciphertext (conversation key of the
// server key and the wrap's pubkey). What it holds decides the scheme:
//
// ContextVM: the client's signed request itself (no seal). The inner event
// gets every check above, its own id and signature included.
//
// DVMCP (NIP-59): a kind 13 seal signed by the client (id and signature
// checked), whose content is NIP-44 ciphertext from the client to the
// server of an unsigned rumor: the request itself (kind 25910 or 5910, as
// the DVMCP packages send it) or a kind 14 whose content is the request
// as an event template {"kind","tags","content"}. The rumor's pubkey must
// be the seal's, and its id must be present and its hash. Note that the
// DVMCP packages seal with a random key (so the sender is not
// authenticated) and leave the rumor's id out: such requests are refused.
//
// An encrypted request is answered encrypted, the same way: ContextVM,
// each answer signed by the server, wrapped; NIP-59, each answer as an
// unsigned rumor with its id (a kind 14 carrying the answer as a template
// when the request came so), sealed (kind 13, signed by the server, NIP-44
// from the server to the client), wrapped. Wraps are signed by a fresh
// random key, tagged ["p", <client>], created_at now (clients subscribe
// since their request: NIP-59's randomised timestamps would hide
// answers); seals too. Answers are wrapped in kind 21059 when the request
// carries a support_encryption_ephemeral tag (any value but "false"),
// else in 1059. With EncryptionDisabled wraps are ignored (not
// subscribed); with EncryptionRequired a plaintext request is answered
// with error -32600 "Encryption required" in its dialect (notifications
// are dropped).
//
// # Access lists
//
// With Config.Deny, requests from those pubkeys are refused; with
// Config.Allow (when not empty), requests from any other pubkey are;
// Deny wins. The sender is the signed request's author: for a gift wrap,
// the inner event's (the wrap's key is random). A refused request is
// answered with error -32600 "Forbidden" (so a client learns why, instead
// of waiting); a refused notification is dropped, as every notification
// is. A refused request never reaches the Vendor.
//
// # Announcements
//
// With Config.Announce, Run publishes the server's announcements once it
// started, and again AnnounceDelay after a Refresh (Refreshes meanwhile
// coalesce into one round; Refresh itself never blocks). Each round
// rebuilds them from the Vendor's tools and listed prices and the Catalog
// as they are then, and publishes only those whose content or tags differ
// from what it last published at that address (kind, and d tag for
// addressable kinds); a republished one's created_at is always later than
// the one it replaces. A publication succeeds on the first relay's OK; a
// failed one is logged and tried again at the next round, which comes
// after a backoff (5 s, doubling to 5 min) if no Refresh comes sooner.
// Publishing runs on a goroutine Run starts, and stops (Run waits for it)
// when Run's context ends.
// The events (resources, templates and prompts only with a Catalog):
//
//	ContextVM (CEP-6, replaceable):
//	11316  server: content the initialize result; tags name, about, website,
//	       picture, support_encryption, pmi (as on a first answer) and
//	       ["cap","tool:<name>","<sats or lo-hi>","sats"] per priced tool
//	11317  tools: content the tools/list result; the same cap tags
//	11318  resources {"resources":[...]}; 11319 resource templates
//	       {"resourceTemplates":[...]}; 11320 prompts {"prompts":[...]};
//	       priced entries with _meta["capvend/price"] and a cap tag each
//	       (["cap","resource:<uri>",...], ["cap","prompt:<name>",...])
//	10002  NIP-65 relay list: ["r", <url>] per relay of Config.Relays
//	DVMCP (2025-03-26 rev1.1, addressable; content the bare result, as rev1.1
//	and the DVMCP bridge, not rev1's JSON-RPC envelope):
//	31316  server: content the initialize result; ["d", <id>], ["k","25910"],
//	       the discovery tags with ["support_encryption","true"]
//	31317  tools: ["d","<id>/tools/list"], ["s",<id>], per tool
//	       ["cap",<name>] or, priced, ["cap",<name>,"<sats or lo-hi>","sats"]
//	31318  resources: ["d","<id>/resources/list"], ["s",<id>],
//	       ["cap",<name>] per resource; and resource templates (as rev1.1):
//	       ["d","<id>/resources/templates/list"], ["s",<id>], ["cap",<name>]
//	31319  prompts (31319 is prompts here, templates in ContextVM):
//	       ["d","<id>/prompts/list"], ["s",<id>], ["cap",<name>] per prompt
//	       (priced prompts and resources: ["cap",<name>,"<sats>","sats"])
//	DVMCP 2024-11-05 (NIP-89):
//	31990  content {"name","about","tools":[...]}; ["d",<id>], ["k","5910"],
//	       ["capabilities","mcp-1.0"], ["t","mcp"], ["t",<tool>] per tool
//	With Config.Profile (CEP-23):
//	0      the key's profile: content the NIP-01 metadata {"name","about",
//	       "picture","website"} of Config (those set), no tags
//
// <id> is ServerID: the server's pubkey (hex), stable across renames.
// AnnouncementAddresses lists every address but the profile's; Unannounce
// publishes a NIP-09 deletion request of them all (`capvend unannounce`),
// leaving the profile: it names the key, whatever it sells. The relay list
// replaces any other NIP-65 list of the key: use a key of its own.
//
// # Elicitation
//
// An upstream asking for input during a ContextVM tools/call (an MCP
// elicitation) is relayed to the call's client as a JSON-RPC request of
// the server, published through the call's outbox (after the
// notifications before it, before the answer; gift wrapped iff the call
// came wrapped, in the kind of the call's answers):
//
//	kind 25910, tags ["p", <client>], ["e", <tools/call event id>]
//	{"jsonrpc":"2.0","id":"<64 hex: 256 random bits>","method":"elicitation/create","params":<the upstream's params>}
//
// The id is the server's own (the upstream's is never shown), unguessable
// and used once. The answer is the client's JSON-RPC response with that
// id, as a kind 25910 (plaintext or in a gift wrap) signed by the SAME
// pubkey the request went to and tagged ["p", <server>]; an e tag is not
// needed and not read:
//
//	{"jsonrpc":"2.0","id":"<the id>","result":{"action":"accept","content":{...}}}   (or "decline", "cancel")
//	{"jsonrpc":"2.0","id":"<the id>","error":{...}}
//
// It gets every inbound check (signature, window, size; with
// EncryptionRequired it must come wrapped). A response whose id no
// elicitation of that pubkey waits for (unknown, answered already, another
// client's) is dropped; so are responses in the DVMCP dialects. The
// upstream gets the result as {action, content} (content only on accept,
// and only a JSON object); an error response, a result that is not an
// ElicitResult, no answer within Config.ElicitTimeout (default 10 min),
// the call's end, or too many elicitations waiting (4 per client, 1000 in
// all) fail the upstream's elicitation (capvend's upstream client then
// answers it "cancel"); nothing of that reaches the client.
//
// Only clients whose last initialize declared capabilities.elicitation are
// asked (the server remembers it per pubkey, in memory: a client that
// skips initialize, or initialized before a restart, is not asked); for
// others, and for params that are not a JSON object, the upstream is
// answered "decline" at once.
//
// The stock @contextvm/sdk client (0.11.14) cannot answer: its transport
// drops a server's JSON-RPC request ("Received unsupported JSON-RPC message
// type"), so a call that elicits waits until the client's own request
// timeout; the stock server never sends one either.
//
// # list_changed
//
// The initialize result advertises listChanged for tools (and prompts and
// resources with a Catalog). AnnounceDelay after a Refresh (Refreshes
// meanwhile coalesced), Run compares the lists with those of the last
// comparison (the first: when Run started): the tools/list result and its
// cap tags (names, schemas, prices), the Catalog's prompts, and its
// resources with their templates. For each list that changed, each
// ContextVM client whose request was served within Config.Window (at most
// the 1000 most recent) gets a notification, as the stock server sends
// them:
//
//	kind 25910, tags ["p", <client>] (no e tag)
//	{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}   (prompts/list_changed, resources/list_changed)
//
// gift wrapped (in the kind of the answers to it) iff the client's last
// request came wrapped. It runs on a goroutine of Run (Refresh never
// blocks); failures are logged, not retried, and a round stops after 3
// failures in a row. DVMCP and NIP-90 clients are not notified.
//
// DVMCP initialize answers carry ["d", ServerID] (clients name the server
// with it in later requests' s tags).
//
// # Several servers, one key
//
// Servers sharing a secret key and a ledger (Config.Claims) all receive
// every request. Without Config.Members each claims every request's
// event id in the ledger (one write per request and server) and the
// winner serves it. With Members the requests are sharded: each server
// holds a member lease (MemberLease, renewed every MemberTTL/3) and reads
// the member set every sample S (Config.ShardSample). A request's owner
// under a view (a member set) is the member with the highest hash of
// member and request id (rendezvous hashing: a member joining or leaving
// moves only the requests it gains or had). The request id is the event
// id (a gift wrap's rumor's, known once unwrapped; a plaintext request's
// is decided before its signature is checked, so the others' requests
// cost a JSON peek). Let F = 3S (fresh) and T = 9S (stable); a view's age
// is the time since this server first read it, and a gap of more than F
// between two reads starts it again, with itself as its predecessor (the
// server stayed a member: with rendezvous hashing, a request it owns
// after one change it owned before, unless its owner left). A joiner's
// first view has no predecessor. A server decides a request on arrival:
//
//   - its view is stale (its last read started over F ago): dropped;
//   - it owns the request, the view T old: served, nothing written;
//   - it owns the request, the view F old: claimed, served if the claim holds;
//   - it owned the request under the view before, the view under F old:
//     claimed, served if the claim holds;
//   - it is alone in a view without predecessor (the first instance
//     starting): claimed, served if the claim holds;
//   - otherwise dropped.
//
// Why each request is answered once. Every server deciding has read the
// member set within F (reads are at most F apart, or the view starts
// again). Assume the member set does not change twice within F. If X
// serves r unclaimed under V (read for T) and Y serves r under W (read
// for F or more, claimed or not), then within the last F one of them
// read between two reads of the other, which saw one set both times: V =
// W, and r has one owner under it. Two servers that both claim r are
// decided by the claim (one write wins). The prev rule lets the old owner
// serve a request that moved for F after it sees a change, while the new
// owner waits F for every server to have seen it; both claim, so a moved
// request is answered once and not dropped (a joiner's lease is written
// before it subscribes, and it reads its view at once).
//
// Changes within F: two servers starting at once only claim until their
// views are F old; a server that joins and leaves within F never serves,
// and the others' owners under the set before and after it are the same
// (rendezvous hashing). The one change the others can see and a member
// may not is its own lease running out and renewed between two of its
// reads: a server whose renewal is late (ttl - F since the last) serves
// nothing, and one that renews a lease that ran out starts its view
// again, as a joiner. Clocks of the servers must agree well within S
// (leases expire by the reader's clock).
//
// A dead (or stalled) server's requests are dropped until its member
// lease runs out and the others count it out (MemberTTL + F at most);
// the client sends again, and the claims' takeover rule
// (ledger.Options.ClaimTakeover) still applies to what it claimed. A server that
// stops leaves: it releases its lease, reads the member set, and goes on
// reading requests for F + S, serving (by claim) the ones it owned, as
// the others may see it leave up to S after it and serve them F after
// that; then Run stops reading and lets the requests in flight finish. A copy of a request delivered again
// more than F later, across a change, to its new owner is answered again
// (from the stored reply, if kept: a priced call is bound to one call in
// the ledger by its request id and never runs twice). Without Members
// (SQLite, one server) nothing of this runs.
//
// # Oversized transfer (CEP-22)
//
// A ContextVM message too large for one event goes as a sequence of
// notifications/progress frames under the request's progressToken
// (package oversized holds the wire form, cutting and reassembly):
//
//	start  progress 1   {"progressToken":T,"progress":1,"message":"starting oversized transfer",
//	                     "cvm":{"type":"oversized-transfer","frameType":"start","completionMode":"render",
//	                            "digest":"sha256:<hex of the message's UTF-8>","totalBytes":B,"totalChunks":N}}
//	chunk  2 .. N+1     {"progressToken":T,"progress":P,"cvm":{"type":"oversized-transfer","frameType":"chunk","data":"..."}}
//	end    N+2          {"progressToken":T,"progress":N+2,"message":"oversized transfer complete",
//	                     "cvm":{"type":"oversized-transfer","frameType":"end"}}
//
// each the params of a full JSON-RPC notification in its own kind 25910
// event, signed, and gift wrapped on its own (a fresh key each) when the
// request came wrapped. The message is the exact JSON-RPC string (with
// "jsonrpc" and the id); chunks are whole code points.
//
// Out: the server advertises ["support_oversized_transfer"] on 11316 and
// the first answer to each ContextVM client. An answer or notification
// (or elicitation request) about a request is sent as frames when its
// published event is over the limits of the relays (each relay's NIP-11
// limitation.max_message_length and max_content_length, read at start
// and kept an hour; 48,000 bytes, the stock SDK's threshold, for a relay
// that advertises none; the smallest of all), or its gift wrap's inner
// event over NIP-44's 65,535 bytes, and the request is ContextVM with
// params._meta.progressToken (echoed as it came) from a client that sent
// a support_oversized_transfer tag on any event (remembered per pubkey).
// Chunks are as large as fit every relay (measured as published). The
// start frame carries the answer's tags (discovery, cap ...), the others
// p and e (the request event). Frames are published in order, each relay
// getting one after it answered the one before (the stock receiver drops
// a chunk that comes before its start); a frame no relay takes ends the
// transfer with an abort frame and the error answer of Publishing (the
// stock client only logs an abort). Otherwise an answer too large is
// sent whole anyway (a relay that advertises no limit may take it), or,
// when it cannot go (over every advertised limit, or a wrap over NIP-44's
// limit), replaced by that error answer.
//
// In: frames from a client (a notifications/progress whose params.cvm.type
// is "oversized-transfer") are taken before anything else, in any order
// (events are handled concurrently: a chunk or the end may come before the
// start), with chunks from progress 2, or from 3 when the client left 2
// to an accept (the stock client then sends chunks at once without
// waiting for it), more than the stock receiver's window of 21 included.
// Bounds: Config.MaxRequestBytes (1 MiB) per message; per client 4
// transfers and twice that many bytes; Config.MaxReassemblyBytes (64 MiB)
// and 64 transfers in all (a transfer counts its totalBytes from its
// start); 10,000 chunks; a window of 64 chunks ahead of the first
// missing one; 30 s without a frame, 5 minutes in all, 5 s after its end
// with a chunk missing. A start from a client that has not had an answer
// yet is answered with an accept frame (progress 2, tagged p and the
// discovery tags). The completed message (length and digest checked, a
// ContextVM JSON-RPC message) is served as a request whose event is the
// end frame's: its id is the RequestID and the answers' e tag (the stock
// client waits for the answer to its end frame), its tags the end
// frame's with the start frame's pmi, payment_interaction,
// support_encryption* and support_oversized_transfer; it is Public
// (vend refuses bearer secrets in it) unless every frame came wrapped,
// and its answers are wrapped like the end frame. A transfer that fails
// (digest, length, limits, sequence, time) is logged, counted and
// answered with {"jsonrpc":"2.0","error":{"code":-32600,"message":
// "Invalid Request: oversized transfer failed: ..."}} (no id: the
// client's is in the frames) tagged e with its end frame when it came
// (also when it comes after the failure), else with an abort frame.
// With several servers sharing a key, every server reassembles (frames
// are never dropped by preShard) and the end frame's id decides.
//
// # Publishing
//
// Each relay's answer to each event is counted per relay and reason
// class (PublishStats: the NIP-01 prefix of its OK false, blocked,
// invalid, rate-limited ...; or timeout, connection, too-large) and a
// refusal is logged with the relay's own words (at Warn, once per 10 s
// per relay and class; every one at Debug). An event over a relay's
// advertised limit is not sent to it (too-large); a relay that closes the
// connection on an event over 48,000 bytes (go-nostr reports that lost
// OK as a success: the connection is checked) is taken to have such a
// limit for an hour. An event no relay took is published again, after
// 250 ms, doubling, while some relay's failure may pass (timeout,
// connection, rate-limited, mute, error, other), within PublishTimeout.
// An answer that still did not go is replaced by
//
//	{"jsonrpc":"2.0","id":<the request's>,"error":{"code":-32058,"message":"Answer not delivered: ..."}}
//
// in the request's dialect (a small event may go where a large one did
// not), and counted (Undelivered). The answer was kept all the same (a
// paid call's result by the Vendor, others in Config.Replies): the same
// request event sent again gets it.
package ctxvm
