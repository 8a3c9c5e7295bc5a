package ctxvm

import (
	"encoding/json"
	"strings"

	"github.com/nbd-wtf/go-nostr"
)

// dialect is the wire form a request came in, and its answers go out in.
type dialect int

const (
	dialectContextVM dialect = iota // kind 25910 both ways, full JSON-RPC
	dialectRev1                     // DVMCP 2025-03-26 rev1: 25910 -> 26910 / 21316, full JSON-RPC
	dialectRev11                    // DVMCP 2025-03-26 rev1.1: as rev1, content without jsonrpc/id, result at the root
	dialectNIP90                    // DVMCP 2024-11-05: 5910 -> 6910 / 7000 (NIP-90 jobs)
)

func (d dialect) String() string {
	switch d {
	case dialectRev1:
		return "dvmcp-rev1"
	case dialectRev11:
		return "dvmcp-rev1.1"
	case dialectNIP90:
		return "dvmcp-nip90"
	}
	return "contextvm"
}

// transport is vend.CallRequest.Transport of the dialect's calls.
func (d dialect) transport() string {
	switch d {
	case dialectRev1, dialectRev11:
		return TransportDVMCP
	case dialectNIP90:
		return TransportNIP90
	}
	return Transport
}

// Tags read and written by the DVMCP dialects.
const (
	tagMethod    = "method"
	tagServer    = "s"
	tagCommand   = "c"
	tagStatus    = "status"
	tagAmount    = "amount"
	tagInvoice   = "invoice"
	tagEphemeral = "support_encryption_ephemeral"
)

// NIP-90 commands (the c tag).
const (
	cmdListTools   = "list-tools"
	cmdExecuteTool = "execute-tool"
)

// parseMessage reads a kind 25910 request's content and tags: the
// dialect, and the message as JSON-RPC (a rev1.1 request gets no id).
//
// A content without "jsonrpc" is rev1.1; with "jsonrpc" (it must be
// "2.0"), a method tag makes it rev1, else it is ContextVM (whose drafts
// also use s tags, so an s tag alone decides nothing). A method tag that
// disagrees with the content's method is refused.
func parseMessage(ev *nostr.Event) (dialect, message, error) {
	var raw struct {
		JSONRPC *string         `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if !isObject(ev.Content) {
		return 0, message{}, ErrNotJSONRPC
	}
	if err := json.Unmarshal([]byte(ev.Content), &raw); err != nil {
		return 0, message{}, ErrNotJSONRPC // also with anything after the object
	}
	if len(raw.ID) > 0 && !validID(raw.ID) {
		return 0, message{}, ErrNotJSONRPC
	}
	mt := findTag(ev.Tags, tagMethod)
	if mt != nil && (len(mt) < 2 || mt[1] != raw.Method) {
		return 0, message{}, ErrTagMismatch
	}
	if raw.JSONRPC == nil {
		// rev1.1: requests are {method, params}; a client's response
		// (no method) is dropped by handle like any other.
		return dialectRev11, message{Method: raw.Method, Params: raw.Params}, nil
	}
	if *raw.JSONRPC != "2.0" {
		return 0, message{}, ErrNotJSONRPC
	}
	m := message{JSONRPC: "2.0", ID: raw.ID, Method: raw.Method, Params: raw.Params}
	if mt != nil {
		return dialectRev1, m, nil
	}
	if raw.Method == "" {
		m.Result, m.Error = raw.Result, raw.Error
	}
	return dialectContextVM, m, nil
}

// isObject says whether s starts like a JSON object (json.Decoder takes
// null for an empty struct).
func isObject(s string) bool {
	t := strings.TrimLeft(s, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// findTag returns the first tag named key, with or without values
// (go-nostr's Tags.Find skips a tag without a value).
func findTag(tags nostr.Tags, key string) nostr.Tag {
	for _, t := range tags {
		if len(t) > 0 && t[0] == key {
			return t
		}
	}
	return nil
}

// notification says whether r expects no answer.
func (r *request) notification() bool {
	switch r.dialect {
	case dialectRev11:
		return strings.HasPrefix(r.msg.Method, "notifications/")
	case dialectNIP90:
		return false
	}
	return len(r.msg.ID) == 0 || string(r.msg.ID) == "null"
}

// draft is an event to sign (and maybe wrap) and publish.
type draft struct {
	kind     int
	content  string
	tags     nostr.Tags
	response bool // the one that carries the discovery tags
}

// drafts encodes one outgoing message about r in r's dialect: usually one
// event, two for a NIP-90 job's end (feedback, then the result), none for
// a notification the dialect has no form for.
func (o *outbox) drafts(e outEvent) []draft {
	r := o.r
	corr := nostr.Tags{{"p", r.ev.PubKey}, {"e", r.ev.ID}}
	switch r.dialect {
	case dialectRev1, dialectRev11:
		return dvmcpDrafts(r, e, corr)
	case dialectNIP90:
		return nip90Drafts(r, e, corr)
	}
	if e.response {
		return []draft{{kind: KindMessage, content: jsonrpcResponse(r.msg.ID, e.result, e.rerr), tags: append(corr, e.tags...), response: true}}
	}
	if e.id != "" {
		return []draft{{kind: KindMessage, content: jsonrpcRequest(e.id, e.method, e.params), tags: corr}}
	}
	return []draft{{kind: KindMessage, content: jsonrpcNotification(e.method, e.params), tags: append(corr, e.tags...)}}
}

// jsonrpcResponse is a full JSON-RPC 2.0 response.
func jsonrpcResponse(id, result json.RawMessage, rerr *rpcError) string {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	resp := struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result,omitempty"`
		Error   *rpcError       `json:"error,omitempty"`
	}{JSONRPC: "2.0", ID: id, Result: result, Error: rerr}
	return marshal(resp)
}

// jsonrpcRequest is a full JSON-RPC 2.0 request with a string id.
func jsonrpcRequest(id, method string, params any) string {
	return marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		ID      string `json:"id"`
		Method  string `json:"method"`
		Params  any    `json:"params,omitempty"`
	}{"2.0", id, method, params})
}

// jsonrpcNotification is a full JSON-RPC 2.0 notification.
func jsonrpcNotification(method string, params any) string {
	return marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params,omitempty"`
	}{"2.0", method, params})
}

// marshal encodes v; the values passed here always encode.
func marshal(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return `{}`
	}
	return string(b)
}

// bareCaps rewrites ContextVM cap tags ("tool:<name>") to the DVMCP form
// (the bare name), other tags unchanged.
func bareCaps(tags nostr.Tags) nostr.Tags {
	out := make(nostr.Tags, 0, len(tags))
	for _, t := range tags {
		if len(t) >= 2 && t[0] == "cap" && strings.HasPrefix(t[1], "tool:") {
			t = append(nostr.Tag{t[0], strings.TrimPrefix(t[1], "tool:")}, t[2:]...)
		}
		out = append(out, t)
	}
	return out
}

// paymentParams reads the params of vend's payment notifications
// (vend.PaymentOption for payment_required; amount, pmi, message for the
// others) whatever their Go type.
type paymentParams struct {
	Amount  int64  `json:"amount"`
	PayReq  string `json:"pay_req"`
	PMI     string `json:"pmi"`
	Message string `json:"message"`
}

func readPayment(params any) paymentParams {
	var p paymentParams
	if b, err := json.Marshal(params); err == nil {
		_ = json.Unmarshal(b, &p)
	}
	return p
}
