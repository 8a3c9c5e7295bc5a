// Package redteam is capvend's adversarial suite: tests (and only tests)
// that drive the real capvend binary on the regtest stack (btcd, LND
// nodes, a Cashu mint, a Nostr relay; see package testnet) over every
// front it serves (MCP Streamable HTTP, stdio, ContextVM plain and gift
// wrapped, DVMCP rev1 and rev1.1, NIP-90) the way an attacker would:
// reused request ids, made-up sessions, fresh identities, floods,
// disconnects at the instant of payment, duplicate argument keys, forged
// origins, leaked secrets.
//
// # What it proves
//
// Every test ends with the money invariant (invariant_test.go): each
// execution of a priced item the upstream saw was paid for, exactly once,
// for exactly that call; `capvend ledger verify` exits 0; the capvend
// under attack reports no data race. On top of that, each test asserts
// one item of the money-safety issue (#11), and TestCrossProductOfWaysToPay
// presents every credential of vend.Schemes by every channel.
//
// # How it fits
//
// What it attacks is the built binary, from outside, on the stack that
// testnet/teststack shares with the other packages' tests. Of capvend's
// own packages its tests use only vend's table of ways to pay, its wire
// keys and CanonicalHash, and ctxvm's direct payment PMI.
//
// # Running it
//
//	go run ./cmd/capvend testnet build   # once: btcd and lnd, cached
//	go test -race ./redteam/
//
// docs/TESTING.md, "redteam: the adversarial suite", has the invariant in
// full, which test proves which item, and how the suite runs (parallel,
// on loopback only, what it skips, CAPVEND_REDTEAM_SERVE).
package redteam
