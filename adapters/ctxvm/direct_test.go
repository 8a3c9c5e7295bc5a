package ctxvm

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/rpcerr"
	"github.com/capvend/capvend/internal/ctxvmclient"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/vend"
)

// directCall is fakeVendor's "direct" tool: vend's cashu way to pay as
// the front sees it. A token in a plaintext request is refused naming
// encryption; "cashuBshort" underpays and "cashuBlost" meets a mint
// that stopped answering (both refused); any other token pays 21 sats
// with the change "cashuBchange"; no token gets a payment-required error.
func directCall(r vend.CallRequest) (vend.CallResult, error) {
	switch {
	case r.CashuToken == "":
		return vend.CallResult{}, &vend.PaymentRequiredError{Options: []vend.PaymentOption{{Amount: 21, PayReq: "lnbcrt210n1fake", PMI: vend.PMILightning, TTL: 600}}}
	case r.Public:
		return vend.CallResult{}, &vend.PublicSecretError{What: "a Cashu token"}
	case r.CashuToken == "cashuBshort":
		return vend.CallResult{}, fmt.Errorf("%w: %w", vend.ErrPaymentFailed, vend.ErrUnderpaid)
	case r.CashuToken == "cashuBlost":
		return vend.CallResult{}, fmt.Errorf("%w: swap: %w", vend.ErrPaymentFailed, vend.ErrMintUnavailable)
	}
	r.Notify(vend.NotifyPaymentAccepted, map[string]any{"amount": 21, "pmi": vend.PMICashu, "_meta": map[string]any{"change": "cashuBchange"}})
	return vend.CallResult{Body: json.RawMessage(`{"content":[{"type":"text","text":"direct:paid"}]}`)}, nil
}

// opened is an answer of the recorder: the event (out of its wrap) and
// its JSON-RPC message.
type opened struct {
	ev  nostr.Event
	msg ctxvmclient.Message
}

// open unwraps (with the client's key) and reads the recorder's answers.
func (r *rec) open(evs []nostr.Event) []opened {
	r.t.Helper()
	out := make([]opened, 0, len(evs))
	for _, ev := range evs {
		if ev.Kind == KindGiftWrap || ev.Kind == KindEphemeralGiftWrap {
			in, err := ctxvmclient.Unwrap(&ev, r.sk)
			if err != nil {
				r.t.Fatal(err)
			}
			ev = *in
		}
		var m ctxvmclient.Message
		if err := json.Unmarshal([]byte(ev.Content), &m); err != nil {
			r.t.Fatalf("answer %s: %v", ev.Content, err)
		}
		out = append(out, opened{ev: ev, msg: m})
	}
	return out
}

// TestDirectPayment: a CEP-8 ["direct_payment", pmi, token] tag is the
// request's Cashu token (winning over the _meta alias; a PMI the server
// does not take is ignored); a paid call's payment_accepted names the
// client's PMI and carries the change in a ["change", pmi, token] tag,
// in an encrypted answer only. In a plaintext event the token still
// reaches the Vendor with Public set, which refuses it (vend's one
// check): nothing comes back but the error, no change anywhere. A token
// refused before it was redeemed gets payment_rejected first; one whose
// fate is unknown (the mint stopped answering) does not.
func TestDirectPayment(t *testing.T) {
	const call = `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"direct","arguments":{}%s}}`
	alias := `,"_meta":{"capvend/cashu":"cashuBmeta"}`
	tag := func(pmi, tok string) nostr.Tag { return nostr.Tag{tagDirectPayment, pmi, tok} }
	for _, tc := range []struct {
		name      string
		meta      string
		tags      []nostr.Tag
		dialect   nostr.Tag // a DVMCP method tag, or nil
		wrapped   bool
		token     string // the CallRequest's CashuToken
		notes     []string
		pmi       string // payment_accepted's, or payment_rejected's
		change    bool   // a change tag on payment_accepted
		errCode   int
		errSubstr string
	}{
		{name: "wrapped: paid, change in a tag", tags: []nostr.Tag{tag(PMICashuDirect, "cashuBgood")}, wrapped: true, token: "cashuBgood",
			notes: []string{vend.NotifyPaymentAccepted}, pmi: PMICashuDirect, change: true},
		{name: "capvend's own pmi", tags: []nostr.Tag{tag(vend.PMICashu, "cashuBgood")}, wrapped: true, token: "cashuBgood",
			notes: []string{vend.NotifyPaymentAccepted}, pmi: vend.PMICashu, change: true},
		{name: "the tag wins over _meta", meta: alias, tags: []nostr.Tag{tag(PMICashuDirect, "cashuBgood")}, wrapped: true, token: "cashuBgood",
			notes: []string{vend.NotifyPaymentAccepted}, pmi: PMICashuDirect, change: true},
		{name: "first supported tag", tags: []nostr.Tag{tag("bitcoin-lightning-bolt12-direct", "lno1x"), tag(PMICashuDirect, "cashuBgood"),
			tag(PMICashuDirect, "cashuBsecond")}, wrapped: true, token: "cashuBgood",
			notes: []string{vend.NotifyPaymentAccepted}, pmi: PMICashuDirect, change: true},
		{name: "another pmi is ignored", meta: alias, tags: []nostr.Tag{tag("bitcoin-lightning-bolt12-direct", "lno1x")}, wrapped: true,
			token: "cashuBmeta", notes: []string{vend.NotifyPaymentAccepted}, pmi: vend.PMICashu},
		{name: "the _meta alias alone", meta: alias, wrapped: true, token: "cashuBmeta",
			notes: []string{vend.NotifyPaymentAccepted}, pmi: vend.PMICashu},
		{name: "plaintext: refused, no change", tags: []nostr.Tag{tag(PMICashuDirect, "cashuBgood")}, token: "cashuBgood",
			errCode: rpcerr.CodeInvalidRequest, errSubstr: "Encryption required: a Cashu token (the direct_payment tag)"},
		{name: "underpaid: payment_rejected", tags: []nostr.Tag{tag(PMICashuDirect, "cashuBshort")}, wrapped: true, token: "cashuBshort",
			notes: []string{vend.NotifyPaymentRejected}, pmi: PMICashuDirect, errCode: rpcerr.CodePaymentFailed, errSubstr: "does not cover"},
		{name: "mint unreachable: not rejected", tags: []nostr.Tag{tag(PMICashuDirect, "cashuBlost")}, wrapped: true, token: "cashuBlost",
			errCode: rpcerr.CodePaymentFailed, errSubstr: "retry later"},
		{name: "DVMCP: no direct payments", tags: []nostr.Tag{tag(PMICashuDirect, "cashuBgood")}, dialect: nostr.Tag{"method", "tools/call"},
			wrapped: false, token: "", errCode: rpcerr.CodePaymentRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRec(t, nil)
			tags := tc.tags
			if tc.dialect != nil {
				tags = append(tags, tc.dialect)
			}
			req := r.event(KindMessage, fmt.Sprintf(call, tc.meta), tags...)
			in := req
			if tc.wrapped {
				in = wrapFor(t, *req, r.s.PublicKey())
			}
			got := r.open(r.handle(in))
			if c := r.v.lastCall(); c.CashuToken != tc.token || c.Public == tc.wrapped {
				t.Fatalf("call request: token %q public %v, want %q %v", c.CashuToken, c.Public, tc.token, !tc.wrapped)
			}
			if len(got) != len(tc.notes)+1 {
				t.Fatalf("%d answers, want %d notifications and the response: %+v", len(got), len(tc.notes), got)
			}
			for i, a := range got {
				correlated(t, a.ev, r.pk, req.ID)
				if i < len(tc.notes) && a.msg.Method != tc.notes[i] {
					t.Fatalf("answer %d: %s, want %s", i, a.msg.Method, tc.notes[i])
				}
				change := a.ev.Tags.Find(tagChange)
				if i == 0 && tc.change {
					if len(change) != 3 || change[1] != tc.pmi || change[2] != "cashuBchange" {
						t.Fatalf("payment_accepted tags %v, want [change %s cashuBchange]", a.ev.Tags, tc.pmi)
					}
				} else if change != nil {
					t.Fatalf("answer %d has a change tag: %v", i, a.ev.Tags)
				}
				if !tc.wrapped && strings.Contains(a.ev.String(), "cashuBchange") {
					t.Fatalf("a plaintext answer carries change: %v", a.ev)
				}
			}
			if len(tc.notes) > 0 {
				var p struct {
					PMI     string `json:"pmi"`
					Message string `json:"message"`
					Meta    struct {
						Change string `json:"change"`
					} `json:"_meta"`
				}
				json.Unmarshal(got[0].msg.Params, &p)
				if p.PMI != tc.pmi {
					t.Fatalf("%s pmi %q, want %q", tc.notes[0], p.PMI, tc.pmi)
				}
				if tc.notes[0] == vend.NotifyPaymentAccepted && p.Meta.Change != "cashuBchange" {
					t.Fatalf("payment_accepted lost _meta.change: %s", got[0].msg.Params)
				}
				if tc.notes[0] == vend.NotifyPaymentRejected && !strings.Contains(p.Message, tc.errSubstr) {
					t.Fatalf("payment_rejected message %q", p.Message)
				}
			}
			last := got[len(got)-1].msg
			if tc.errCode == 0 {
				if last.Error != nil || !strings.Contains(string(last.Result), "direct:paid") {
					t.Fatalf("response %s %v", last.Result, last.Error)
				}
				return
			}
			if last.Error == nil || last.Error.Code != tc.errCode || !strings.Contains(last.Error.Message, tc.errSubstr) {
				t.Fatalf("response error %v, want %d %q", last.Error, tc.errCode, tc.errSubstr)
			}
		})
	}
}

// TestDirectAcceptedPlaintext: were a Vendor to make change for a
// plaintext request, the front would hand it back neither in a tag nor
// in _meta (vend makes none: this is the front's own guard).
func TestDirectAcceptedPlaintext(t *testing.T) {
	o := &outbox{r: &request{encrypted: false}, direct: PMICashuDirect}
	params, tags := o.directAccepted(map[string]any{"amount": 21, "pmi": vend.PMICashu, "_meta": map[string]any{"change": "cashuBchange"}})
	b, _ := json.Marshal(params)
	if len(tags) != 0 || strings.Contains(string(b), "cashuBchange") || !strings.Contains(string(b), PMICashuDirect) {
		t.Fatalf("plaintext payment_accepted %s tags %v", b, tags)
	}
	// A Lightning payment's acceptance is left alone.
	o.r.encrypted = true
	ln := map[string]any{"amount": 21, "pmi": vend.PMILightning}
	if params, tags := o.directAccepted(ln); len(tags) != 0 || params.(map[string]any)["pmi"] != vend.PMILightning {
		t.Fatalf("lightning payment_accepted %v tags %v", params, tags)
	}
}

// TestDirectPaymentSplit: a request that comes as CEP-22 frames carries
// its direct_payment tag on the start frame only (as the stock client
// puts its negotiation tags); the reassembled request pays with it, once,
// under the end frame's id.
func TestDirectPaymentSplit(t *testing.T) {
	relay := testkit.Relay(t)
	v := &bigVendor{}
	s := startServer(t, relay, v, nil)
	c := oversizedClient(t, relay, s.PublicKey())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a deadlock guard
	defer cancel()
	var notes []ctxvmclient.Message
	text := strings.Repeat("x", 40_000)
	m, rec, err := c.Request(ctx, "tools/call", map[string]any{"name": "direct", "arguments": map[string]any{"text": text}},
		ctxvmclient.Request{Wrap: KindGiftWrap, Split: &ctxvmclient.Split{ChunkBytes: 8000},
			Tags:   nostr.Tags{{tagDirectPayment, PMICashuDirect, "cashuBgood"}},
			OnNote: func(m ctxvmclient.Message) error { notes = append(notes, m); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if m.Error != nil || !strings.Contains(string(m.Result), "direct:paid") {
		t.Fatalf("answer %s %v", m.Result, m.Error)
	}
	if len(notes) != 1 || notes[0].Method != vend.NotifyPaymentAccepted || !strings.Contains(string(notes[0].Params), PMICashuDirect) {
		t.Fatalf("notifications %+v", notes)
	}
	got := v.lastCall()
	if got.CashuToken != "cashuBgood" || got.Public || got.RequestID != rec.Event.Tags.Find("e")[1] {
		t.Fatalf("call request %+v", got)
	}
	if n := len(v.calls); n != 1 {
		t.Fatalf("%d calls, want 1", n)
	}
}
