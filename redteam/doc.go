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
// Every test ends with the money invariant: the example MCP server that
// capvend sells (cmd/example-tools with --calls-log) writes one line per
// request it executes, and for each such execution of a priced item the
// ledger must hold exactly one call for exactly that kind, name and
// canonical argument hash (vend.CanonicalHash), quoted at least the
// price in force, whose one settled payment covers its quote (or, for a
// failed call, whose hold invoice was canceled); a call the ledger says
// was delivered must have run; free-quota executions must match a
// free_uses row. Then `capvend ledger verify` must exit 0, and the
// capvend under attack (built with -race when the tests are) must report
// no data race. On top of that, each test asserts its item of issue 11:
//
//	request key bound to the call (holes 1, 3)  TestReusedIDOtherTool, TestReusedIDOtherToolStdio,
//	                                            TestReusedIDOtherToolNostr, TestReusedIDFreeQuota,
//	                                            TestReusedIDFreeQuotaNostr
//	only issued sessions; idle expiry; a bound  TestMadeUpSession, TestSessionIdleExpiry, TestSessionCountBounded
//	identities cost something (quotas)          TestQuotaIdentityHTTPSessions, TestQuotaIdentityNostrKeys,
//	                                            TestNostrProofOfWork, TestHTTPClientIdentity
//	invoice spam does not close the shop        TestInvoiceSpamNostr, TestInvoiceSpamHTTP
//	disconnect at the instant of payment        TestDisconnectAtPayment
//	refunds are money                           TestRefundCashuTokenAsMoney, TestRefundPlainInvoiceOwed
//	arguments parsed once                       TestDuplicateArgumentKeys
//	listed URI priced by a URI template         TestPricedURITemplate
//	HTTP server hardening                       TestHTTPOrigin, TestHTTPBearerToken, TestHTTPTimeouts,
//	                                            TestHTTPConnectionCap, TestHTTPClientIdentity
//	secrets                                     TestSecretFilePermissions, TestUpstreamEnvironment
//	SIGHUP                                      TestSIGHUPPaidGrantBecomesFree, TestSIGHUPPromptPriceNoRestartWarning
//	ledger verify's blind spots                 TestLedgerVerifyBlindSpots
//
// (The Cashu swap crash window, the run->resume deadlock and the bounds
// of capvend's internal maps are not observable from outside the process:
// their tests are in the packages that own them.)
//
// # Running it
//
//	go run ./cmd/capvend testnet build   # once: btcd and lnd, cached
//	go test -race ./redteam/
//
// It builds capvend (with -race when the tests are: the one under attack,
// which runs the ledger commands too) while the regtest stack comes up
// (the one every test binary of the `go test` run shares:
// testnet/teststack), and runs a capvend per test, on 127.0.0.1 only (the
// HTTP flood also connects from 127.0.0.2 to .21 and .100, which Linux
// routes to the loopback); every wait and loop is bounded. The tests and
// their subtests run in parallel, 12 at a time unless -parallel says
// otherwise: each has its own capvend, ledger, upstream and keys, and they
// mostly wait (for capvend to start and stop, payments, timeouts). It
// takes about a minute on a 2-core machine once the stack is up. Without
// the regtest binaries, or those loopback addresses, the tests that need
// them are skipped saying what is missing, and fail when CI is set; with
// -short all are skipped. CAPVEND_REDTEAM_SERVE=/path/to/capvend attacks
// that build instead of this tree's (e.g. an older commit's, to see which
// tests fail where the holes are open).
package redteam
