// Package capvendtest holds the parts of capvend's test harness that do
// not need package main: the example-tools upstream, free ports, the
// configuration files the tests write and edit, the PostgreSQL test
// database, HTTP and MCP requests, the customer node's side of payments,
// node scripts and benchmark figures. cmd/capvend's tests start capvend
// itself (startCapvend) and use these around it.
//
// Every function fails the test it is given (t.Fatal) rather than
// returning an error, unless its doc says otherwise.
package capvendtest
