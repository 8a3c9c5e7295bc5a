package main

import (
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/mcpfront"
)

// payingInit is the initialize of a capvend-aware client: it declares the
// capvend/payments capability, so it gets the payment notifications (a
// client without it gets explicit gating as a tool result).
func payingInit() mcp.InitializeRequest {
	var r mcp.InitializeRequest
	r.Params.Capabilities.Experimental = map[string]any{mcpfront.CapabilityPayments: map[string]any{}}
	return r
}
