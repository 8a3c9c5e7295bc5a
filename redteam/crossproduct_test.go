package redteam

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/capvend/capvend/adapters/ctxvm"
	"github.com/capvend/capvend/vend"
)

// Issue 26's cross-product, generated from the table of ways to pay
// (vend.Schemes): every credential kind, presented by {the client it was
// issued to, another client, a client of another transport, a plaintext
// Nostr request} with {the same call, other arguments, another tool, a
// top-up}, must have the outcome the table says:
//
//   - a private scheme's credential in a plaintext Nostr request is
//     refused, naming encryption;
//   - a bound scheme's releases nothing to anyone but its own client;
//   - a credential naming one call releases that call only; an account
//     pays any priced call (a top-up only refills it: nothing released);
//     a Cashu token pays whatever call it comes with.
//
// A refused presentation spends nothing: the credential is checked to
// work for its own client afterwards. A scheme with a credential and no
// kit here fails the test: a new way to pay brings its row and its kit.
// A credential with several carriers (a Cashu token in _meta, or in a
// CEP-8 direct_payment tag) runs the whole product once per carrier.

// outcome is what a presentation got.
type outcome string

const (
	released   outcome = "released"   // the call ran for the presenter, paid by the credential
	refused    outcome = "refused"    // an error, or a quote of the presenter's own
	encryption outcome = "encryption" // refused naming encryption
	absent     outcome = "absent"     // the channel has no way to carry this credential
)

// callKind is what a presentation asks for, relative to the call the
// credential was issued for.
type callKind string

const (
	sameCall  callKind = "the same call"
	otherArgs callKind = "other arguments"
	otherTool callKind = "another tool"
	aTopUp    callKind = "a top-up"
)

var callKinds = []callKind{sameCall, otherArgs, otherTool, aTopUp}

// who presents, relative to the client a credential was issued to.
type who string

const (
	issuedTo       who = "the client it was issued to"
	otherClient    who = "another client"
	otherTransport who = "another transport"
	plaintextNostr who = "a plaintext Nostr request"
)

var presenters = []who{issuedTo, otherClient, otherTransport, plaintextNostr}

// expected is the outcome the table says for scheme s presented by p with
// c. home says whether p is the identity s's credential was issued to (a
// plaintext request of a Nostr-issued credential's own key is).
func expected(s vend.Scheme, p who, home bool, c callKind) outcome {
	if p == plaintextNostr && s.Private {
		return encryption
	}
	if p == plaintextNostr && c == aTopUp && (s.Bearer || s.Releases != vend.ReleasesAccount) {
		// A top-up of a token account answers with its token: only a
		// key's own account (a bound account scheme) tops up in plaintext.
		return encryption
	}
	if !s.Bearer && !home {
		return refused
	}
	switch s.Releases {
	case vend.ReleasesPaid:
		return released
	case vend.ReleasesAccount:
		if c == aTopUp {
			return refused // a refill of the account: quoted, nothing released
		}
		return released
	}
	if c == sameCall {
		return released
	}
	return refused
}

// channel is one client identity on one front.
type channel struct {
	name   string
	http   *httpClient
	sess   string
	nostr  *nostrClient
	d      dialect
	public bool
}

// credential is what a kit obtained: the parts the schemes present.
type credential struct {
	text      string // the sha256 text it was issued for
	token     string // a payment token
	preimage  string
	macaroon  string // base64
	cashu     string
	credit    string // a credit token
	requestID any    // the request key's id (replay)
	mpp       string // an Authorization: Payment value
	x402      string // a PAYMENT-SIGNATURE value
}

// presentation is how a credential goes on a channel: _meta, extra
// arguments, HTTP headers, Nostr event tags, a request id, or nothing
// (absent).
type presentation struct {
	meta   map[string]any
	args   map[string]any
	header http.Header
	tags   []nostr.Tag
	id     any
	absent bool
}

// kit obtains one scheme's credential on the shop, issued to its home
// channel for sha256 {"text": text}, and says how it is presented.
type kit struct {
	carrier   string // how the credential travels, when a scheme has several
	home      func(f *fixture) *channel
	issue     func(t *testing.T, f *fixture, text string) credential
	present   func(cr credential, ch *channel) presentation
	singleUse bool // released, it is spent: each release needs a fresh one
}

// fixture is the shop and its channels.
type fixture struct {
	sh                   *shop
	httpA, httpB         *channel
	nostrK, nostrJ, kRaw *channel
	seq                  int
}

func (f *fixture) nextID() string { f.seq++; return fmt.Sprint("x", f.seq) }

// call sends tools/call tool args on ch with explicit gating (an unpaid
// call is answered at once) and returns the answer.
func (f *fixture) call(t *testing.T, ch *channel, id any, tool string, args map[string]any, pr presentation) (rpcMessage, error) {
	t.Helper()
	meta := explicit()
	for k, v := range pr.meta {
		meta[k] = v
	}
	a := map[string]any{}
	for k, v := range args {
		a[k] = v
	}
	for k, v := range pr.args {
		a[k] = v
	}
	if id == nil {
		id = f.nextID()
	}
	if ch.http != nil {
		return ch.http.tryRPC(ch.sess, id, "tools/call", callParams(tool, a, meta), pr.header)
	}
	tags := append([]nostr.Tag{explicitTag()}, pr.tags...)
	m := ch.nostr.untilResponse(ch.nostr.send(ch.d, id, "tools/call", callParams(tool, a, meta), tags...), nil)
	return m.rpcMessage, nil
}

// classifyAnswer reads an answer: released when it is the result want names.
func classifyAnswer(m rpcMessage, err error, want string) outcome {
	switch {
	case err != nil:
		return refused // HTTP 401/402: a refused credential, or a quote
	case m.Error != nil && strings.Contains(m.Error.Message, "Encryption required"):
		return encryption
	case m.Error != nil:
		return refused
	case strings.Contains(string(m.Result), `"isError":true`):
		return refused // a payment-required or pending answer
	case strings.Contains(string(m.Result), want):
		return released
	}
	return refused
}

// target is what c asks for, as tool, arguments and the text its result
// holds when it ran.
func target(c callKind, text string) (string, map[string]any, string) {
	switch c {
	case otherArgs:
		return "sha256", map[string]any{"text": text + "-other"}, sha256Hex(text + "-other")
	case otherTool:
		return "slow_count", map[string]any{"n": 1}, "counted to 1"
	case aTopUp:
		return "capvend_topup", map[string]any{"sats": 5}, "Credited"
	}
	return "sha256", map[string]any{"text": text}, sha256Hex(text)
}

// gatedHTTP calls sha256 {"text": text} explicitly on the HTTP channel
// ch and pays its invoice: it returns the answer's payment token and the
// invoice's preimage.
func (f *fixture) gatedHTTP(t *testing.T, ch *channel, id any, tool string, args map[string]any, hdr http.Header) (token, preimage string) {
	t.Helper()
	m, err := f.call(t, ch, id, tool, args, presentation{header: hdr})
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		StructuredContent struct {
			Invoice string `json:"invoice"`
			Token   string `json:"capvend_payment"`
		} `json:"structuredContent"`
	}
	json.Unmarshal(m.Result, &r)
	if r.StructuredContent.Invoice == "" {
		t.Fatalf("no invoice in %s", m)
	}
	return r.StructuredContent.Token, preimageOf(t, f.sh, r.StructuredContent.Invoice)
}

var l402Challenge = regexp.MustCompile(`L402 macaroon="([^"]+)", invoice="([^"]+)"`)

// l402 asks for an L402 challenge for tool args on HTTP channel ch, pays
// it, and returns the macaroon (base64) and preimage.
func (f *fixture) l402(t *testing.T, ch *channel, tool string, args map[string]any) (string, string) {
	t.Helper()
	_, err := ch.http.postRaw(ch.sess, request(f.nextID(), "tools/call", callParams(tool, args, nil)),
		http.Header{"Accept": {"application/json, text/event-stream, application/vnd.l402"}})
	var se *statusError
	if !errors.As(err, &se) || se.code != http.StatusPaymentRequired {
		t.Fatalf("want a 402 challenge, got %v", err)
	}
	ch402 := l402Challenge.FindStringSubmatch(strings.Join(se.header.Values("WWW-Authenticate"), "\n"))
	if ch402 == nil {
		t.Fatalf("no L402 challenge in %v", se.header)
	}
	return ch402[1], preimageOf(t, f.sh, ch402[2])
}

// gatedNostr is gatedHTTP for a Nostr channel: it returns the preimage.
func (f *fixture) gatedNostr(t *testing.T, ch *channel, tool string, args, meta map[string]any) string {
	t.Helper()
	m, _ := f.call(t, ch, nil, tool, args, presentation{meta: meta})
	var d struct {
		Options []struct {
			PayReq string `json:"pay_req"`
		} `json:"payment_options"`
	}
	if m.Error == nil || json.Unmarshal(m.Error.Data, &d) != nil || len(d.Options) == 0 {
		t.Fatalf("want -32042 with an invoice, got %s", m)
	}
	return preimageOf(t, f.sh, d.Options[0].PayReq)
}

// mppChallenge reads a 402's MPP challenge as lightning-tools does (its
// auth-params over the joined WWW-Authenticate, which starts with it).
var mppChallenge = regexp.MustCompile(`(\w+)=("([^"]*)"|'([^']*)'|([^,\s]*))`)

// challenge402 asks for the HTTP 402 of tool args on HTTP channel ch.
func (f *fixture) challenge402(t *testing.T, ch *channel, tool string, args map[string]any) *statusError {
	t.Helper()
	_, err := ch.http.postRaw(ch.sess, request(f.nextID(), "tools/call", callParams(tool, args, nil)),
		http.Header{"Accept": {"application/json, text/event-stream, application/vnd.l402"}})
	var se *statusError
	if !errors.As(err, &se) || se.code != http.StatusPaymentRequired {
		t.Fatalf("want a 402 challenge, got %v", err)
	}
	return se
}

// mpp asks for an MPP challenge for tool args on ch, pays it, and returns
// the Authorization: Payment credential lightning-tools would send.
func (f *fixture) mpp(t *testing.T, ch *channel, tool string, args map[string]any) string {
	t.Helper()
	joined := strings.Join(f.challenge402(t, ch, tool, args).header.Values("WWW-Authenticate"), ", ")
	if !strings.HasPrefix(joined, "Payment ") {
		t.Fatalf("WWW-Authenticate %q does not start with Payment", joined)
	}
	p := map[string]string{}
	for _, m := range mppChallenge.FindAllStringSubmatch(joined[len("Payment"):], -1) {
		if _, seen := p[m[1]]; !seen {
			p[m[1]] = m[3] + m[4] + m[5]
		}
	}
	rb, _ := base64.RawURLEncoding.DecodeString(p["request"])
	var req struct {
		MethodDetails struct{ Invoice string } `json:"methodDetails"`
	}
	if json.Unmarshal(rb, &req) != nil || req.MethodDetails.Invoice == "" {
		t.Fatalf("MPP request %s", rb)
	}
	pre := preimageOf(t, f.sh, req.MethodDetails.Invoice)
	echo := map[string]string{}
	for _, k := range []string{"id", "realm", "method", "intent", "request", "expires"} {
		echo[k] = p[k]
	}
	b, _ := json.Marshal(map[string]any{"challenge": echo, "payload": map[string]string{"preimage": pre}})
	return "Payment " + base64.RawURLEncoding.EncodeToString(b)
}

// x402 asks for an x402 challenge for tool args on ch, pays its invoice,
// and returns the PAYMENT-SIGNATURE lightning-tools would send.
func (f *fixture) x402(t *testing.T, ch *channel, tool string, args map[string]any) string {
	t.Helper()
	raw, _ := base64.StdEncoding.DecodeString(f.challenge402(t, ch, tool, args).header.Get("PAYMENT-REQUIRED"))
	var req struct {
		Accepts []map[string]any `json:"accepts"`
	}
	if json.Unmarshal(raw, &req) != nil || len(req.Accepts) == 0 {
		t.Fatalf("PAYMENT-REQUIRED %s", raw)
	}
	a := req.Accepts[0]
	inv, _ := a["extra"].(map[string]any)["invoice"].(string)
	preimageOf(t, f.sh, inv)
	b, _ := json.Marshal(map[string]any{"x402Version": 2, "scheme": a["scheme"], "network": a["network"],
		"payload": map[string]string{"invoice": inv}, "accepted": a})
	return base64.StdEncoding.EncodeToString(b)
}

func l402Header(cr credential) http.Header {
	return http.Header{"Authorization": {"L402 " + cr.macaroon + ":" + cr.preimage}}
}

// onHTTP presents hdr on HTTP channels only.
func onHTTP(ch *channel, hdr http.Header) presentation {
	if ch.http == nil {
		return presentation{absent: true}
	}
	return presentation{header: hdr}
}

// kits are the ways to pay the cross-product presents, by scheme.
func kits() map[vend.SchemeName]kit {
	httpHome := func(f *fixture) *channel { return f.httpA }
	return map[vend.SchemeName]kit{
		vend.SchemePaymentToken: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				tok, _ := f.gatedHTTP(t, f.httpA, nil, "sha256", map[string]any{"text": text}, nil)
				return credential{text: text, token: tok}
			},
			present: func(cr credential, ch *channel) presentation {
				return presentation{args: map[string]any{vend.PaymentArg: cr.token}}
			}},
		vend.SchemePreimage: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				_, pre := f.gatedHTTP(t, f.httpA, nil, "sha256", map[string]any{"text": text}, nil)
				return credential{text: text, preimage: pre}
			},
			present: func(cr credential, ch *channel) presentation {
				return presentation{meta: map[string]any{vend.MetaPaymentProof: cr.preimage}}
			}},
		vend.SchemeGrant: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				f.gatedHTTP(t, f.httpA, nil, "sha256", map[string]any{"text": text}, nil)
				return credential{text: text}
			},
			present: func(credential, *channel) presentation { return presentation{} }},
		vend.SchemeReplay: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				id := f.nextID()
				f.gatedHTTP(t, f.httpA, id, "sha256", map[string]any{"text": text}, nil)
				return credential{text: text, requestID: id}
			},
			present: func(cr credential, ch *channel) presentation { return presentation{id: cr.requestID} }},
		vend.SchemeL402: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				mac, pre := f.l402(t, f.httpA, "sha256", map[string]any{"text": text})
				return credential{text: text, macaroon: mac, preimage: pre}
			},
			present: func(cr credential, ch *channel) presentation { return onHTTP(ch, l402Header(cr)) }},
		vend.SchemeL402Credit: {home: httpHome,
			issue: func(t *testing.T, f *fixture, text string) credential {
				mac, pre := f.l402(t, f.httpA, vend.TopUpTool, map[string]any{"sats": 200})
				return credential{text: text, macaroon: mac, preimage: pre}
			},
			present: func(cr credential, ch *channel) presentation { return onHTTP(ch, l402Header(cr)) }},
		vend.SchemeMPP: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				return credential{text: text, mpp: f.mpp(t, f.httpA, "sha256", map[string]any{"text": text})}
			},
			present: func(cr credential, ch *channel) presentation {
				return onHTTP(ch, http.Header{"Authorization": {cr.mpp}})
			}},
		vend.SchemeX402: {home: httpHome, singleUse: true,
			issue: func(t *testing.T, f *fixture, text string) credential {
				return credential{text: text, x402: f.x402(t, f.httpA, "sha256", map[string]any{"text": text})}
			},
			present: func(cr credential, ch *channel) presentation {
				return onHTTP(ch, http.Header{"Payment-Signature": {cr.x402}})
			}},
		vend.SchemeCashu: {carrier: "_meta", home: httpHome, singleUse: true, issue: mintCashu,
			present: func(cr credential, ch *channel) presentation {
				return presentation{meta: map[string]any{vend.MetaCashuToken: cr.cashu}}
			}},
		vend.SchemeCreditToken: {home: httpHome,
			issue: func(t *testing.T, f *fixture, text string) credential {
				topUp := map[string]any{"sats": 200}
				id := f.nextID()
				f.gatedHTTP(t, f.httpA, id, vend.TopUpTool, topUp, nil)
				m, err := f.call(t, f.httpA, id, vend.TopUpTool, topUp, presentation{})
				if err != nil || creditToken(m) == "" {
					t.Fatalf("credit top-up: %s %v", m, err)
				}
				return credential{text: text, credit: creditToken(m)}
			},
			present: func(cr credential, ch *channel) presentation {
				return presentation{meta: map[string]any{vend.MetaCredit: cr.credit}}
			}},
		vend.SchemeCreditKey: {home: func(f *fixture) *channel { return f.nostrK },
			issue: func(t *testing.T, f *fixture, text string) credential {
				own := map[string]any{vend.MetaCredit: true}
				f.gatedNostr(t, f.nostrK, vend.TopUpTool, map[string]any{"sats": 200}, own)
				m, _ := f.call(t, f.nostrK, nil, vend.TopUpTool, map[string]any{"sats": 200}, presentation{meta: own})
				if !strings.Contains(string(m.Result), `"balance":200`) {
					t.Fatalf("key top-up: %s", m)
				}
				return credential{text: text}
			},
			present: func(credential, *channel) presentation {
				return presentation{meta: map[string]any{vend.MetaCredit: true}}
			}},
	}
}

// mintCashu issues a 25-sat Cashu token of the stack's mint.
func mintCashu(t *testing.T, f *fixture, text string) credential {
	tok, err := f.sh.s.CashuMint(context.Background(), 25)
	if err != nil {
		t.Fatal(err)
	}
	return credential{text: text, cashu: tok}
}

// carriers are the other ways a scheme's credential travels, by scheme:
// each runs the whole cross-product as kits' own does.
func carriers() map[vend.SchemeName][]kit {
	return map[vend.SchemeName][]kit{
		// CEP-8: the token in the request event's direct_payment tag, a
		// carrier only Nostr has (its home is a Nostr key, so that the
		// token refused in plaintext is then spent by its own client).
		vend.SchemeCashu: {{carrier: "direct_payment tag", home: func(f *fixture) *channel { return f.nostrK }, singleUse: true, issue: mintCashu,
			present: func(cr credential, ch *channel) presentation {
				if ch.nostr == nil {
					return presentation{absent: true}
				}
				return presentation{tags: []nostr.Tag{{"direct_payment", ctxvm.PMICashuDirect, cr.cashu}}}
			}}},
	}
}

// presenter returns the channel of p for a credential issued to home, and
// whether it is home's identity.
func (f *fixture) presenter(p who, home *channel) (*channel, bool) {
	nostrHome := home.nostr != nil
	switch p {
	case issuedTo:
		return home, true
	case otherClient:
		if nostrHome {
			return f.nostrJ, false
		}
		return f.httpB, false
	case otherTransport:
		if nostrHome {
			return f.httpA, false
		}
		return f.nostrK, false
	}
	return f.kRaw, nostrHome // a plaintext request of the home key, or of a key of its own
}

func TestCrossProductOfWaysToPay(t *testing.T) {
	t.Parallel()
	needLoopback(t, "127.0.0.2")
	sh := startShop(t, shopOpts{nostr: true, cashu: true, lnd: plainInvoices, top: creditShop,
		payments: "  http_402_schemes: [mpp, l402, x402, cashu]\n",                  // every 402 challenge (issue 29)
		limits:   "  requests_per_minute: 100000\n  max_unpaid_per_client: 1000\n"}) // refusals leave quotes open
	f := &fixture{sh: sh}
	a, b := newHTTPClientFrom(t, sh, "127.0.0.1"), newHTTPClientFrom(t, sh, "127.0.0.2")
	f.httpA = &channel{name: "HTTP A", http: a, sess: a.initialize()}
	f.httpB = &channel{name: "HTTP B", http: b, sess: b.initialize()}
	k, j := dialNostr(t, sh), dialNostr(t, sh)
	k.waitReady()
	f.nostrK = &channel{name: "Nostr K", nostr: k, d: ctxvmWrapped}
	f.nostrJ = &channel{name: "Nostr J", nostr: j, d: ctxvmWrapped}
	f.kRaw = &channel{name: "Nostr K plaintext", nostr: k, d: ctxvmPlain, public: true}

	ks, more := kits(), carriers()
	covered := 0
	for _, s := range vend.Schemes() {
		kt, ok := ks[s.Name]
		if !ok {
			if strings.HasPrefix(s.Credential, "none") {
				continue // nothing to present (the invoice, capvend's own recovery)
			}
			t.Errorf("scheme %s (%s) has no kit in the cross-product", s.Name, s.Credential)
			continue
		}
		for _, kt := range append([]kit{kt}, more[s.Name]...) {
			covered += f.product(t, s, kt)
		}
	}
	t.Logf("%d presentations checked", covered)
}

// product presents scheme s's credential, obtained and carried by kt, by
// every presenter with every call kind, and returns how many
// presentations it checked.
func (f *fixture) product(t *testing.T, s vend.Scheme, kt kit) (covered int) {
	t.Helper()
	home := kt.home(f)
	text := "cross-" + string(s.Name)
	if kt.carrier != "" {
		text += "-" + strings.Fields(kt.carrier)[0]
	}
	shared := kt.issue(t, f, text)
	var releases [][2]int
	for pi, p := range presenters {
		ch, isHome := f.presenter(p, home)
		for ci, c := range callKinds {
			want := expected(s, p, isHome, c)
			if want == released {
				releases = append(releases, [2]int{pi, ci})
				continue // after the refusals: they must spend nothing
			}
			f.check(t, s, kt, shared, p, ch, c, want)
			covered++
		}
	}
	// The releases: the shared credential last, for its own client
	// and the same call (or, for a reusable one, all of them).
	for _, pc := range releases {
		p, c := presenters[pc[0]], callKinds[pc[1]]
		ch, _ := f.presenter(p, home)
		cr := shared
		if kt.present(shared, ch).absent {
			f.check(t, s, kt, shared, p, ch, c, released) // logs it
			continue
		}
		if kt.singleUse && !(p == issuedTo && c == sameCall) {
			cr = kt.issue(t, f, fmt.Sprintf("%s-%d", text, f.seq))
		}
		f.check(t, s, kt, cr, p, ch, c, released)
		covered++
	}
	return covered
}

// check presents cr of scheme s by p on ch with c and compares the outcome
// with want.
func (f *fixture) check(t *testing.T, s vend.Scheme, kt kit, cr credential, p who, ch *channel, c callKind, want outcome) {
	t.Helper()
	pr := kt.present(cr, ch)
	if pr.absent {
		t.Logf("%-13s %-18s %-28s %-16s: %s cannot carry it", s.Name, kt.carrier, p, c, ch.name)
		return
	}
	tool, args, ran := target(c, cr.text)
	m, err := f.call(t, ch, pr.id, tool, args, pr)
	got := classifyAnswer(m, err, ran)
	if got != want {
		name := string(s.Name)
		if kt.carrier != "" {
			name += " (" + kt.carrier + ")"
		}
		t.Errorf("%s presented by %s (%s) with %s: %s, the table says %s\n  answer: %.400s %v", name, p, ch.name, c, got, want, m, err)
		return
	}
	t.Logf("%-13s %-18s %-28s %-16s: %s", s.Name, kt.carrier, p, c, got)
}
