package ctxvm

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/vend"
)

// DVMCP (2025-03-26 rev1 and rev1.1) event kinds; requests are KindMessage.
const (
	KindDVMCPResponse     = 26910
	KindDVMCPNotification = 21316
)

// TransportDVMCP is vend.CallRequest.Transport of calls in the DVMCP
// 2025-03-26 dialects (rev1 and rev1.1).
const TransportDVMCP = "nostr-dvmcp"

// DVMCP payment statuses (the status tag of kind 21316 and 7000 events).
const (
	statusPaymentRequired = "payment-required"
	statusPaymentAccepted = "payment-accepted"
	statusProcessing      = "processing"
	statusSuccess         = "success"
	statusError           = "error"
)

// dvmcpDrafts encodes e for a rev1 or rev1.1 client.
//
// The answer is a kind 26910 tagged p and e: rev1's content is the full
// JSON-RPC response; rev1.1's is the result itself, or {"error": ...}.
// vend's payment notifications become DVMCP's tag-only kind 21316
// events (empty content, or the reason for an error):
//
//	payment_required  ["status","payment-required"] ["amount","<sats>","<bolt11>"] ["invoice","<bolt11>"]
//	payment_accepted  ["status","payment-accepted"] ["amount","<sats>"]
//	payment_rejected  ["status","error"], content the reason
//
// The amount tag is the spec's (sats, then the bolt11); the invoice tag
// is where the DVMCP bridge and its discovery client put (and read) the
// bolt11. A payment_required without a bolt11 (a Cashu-only option)
// carries ["amount","<sats>"] and the pmi in ["pmi", ...]. Every other
// notification is an MCP notification in kind 21316 (content in the
// dialect's form) tagged p, e and ["method", <method>].
func dvmcpDrafts(r *request, e outEvent, corr nostr.Tags) []draft {
	if e.response {
		var content string
		if r.dialect == dialectRev11 {
			content = rootResponse(e.result, e.rerr)
		} else {
			content = jsonrpcResponse(r.msg.ID, e.result, e.rerr)
		}
		return []draft{{kind: KindDVMCPResponse, content: content, tags: append(corr, bareCaps(e.tags)...), response: true}}
	}
	switch e.method {
	case vend.NotifyPaymentRequired:
		p := readPayment(e.params)
		tags := nostr.Tags{{tagStatus, statusPaymentRequired}}
		amount := strconv.FormatInt(p.Amount, 10)
		if p.PayReq != "" && (p.PMI == "" || p.PMI == vend.PMILightning) {
			tags = append(tags, nostr.Tag{tagAmount, amount, p.PayReq}, nostr.Tag{tagInvoice, p.PayReq})
		} else {
			tags = append(tags, nostr.Tag{tagAmount, amount}, nostr.Tag{tagPMI, p.PMI})
		}
		return []draft{{kind: KindDVMCPNotification, tags: append(tags, corr...)}}
	case vend.NotifyPaymentAccepted:
		p := readPayment(e.params)
		tags := nostr.Tags{{tagStatus, statusPaymentAccepted}, {tagAmount, strconv.FormatInt(p.Amount, 10)}}
		return []draft{{kind: KindDVMCPNotification, tags: append(tags, corr...)}}
	case vend.NotifyPaymentRejected:
		p := readPayment(e.params)
		msg := p.Message
		if msg == "" {
			msg = "payment rejected"
		}
		return []draft{{kind: KindDVMCPNotification, content: msg, tags: append(nostr.Tags{{tagStatus, statusError}}, corr...)}}
	}
	var content string
	if r.dialect == dialectRev11 {
		content = marshal(struct {
			Method string `json:"method"`
			Params any    `json:"params,omitempty"`
		}{e.method, e.params})
	} else {
		content = jsonrpcNotification(e.method, e.params)
	}
	return []draft{{kind: KindDVMCPNotification, content: content, tags: append(corr, nostr.Tag{tagMethod, e.method})}}
}

// rootResponse is rev1.1's response content: the result object itself, or
// {"error": {...}}.
func rootResponse(result json.RawMessage, rerr *rpcError) string {
	if rerr != nil {
		return marshal(struct {
			Error *rpcError `json:"error"`
		}{rerr})
	}
	if len(result) == 0 {
		return `{}`
	}
	return string(result)
}

// Completer is a Catalog that can also complete prompt and resource
// arguments (MCP completion/complete), checked by type assertion.
type Completer interface {
	// Complete answers a completion/complete with params (a JSON object
	// with ref and argument) and returns an MCP CompleteResult as JSON.
	// Errors as for Catalog.GetPrompt.
	Complete(ctx context.Context, params json.RawMessage) (json.RawMessage, error)
}

// emptyCompletion answers completion/complete when the Catalog cannot.
var emptyCompletion = json.RawMessage(`{"completion":{"values":[]}}`)

// complete serves completion/complete: forwarded to a Catalog that is a
// Completer, else answered with no suggestions.
func (s *Server) complete(ctx context.Context, params json.RawMessage) (json.RawMessage, *rpcError) {
	var p struct {
		Ref      *json.RawMessage `json:"ref"`
		Argument *struct {
			Name string `json:"name"`
		} `json:"argument"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.Ref == nil || p.Argument == nil || p.Argument.Name == "" {
		return nil, &rpcError{Code: rpcerr.CodeInvalidParams, Message: "Invalid params"}
	}
	c, ok := s.cfg.Catalog.(Completer)
	if !ok {
		return emptyCompletion, nil
	}
	res, err := c.Complete(ctx, params)
	if err != nil {
		s.log.Info("completion answered with an error", logKeyErr, err)
		if errors.Is(err, vend.ErrUpstream) {
			return nil, &rpcError{Code: rpcerr.CodeUpstream, Message: "Upstream server failed"}
		}
		return nil, &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
	}
	if !json.Valid(res) {
		return nil, &rpcError{Code: rpcerr.CodeInternal, Message: "Internal error"}
	}
	return res, nil
}
