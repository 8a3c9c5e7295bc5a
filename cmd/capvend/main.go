// Command capvend sells MCP tool calls for sats: see README.md, or run
// `capvend --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, rootCommand(), defaultEnv(), os.Args[1:])
	stop()
	os.Exit(code)
}
