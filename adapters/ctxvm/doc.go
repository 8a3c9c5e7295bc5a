// Package ctxvm is capvend's Nostr front: it serves the Vendor's priced
// tools, prompts and resources to MCP clients that talk through Nostr
// relays, in the ContextVM dialect (the @contextvm/sdk client transport
// and compatible ones) and in the three DVMCP dialects (2025-03-26 rev1
// and rev1.1, and the NIP-90 form of 2024-11-05). Each request is
// answered in its own dialect and kinds.
//
// # What it owns
//
// A [Server] subscribes to the relays, checks every request event (id,
// signature, age, size, access lists, proof of work), opens gift wraps
// (NIP-44, NIP-59), turns the request into a vend.CallRequest, and
// publishes the Vendor's notifications and answer back, signed, and
// wrapped when the request was. Around that it owns the rest of the
// service on Nostr: announcements (ContextVM CEP-6, DVMCP, NIP-89) and
// the key's profile (CEP-23), list_changed notifications, an upstream's
// elicitations relayed to the client, Cashu direct payments (CEP-8),
// oversized transfers (CEP-22, whose wire form is package oversized),
// publishing with retries and per-relay counts, and, for servers sharing
// a key and a ledger, which one answers a request (claims, or shards by
// rendezvous hashing).
//
// # How it fits
//
// It imports vend (the Vendor's interface, requests and errors),
// adapters/rpcerr (vend's errors as the JSON-RPC errors every front
// sends), pricing and go-nostr. It knows nothing of billing or the
// ledger: the stores it needs (Config.Replies, Config.Claims,
// Config.Members) are interfaces the ledger implements, and internal/cli
// wires them together in `capvend serve` (and `capvend unannounce`).
//
// # Protocol reference
//
// docs/CONTEXTVM.md holds the wire, section by section with the spec each
// part implements: subscriptions and relays, the dialects and their kinds,
// inbound checks, methods, how a request becomes a call, errors, direct
// payments, proof of work and load, encryption, access lists,
// announcements, elicitation, list_changed, oversized transfer,
// publishing, and why servers sharing one key answer each request once.
// docs/PAYING.md shows a priced call from the client's side.
package ctxvm
