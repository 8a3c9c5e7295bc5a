// Command example-tools is a small MCP server shipped with capvend to sell
// in the demo and the tests (see package testnet/exampletools). It serves
// MCP over stdio, or over Streamable HTTP at /mcp with --http ADDR.
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
	flag.Parse()
	s := exampletools.NewServer()
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
