// Package capvendtest is capvend's end-to-end test harness: Start runs
// capvend (in the test binary, through the entry package cli's tests
// inject, or as the built binary), and around it the example-tools
// upstream, free ports, the configuration files the tests write and
// edit, the PostgreSQL test database, HTTP and MCP requests, the
// customer node's side of payments, node scripts and benchmark figures.
// It does not import package cli (internal/cli), whose tests import it.
//
// Every function fails the test it is given (t.Fatal) rather than
// returning an error, unless its doc says otherwise.
package capvendtest
