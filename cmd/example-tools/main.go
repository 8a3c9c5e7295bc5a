// Command example-tools is a small MCP server shipped with capvend to sell
// in the demo and the tests (see package testnet/exampletools). It serves
// MCP over stdio, or over Streamable HTTP at /mcp with --http ADDR.
//
// With --calls-log FILE it appends to FILE (mode 0600) one JSON line per
// tools/call, prompts/get and resources/read it executes (method, name,
// arguments as received), written before it answers, after a first line
// {"method":"start"} holding its pid and environment: the upstream's own
// account of what ran, for tests to hold against capvend's ledger.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/mark3labs/mcp-go/server"

	"github.com/capvend/capvend/testnet/exampletools"
)

func main() {
	addr := flag.String("http", "", "serve Streamable HTTP at http://`ADDR`/mcp instead of stdio")
	callsLog := flag.String("calls-log", "", "append one JSON line per executed request to `FILE`")
	byteCount := flag.Bool("byte-count", false, "also offer byte_count, which reads its arguments without regard to case")
	bulk := flag.Bool("bulk", false, "also offer bulk, which answers a text of kib KiB (large answers: CEP-22 oversized transfers)")
	flag.Parse()
	opts := exampletools.Options{ByteCount: *byteCount, Bulk: *bulk}
	if *callsLog != "" {
		f, err := os.OpenFile(*callsLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		start := exampletools.Record{Method: exampletools.MethodStart, PID: os.Getpid(), Env: os.Environ()}
		if err := exampletools.WriteRecord(f, start); err != nil {
			log.Fatal(err)
		}
		opts.CallsLog = f
	}
	s := exampletools.NewServerWith(opts)
	if *addr == "" {
		if err := server.ServeStdio(s); err != nil {
			log.Fatal(err)
		}
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", server.NewStreamableHTTPServer(s))
	fmt.Fprintf(os.Stderr, "example-tools: serving MCP at http://%s/mcp\n", *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
