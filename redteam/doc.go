// Package redteam is capvend's adversarial suite: tests (and only tests)
// that drive the real capvend binary on the regtest stack (btcd, LND
// nodes, a Cashu mint, a Nostr relay; see package testnet) over every
// front it serves (MCP Streamable HTTP, stdio, ContextVM plain and gift
// wrapped, DVMCP rev1 and rev1.1, NIP-90) the way an attacker would:
// reused request ids, made-up sessions, fresh identities, floods,
// disconnects at the instant of payment, duplicate argument keys, forged
// origins, leaked secrets.
//
// Every test ends with the money invariant: the example MCP server that
// capvend sells (cmd/example-tools with --calls-log) writes one line per
// request it executes, and for each such execution of a priced item the
// ledger must hold exactly one call for exactly that kind, name and
// canonical argument hash (vend.CanonicalHash) whose payment was settled
// for at least its quote (or, for a failed call, whose hold invoice was
// canceled); free-quota executions must match a free_uses row. Then
// `capvend ledger verify` must exit 0.
//
// Run it with `go test -race ./redteam/`; it needs the regtest binaries
// (`go run ./cmd/capvend testnet build`) and is skipped with -short.
package redteam
