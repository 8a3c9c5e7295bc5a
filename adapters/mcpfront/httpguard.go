package mcpfront

import (
	"bytes"
	"encoding/json"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/adapters/rpcerr"
)

const (
	logKeyReason   = "reason"
	rpcerrInternal = rpcerr.CodeInternal
)

// isInitialize reports whether body is an initialize request.
func isInitialize(body []byte) bool {
	if !bytes.Contains(body, []byte(mcp.MethodInitialize)) {
		return false
	}
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == string(mcp.MethodInitialize)
}

// rpcID returns the id of the JSON-RPC request in body (a string or a
// number, as JSON), nil if it has none.
func rpcID(body []byte) []byte {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if len(body) == 0 || json.Unmarshal(body, &m) != nil || len(m.ID) == 0 {
		return nil
	}
	switch m.ID[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return m.ID
	}
	return nil
}

// jsonString encodes s as a JSON string.
func jsonString(s string) ([]byte, error) { return json.Marshal(s) }
