package ctxvm

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/vend"
)

// DVMCP 2024-11-05 (NIP-90 jobs) event kinds.
const (
	KindJobRequest  = 5910
	KindJobResult   = 6910
	KindJobFeedback = 7000
)

// TransportNIP90 is vend.CallRequest.Transport of calls in the DVMCP
// 2024-11-05 (NIP-90) dialect.
const TransportNIP90 = "nostr-nip90"

// parseJob reads a kind 5910 job request: its c tag (list-tools or
// execute-tool, any other is answered "Method not found") and content
// become the JSON-RPC request it stands for. list-tools' content is empty
// or any JSON; execute-tool's is {"name", "parameters", "_meta"?} (_meta
// is capvend's: cashu token, preimage, pmi), and becomes tools/call's
// {"name", "arguments", "_meta"}.
func parseJob(ev *nostr.Event) (message, string, error) {
	c := ev.Tags.Find(tagCommand)
	if len(c) < 2 || c[1] == "" {
		return message{}, "", ErrNotJob
	}
	cmd := c[1]
	if ev.Content != "" && !json.Valid([]byte(ev.Content)) {
		return message{}, "", ErrNotJSONRPC
	}
	switch cmd {
	case cmdListTools:
		return message{Method: "tools/list"}, cmd, nil
	case cmdExecuteTool:
		var job struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Meta       json.RawMessage `json:"_meta"`
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(ev.Content)))
		if err := dec.Decode(&job); err != nil || dec.More() || !isObject(ev.Content) {
			return message{}, "", ErrNotJSONRPC
		}
		params, err := json.Marshal(struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments,omitempty"`
			Meta      json.RawMessage `json:"_meta,omitempty"`
		}{job.Name, job.Parameters, job.Meta})
		if err != nil { // parameters or _meta not JSON values
			return message{}, "", ErrNotJSONRPC
		}
		return message{Method: "tools/call", Params: params}, cmd, nil
	}
	return message{Method: "nip90/" + cmd}, cmd, nil
}

// nip90Drafts encodes e for a NIP-90 client.
//
// The answer is a kind 6910 tagged ["c", "<command>-response"], e and p,
// its content the result itself ({"tools": [...]} or a CallToolResult).
// A job that ran ends with feedback first: kind 7000 ["status","success"],
// or ["status","error","<message>"] when the call failed (the 6910 then
// carries {"content":[{"type":"text","text":"<message>"}],"isError":true})
// or the tool reported isError. Payment notifications are kind 7000
// feedback: payment_required ["status","payment-required"]
// ["amount","<millisats>","<bolt11>"] (NIP-90 amounts are millisats),
// payment_accepted and progress ["status","processing"(,"<message>")],
// payment_rejected ["status","error","<reason>"]. Other notifications have
// no NIP-90 form and are not sent.
func nip90Drafts(r *request, e outEvent, corr nostr.Tags) []draft {
	feedback := func(content string, status ...string) draft {
		return draft{kind: KindJobFeedback, content: content, tags: append(nostr.Tags{append(nostr.Tag{tagStatus}, status...)}, corr...)}
	}
	if e.response {
		tags := append(nostr.Tags{{tagCommand, r.command + "-response"}}, corr...)
		if e.rerr != nil {
			body := marshal(map[string]any{"content": []map[string]string{{"type": "text", "text": e.rerr.Message}}, "isError": true})
			return []draft{feedback(e.rerr.Message, statusError, e.rerr.Message),
				{kind: KindJobResult, content: body, tags: append(tags, nostr.Tag{tagStatus, statusError}), response: true}}
		}
		content := rootResponse(e.result, nil)
		if r.command != cmdExecuteTool {
			return []draft{{kind: KindJobResult, content: content, tags: append(tags, bareCaps(e.tags)...), response: true}}
		}
		var res struct {
			IsError bool `json:"isError"`
		}
		_ = json.Unmarshal(e.result, &res)
		status := statusSuccess
		fb := feedback("", statusSuccess)
		if res.IsError {
			status = statusError
			fb = feedback("", statusError, "tool error")
		}
		return []draft{fb, {kind: KindJobResult, content: content, tags: append(tags, nostr.Tag{tagStatus, status}), response: true}}
	}
	p := readPayment(e.params)
	switch e.method {
	case vend.NotifyPaymentRequired:
		d := feedback("", statusPaymentRequired)
		msat := strconv.FormatInt(p.Amount*1000, 10)
		if p.PayReq != "" && (p.PMI == "" || p.PMI == vend.PMILightning) {
			d.tags = append(d.tags, nostr.Tag{tagAmount, msat, p.PayReq})
		} else {
			d.tags = append(d.tags, nostr.Tag{tagAmount, msat}, nostr.Tag{tagPMI, p.PMI})
		}
		return []draft{d}
	case vend.NotifyPaymentAccepted:
		return []draft{feedback("", statusProcessing)}
	case vend.NotifyPaymentRejected:
		msg := p.Message
		if msg == "" {
			msg = "payment rejected"
		}
		return []draft{feedback(msg, statusError, msg)}
	case vend.NotifyProgress:
		if p.Message != "" {
			return []draft{feedback("", statusProcessing, p.Message)}
		}
		return []draft{feedback("", statusProcessing)}
	}
	return nil
}
