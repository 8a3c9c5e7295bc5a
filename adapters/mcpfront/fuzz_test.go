package mcpfront

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// FuzzHTTPFront sends random sequences of JSON-RPC requests through the
// real HTTP handler of this front to a real vend.Vendor on a real SQLite
// ledger, with an honest payment backend (it pays an invoice only when the
// sequence says so) and an upstream that records every execution, and
// checks the money invariant after each sequence: every upstream execution
// of a priced tool is covered by exactly one settled payment of at least
// its price for exactly that tool and canonical arguments (a call covers
// one execution); free tools are exempt, and a tool with a daily free quota
// runs unpaid with at most its quota of distinct arguments (all requests
// come from one address; a replay of the same free request may run again).
// The ledger's own verify must pass too.
//
// A sequence is text, one step a line (see (*fuzzHarness).step); lines
// that do not parse are skipped, so the fuzzer's mutations stay
// meaningful. The seeds cover issue 11's holes 1-3 and the run -> resume
// self-deadlock; on main before request binding (vend) and per-source
// limits, the four marked "main before bind" failed.
func FuzzHTTPFront(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.seq)
	}
	f.Fuzz(func(t *testing.T, seq string) {
		runSequence(t, seq).check(t)
	})
}

type fuzzSeed struct{ name, seq string }

var fuzzSeeds = []fuzzSeed{
	{"paid call", "init\ncall 0 1 cheap a\npay 0\nwait 0\ncall 0 1 cheap a\nwait 1"},
	// Hole 2: made-up session ids get 404, so each cannot claim a free use.
	{"made-up sessions claim free uses", "call x 1 quota a\ncall x 2 quota b\ncall x 3 quota A\nwait 0\nwait 1\nwait 2"},
	{"made-up session replays a paid call", "init\ncall 0 7 dear X\npay 0\nwait 0\ncall x 7 dear X\nwait 1"},
	{"deleted session", "init\ncall 0 1 quota a\nwait 0\ndelete 0\ncall 0 2 quota b\nwait 1"},
	// Hole 1 without reusing the id: a new id gets a new invoice.
	{"new id new invoice", "init\ncall 0 7 cheap a\ndrop 0\ncall 0 8 dear X\npay 0\nwait 1\ndrop 1"},
	{"drop after paying", "init\ncall 0 3 dear a\npay 0\ndrop 0\ncall 0 3 dear a\nwait 1"},
	{"expired invoice", "init\ncall 0 4 cheap a\nexpire 0\nwait 0\ncall 0 4 cheap a\npay 1\nwait 1"},
	{"explicit gating by session", "init\ncall 0 5 dear a explicit\nwait 0\npay 0\ncall 0 6 dear a explicit\nwait 1\ncall 0 7 dear a explicit\nwait 2"},
	{"explicit gating by preimage, session-less", "call - 5 dear a explicit\nwait 0\npay 0\ncall - 6 dear a explicit proof 0\nwait 1\ncall - 6 dear a explicit proof 0\nwait 2"},
	{"explicit grant with other arguments", "call - 5 dear a explicit\nwait 0\npay 0\ncall - 6 dear X explicit proof 0\nwait 1"},
	{"session-less quota", "call - 1 quota a\ncall - 1 quota b\nwait 0\nwait 1\npay 0\nwait 1"},
	{"invalid arguments", "init\ncall 0 1 dear bad\ncall 0 2 dear num\nwait 0\nwait 1"},
	{"free tool", "init\ncall 0 1 free a\ncall 0 1 free b\ncall - 1 free a\nwait 0\nwait 1\nwait 2"},
	{"eviction", "init\ninit\ninit\ninit\ninit\ncall 0 1 cheap a\ncall 4 1 cheap a\npay 0\nwait 1"},
	{"hold invoices", "hold\ninit\ncall 0 1 dear a\npay 0\nwait 0\ncall - 2 cheap b explicit\nwait 1\npay 1\ncall - 3 cheap b explicit proof 1\nwait 2"},
	// Hole 1 (main before bind: failed): id 7 quoted for cheap, the stream
	// dropped, id 7 sent again as dear with other arguments got the first
	// (1 sat) invoice; paying it ran dear(X), booked as cheap.
	{"hole 1: reused id, other tool", "init\ncall 0 7 cheap a\ndrop 0\ncall 0 7 dear X\npay 0\nwait 1"},
	// Hole 3 (main before bind: failed): the same id with other arguments
	// was "already free".
	{"hole 3: free quota replayed", "init\ncall 0 1 quota a\nwait 0\ncall 0 1 quota b\nwait 1\ncall 0 1 quota X\nwait 2"},
	// Hole 2 (main before per-source limits: failed): every initialize
	// was a new client for the free quota.
	{"hole 2: sessions minted for free uses", "init\ninit\ninit\ncall 0 1 quota a\ncall 1 1 quota b\ncall 2 1 quota X\nwait 0\nwait 1\nwait 2"},
	// Main before bind: hung (run -> resume waited on the call's own
	// done channel): the same request sent three times while its invoice
	// is paid.
	{"run-resume self-deadlock", selfDeadlockSeq()},
	// Payment tokens (issue 12): a stock host (no capvend/payments
	// capability) gets a token with its invoice and sends it back as
	// capvend_payment: valid, reused, for other arguments or another tool,
	// before paying, session-less, and across sessions.
	{"token: stock host pays and retries", "init stock\ncall 0 1 dear a\nwait 0\ncall 0 2 dear a token 0\nwait 1\npay 0\ncall 0 3 dear a token 0\nwait 2\ncall 0 4 dear a token 0\nwait 3"},
	{"token: session-less", "call - 1 dear a stock\nwait 0\npay 0\ncall - 1 dear a stock token 0\nwait 1\ncall - 1 dear a stock token 0\nwait 2"},
	{"token: other arguments", "init stock\ncall 0 1 dear a\nwait 0\npay 0\ncall 0 2 dear X token 0\nwait 1\ncall 0 3 dear A token 0\nwait 2\ncall 0 4 dear A token 0\nwait 3"},
	{"token: other tool", "call - 1 cheap a stock\nwait 0\npay 0\ncall - 2 dear a stock token 0\nwait 1\ncall - 3 quota a stock token 0\nwait 2\ncall - 4 cheap a stock token 0\nwait 3"},
	{"token: another session, aware client", "init stock\ninit\ncall 0 1 dear b\nwait 0\npay 0\ncall 1 1 dear b token 0\nwait 1\ncall 0 2 dear b token 0\nwait 2"},
	{"token: concurrent retries", "init stock\ncall 0 1 cheap a\nwait 0\npay 0\ncall 0 2 cheap a token 0\ncall 0 3 cheap a token 0\ncall - 4 cheap a token 0\nwait 1\nwait 2\nwait 3"},
	{"token: expired", "init stock\ncall 0 1 dear a\nwait 0\nexpire 0\ncall 0 2 dear a token 0\nwait 1\npay 0\ncall 0 3 dear a token 0\nwait 2"},
}

// selfDeadlockSeq sends the same request three times in one session while
// its invoice is paid, six times over.
func selfDeadlockSeq() string {
	var b strings.Builder
	b.WriteString("init\n")
	for i := 0; i < 6; i++ {
		fmt.Fprintf(&b, "call 0 %d cheap a\ncall 0 %d cheap a\ncall 0 %d cheap a\npay %d\nwait %d\nwait %d\nwait %d\n", 10+i, 10+i, 10+i, i, 3*i, 3*i+1, 3*i+2)
	}
	return b.String()
}

// The fuzz tools, on upstream "ex": prices in msat, and the daily free
// quota of "quota".
var fuzzPrices = map[string]pricing.Rule{
	"cheap": {Price: 1000},
	"dear":  {Price: 21000},
	"quota": {Price: 1000, FreePerDay: 1},
}

var fuzzArgs = map[string]string{
	"a":   `{"text":"a"}`,
	"A":   `{ "text" : "a" }`, // the same as a, spelled otherwise
	"b":   `{"text":"b"}`,
	"X":   `{"text":"EXPENSIVE"}`,
	"bad": `{}`,
	"num": `{"text":1}`,
}

// recordingTools is the upstream: it runs every tool at once and records
// each execution.
type recordingTools struct {
	mu   sync.Mutex
	runs []execution
}

type execution struct{ tool, hash string }

var fuzzSchema = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","maxLength":20}},"required":["text"]}`)

func (r *recordingTools) Tools() []vend.Item {
	var out []vend.Item
	for _, name := range []string{"cheap", "dear", "quota", "free"} {
		out = append(out, vend.Item{Name: "ex_" + name, Server: "ex", UpstreamName: name, InputSchema: fuzzSchema, Idempotent: true})
	}
	return out
}

func (r *recordingTools) CallTool(ctx context.Context, t vend.Item, args, tok json.RawMessage, progress func(json.RawMessage)) (json.RawMessage, error) {
	name, _ := json.Marshal(t.Name)
	params, _ := json.Marshal(map[string]json.RawMessage{"name": name, "arguments": args})
	hash, err := vend.CanonicalHash("tools/call", params)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.runs = append(r.runs, execution{t.UpstreamName, hash})
	r.mu.Unlock()
	txt, _ := json.Marshal("ran " + t.UpstreamName + " " + string(args))
	return json.RawMessage(`{"content":[{"type":"text","text":` + string(txt) + `}]}`), nil
}

// honestBackend issues Lightning-like invoices (plain or hold) recorded
// in the ledger, and pays one only when the sequence says so, reporting
// through Run's callback as a real backend does.
type honestBackend struct {
	led  *ledger.Ledger
	hold bool

	mu        sync.Mutex
	report    func(vend.PaymentEvent)
	ready     chan struct{} // closed when Run registered report
	refs      []string      // payment refs in the order requested
	preimages map[string]string
	paid      map[string]bool
}

var _ vend.HoldSettler = (*honestBackend)(nil)

// bolt11Prefix starts the honest backend's invoices; the payment ref
// follows, so a client's payment_required names it.
const bolt11Prefix = "lnbcrt-fuzz-"

func (b *honestBackend) Name() vend.Backend { return vend.BackendLND }
func (b *honestBackend) CanHold() bool      { return b.hold }

func (b *honestBackend) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	pre := make([]byte, 32)
	rand.Read(pre)
	h := sha256.Sum256(pre)
	ref := hex.EncodeToString(h[:])
	np := vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref, Bolt11: bolt11Prefix + ref,
		Amount: r.Amount, ExpiresAt: time.Now().Add(r.Expiry)}
	if r.Hold && b.hold {
		np.Kind, np.HoldPreimage = vend.KindHoldInvoice, pre
	}
	p, err := b.led.RecordPayment(ctx, r.CallID, np)
	if err != nil {
		return p, err
	}
	b.mu.Lock()
	b.refs = append(b.refs, ref)
	b.preimages[ref] = hex.EncodeToString(pre)
	b.mu.Unlock()
	return p, nil
}

// ref returns the i-th payment requested (modulo their number), "" if none.
func (b *honestBackend) ref(i int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.refs) == 0 {
		return ""
	}
	return b.refs[i%len(b.refs)]
}

// preimage returns what a payer of ref learned, "" before it paid.
func (b *honestBackend) preimage(ref string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.paid[ref] {
		return ""
	}
	return b.preimages[ref]
}

// pay pays ref once, if it is still open: a hold invoice is locked in
// (vend settles it after the tool ran), a plain one settled.
func (b *honestBackend) pay(ref string) {
	ctx := context.Background()
	p, err := b.led.Payment(ctx, ref)
	if err != nil || p.State != vend.PaymentOpen {
		return
	}
	if p.Kind == vend.KindHoldInvoice {
		p, err = b.led.AcceptPayment(ctx, ref)
	} else {
		p, err = b.led.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: p.Amount})
	}
	if err != nil {
		return
	}
	b.mu.Lock()
	b.paid[ref] = true
	report := b.report
	b.mu.Unlock()
	report(vend.PaymentEvent{Payment: p})
}

func (b *honestBackend) expire(ref string) {
	ctx := context.Background()
	p, err := b.led.Payment(ctx, ref)
	if err != nil || p.State != vend.PaymentOpen {
		return
	}
	if p, err = b.led.EndPayment(ctx, ref, vend.PaymentExpired, "expired"); err != nil {
		return
	}
	b.mu.Lock()
	report := b.report
	b.mu.Unlock()
	report(vend.PaymentEvent{Payment: p})
}

func (b *honestBackend) Cancel(ctx context.Context, ref string) error {
	p, err := b.led.Payment(ctx, ref)
	if err != nil || p.State == vend.PaymentCanceled || p.State == vend.PaymentExpired {
		return err
	}
	_, err = b.led.EndPayment(ctx, ref, vend.PaymentCanceled, "canceled")
	return err
}

func (b *honestBackend) SettleHeld(ctx context.Context, ref string) (vend.Payment, error) {
	p, err := b.led.Payment(ctx, ref)
	if err != nil {
		return p, err
	}
	if p.State == vend.PaymentSettled {
		return p, nil
	}
	return b.led.SettlePayment(ctx, vend.Settlement{Ref: ref, Amount: p.Amount})
}

func (b *honestBackend) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	b.mu.Lock()
	b.report = report
	b.mu.Unlock()
	close(b.ready)
	<-ctx.Done()
	return ctx.Err()
}

// fuzzHarness is one sequence's world.
type fuzzHarness struct {
	t        testing.TB
	led      *ledger.Ledger
	be       *honestBackend
	tools    *recordingTools
	url      string
	sessions []string
	calls    []*fuzzCall
	steps    []string // what ran, for failure reports
}

// fuzzCall is one request in flight.
type fuzzCall struct {
	cancel  context.CancelFunc
	waiting chan struct{} // closed at payment_required or the answer
	done    chan struct{} // closed when the response ended

	mu    sync.Mutex
	ref   string // the payment of its last payment_required
	token string // the payment token its answer handed out
}

func runSequence(t testing.TB, seq string) *fuzzHarness {
	hold := strings.HasPrefix(seq, "hold\n") // a first line "hold": hold invoices
	// Not t.TempDir: a fuzz seed's name puts '#' in it, which a ledger
	// path may not hold. In memory where there is a tmpfs: it is still
	// SQLite, twice as many sequences a second.
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "capvend-fuzz-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	led, err := ledger.Open(context.Background(), filepath.Join(dir, "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	book, err := pricing.NewBook(map[string]map[string]pricing.Rule{"ex": fuzzPrices})
	if err != nil {
		t.Fatal(err)
	}
	h := &fuzzHarness{t: t, led: led, tools: &recordingTools{},
		be: &honestBackend{led: led, hold: hold, ready: make(chan struct{}), preimages: map[string]string{}, paid: map[string]bool{}}}
	v, err := vend.New(vend.Config{Ledger: led, Backends: []vend.PaymentBackend{h.be}, Tools: h.tools, Prices: book, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	vctx, stopVendor := context.WithCancel(context.Background())
	vdone := make(chan struct{})
	go func() { v.Run(vctx); close(vdone) }()
	<-h.be.ready
	front, err := New(Config{Vendor: v, MaxSessions: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", front.Handler())
	ts := httptest.NewServer(mux)
	h.url = ts.URL + "/mcp"

	lines := strings.Split(seq, "\n")
	if len(lines) > 64 {
		lines = lines[:64]
	}
	for _, line := range lines {
		h.step(strings.Fields(line))
	}
	// The clients leave; the server finishes every request; payments
	// stop being watched (vend's Run waits for the work they started).
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for _, c := range h.calls {
			c.cancel()
			<-c.done
		}
		ts.CloseClientConnections()
		ts.Close()
		stopVendor()
		<-vdone
	}()
	h.steps = append(h.steps, "(end)")
	h.await(ended)
	return h
}

// step runs one step of a sequence:
//
//	hold                          (first line only) hold invoices, not plain ones
//	init [stock]                  initialize a legacy (2025-11-25) session,
//	                              declaring the capvend/payments capability
//	                              unless stock (a stock host: explicit gating)
//	call S ID TOOL ARGS [explicit] [proof P] [stock] [token C]
//	                              tools/call in session S (its index), "x" a
//	                              made-up session id, "-" none (2026-07-28);
//	                              ID the JSON-RPC id; TOOL cheap|dear|quota|free;
//	                              ARGS a key of fuzzArgs; explicit gating; the
//	                              preimage of payment P if it was paid; a
//	                              session-less request without the capability;
//	                              capvend_payment set to the token the C-th
//	                              call was handed, if any
//	pay P / expire P              the P-th payment request is paid / expires
//	drop C / wait C               the C-th call's client leaves / is answered
//	delete S                      DELETE session S
//
// A call step returns once the call waits for its payment or is answered.
func (h *fuzzHarness) step(f []string) {
	if len(f) == 0 {
		return
	}
	num := func(i int) (int, bool) {
		if i >= len(f) {
			return 0, false
		}
		n, err := strconv.Atoi(f[i])
		return n, err == nil && n >= 0 && n < 1<<20
	}
	switch f[0] {
	case "init":
		h.initialize(len(f) > 1 && f[1] == "stock")
	case "call":
		if len(f) < 5 {
			return
		}
		args, ok := fuzzArgs[f[4]]
		if _, priced := fuzzPrices[f[3]]; !ok || (!priced && f[3] != "free") {
			return
		}
		id, ok := num(2)
		if !ok {
			return
		}
		var meta []string
		stock := false
		for i := 5; i < len(f); i++ {
			switch f[i] {
			case "stock":
				stock = true
			case "token":
				if c, ok := num(i + 1); ok && len(h.calls) > 0 {
					fc := h.calls[c%len(h.calls)]
					fc.mu.Lock()
					tok := fc.token
					fc.mu.Unlock()
					if tok != "" {
						args = `{"` + vend.PaymentArg + `":"` + tok + `",` + strings.TrimPrefix(strings.TrimSpace(args), "{")
						args = strings.Replace(args, `",}`, `"}`, 1) // {} had no members
					}
				}
			case "explicit":
				meta = append(meta, `"`+MetaPaymentInteraction+`":"`+ExplicitGating+`"`)
			case "proof":
				if p, ok := num(i + 1); ok {
					if pre := h.be.preimage(h.be.ref(p)); pre != "" {
						meta = append(meta, `"`+vend.MetaPaymentProof+`":"`+pre+`"`)
					}
				}
			}
		}
		h.call(f[1], id, "ex_"+f[3], args, meta, stock)
	case "pay", "expire":
		p, ok := num(1)
		if !ok {
			return
		}
		ref := h.be.ref(p)
		if ref == "" {
			return
		}
		if f[0] == "pay" {
			h.be.pay(ref)
		} else {
			h.be.expire(ref)
		}
	case "drop", "wait":
		c, ok := num(1)
		if !ok || len(h.calls) == 0 {
			return
		}
		fc := h.calls[c%len(h.calls)]
		if f[0] == "drop" {
			fc.cancel()
		} else if h.unpaid(fc) {
			break // it waits for a payment nobody made: it would never end
		}
		h.await(fc.done)
	case "delete":
		if len(f) < 2 {
			return
		}
		sid := h.session(f[1])
		if sid == "" {
			return
		}
		req, _ := http.NewRequest(http.MethodDelete, h.url, nil)
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	default:
		return
	}
	h.steps = append(h.steps, strings.Join(f, " "))
}

// session returns the session id a step names: an issued one by index, a
// fresh made-up one (mcp-go's format) for "x", "" for "-" (no session) or
// no session issued yet.
func (h *fuzzHarness) session(s string) string {
	switch s {
	case "x":
		var b [16]byte
		rand.Read(b[:])
		b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
		return fmt.Sprintf("mcp-session-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	case "-":
		return ""
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || len(h.sessions) == 0 {
		return ""
	}
	return h.sessions[i%len(h.sessions)]
}

func (h *fuzzHarness) initialize(stock bool) {
	caps := `{"experimental":{"` + CapabilityPayments + `":{}}}`
	if stock {
		caps = `{}`
	}
	body := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":` + caps + `,"clientInfo":{"name":"fuzz","version":"1"}}}`
	req, _ := http.NewRequest(http.MethodPost, h.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		return // refused (every session busy)
	}
	h.sessions = append(h.sessions, sid)
	req, _ = http.NewRequest(http.MethodPost, h.url, strings.NewReader(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// call sends a tools/call and returns once it waits for a payment or was
// answered.
func (h *fuzzHarness) call(sess string, id int, tool, args string, meta []string, stock bool) {
	sid := h.session(sess)
	ctx, cancel := context.WithCancel(context.Background())
	c := &fuzzCall{cancel: cancel, waiting: make(chan struct{}), done: make(chan struct{})}
	h.calls = append(h.calls, c)

	hdr := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
	if sess == "-" {
		caps := `{"experimental":{"` + CapabilityPayments + `":{}}}`
		if stock {
			caps = `{}`
		}
		meta = append(meta, `"`+mcp.MetaKeyProtocolVersion+`":"`+mcp.LATEST_PROTOCOL_VERSION+`"`,
			`"`+mcp.MetaKeyClientCapabilities+`":`+caps, `"`+mcp.MetaKeyClientInfo+`":{"name":"fuzz","version":"1"}`)
		hdr["Mcp-Protocol-Version"] = mcp.LATEST_PROTOCOL_VERSION
		hdr["Mcp-Method"] = "tools/call"
		hdr["Mcp-Name"] = tool
	} else if sid != "" {
		hdr["Mcp-Session-Id"] = sid
		hdr["Mcp-Protocol-Version"] = "2025-11-25"
	}
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{%s}}}`,
		id, tool, args, strings.Join(meta, ","))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	go func() {
		defer close(c.done)
		var once sync.Once
		wait := func() { once.Do(func() { close(c.waiting) }) }
		defer wait()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				line = d
			}
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Params struct {
					PayReq string `json:"pay_req"`
				} `json:"params"`
				Result struct {
					StructuredContent struct {
						Token string `json:"capvend_payment"`
					} `json:"structuredContent"`
				} `json:"result"`
			}
			if json.Unmarshal(line, &m) != nil {
				continue
			}
			if tok := m.Result.StructuredContent.Token; tok != "" {
				c.mu.Lock()
				c.token = tok
				c.mu.Unlock()
			}
			if m.Method == vend.NotifyPaymentRequired {
				c.mu.Lock()
				c.ref = strings.TrimPrefix(m.Params.PayReq, bolt11Prefix)
				c.mu.Unlock()
			}
			if m.Method == vend.NotifyPaymentRequired || len(m.ID) > 0 {
				wait()
			}
		}
	}()
	h.await(c.waiting)
}

// unpaid reports whether c is not answered and waits for a payment still
// open (paid, expired or canceled ones end the wait).
func (h *fuzzHarness) unpaid(c *fuzzCall) bool {
	select {
	case <-c.done:
		return false
	default:
	}
	c.mu.Lock()
	ref := c.ref
	c.mu.Unlock()
	if ref == "" {
		return false
	}
	p, err := h.led.Payment(context.Background(), ref)
	return err == nil && p.State == vend.PaymentOpen
}

// await waits for ch; a deadlock guard, not a speed check.
func (h *fuzzHarness) await(ch <-chan struct{}) {
	select {
	case <-ch:
	case <-time.After(waitLimit):
		h.t.Fatalf("sequence stuck after %q", h.steps)
	}
}

// check verifies the money invariant on what the sequence left.
func (h *fuzzHarness) check(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	calls, err := h.led.CallsIn(ctx, vend.CallStates()...)
	if err != nil {
		t.Fatal(err)
	}
	type cover struct {
		call vend.Call
		ok   string // "" when a settled payment covers it, else why not
		used bool
	}
	var covers []*cover
	for _, c := range calls {
		if c.Executions == 0 {
			continue
		}
		cv := &cover{call: c}
		ps, err := h.led.CallPayments(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		settled := 0
		for _, p := range ps {
			if p.State == vend.PaymentSettled {
				settled++
				if p.Settled < c.Price {
					cv.ok = fmt.Sprintf("settled %d msat < price %d", p.Settled, c.Price)
				}
			}
		}
		switch {
		case settled != 1:
			cv.ok = fmt.Sprintf("%d settled payments", settled)
		case c.Executions > 1:
			cv.ok = fmt.Sprintf("executed %d times", c.Executions)
		case c.Price < fuzzPrices[c.Name].Price:
			cv.ok = fmt.Sprintf("price %d below the quote %d", c.Price, fuzzPrices[c.Name].Price)
		case c.Kind.Or() != vend.ItemTool:
			cv.ok = "kind " + string(c.Kind)
		}
		covers = append(covers, cv)
	}
	h.tools.mu.Lock()
	runs := append([]execution(nil), h.tools.runs...)
	h.tools.mu.Unlock()
	free := map[string]map[string]bool{} // tool -> argument hashes run unpaid
	for _, e := range runs {
		if _, priced := fuzzPrices[e.tool]; !priced {
			continue
		}
		var found *cover
		for _, cv := range covers {
			if !cv.used && cv.call.Name == e.tool && cv.call.ArgsHash == e.hash {
				found = cv
				break
			}
		}
		switch {
		case found != nil && found.ok == "":
			found.used = true
		case found != nil:
			found.used = true
			t.Errorf("execution of %s %s: its call %d is not covered: %s (steps %q)", e.tool, e.hash[:8], found.call.ID, found.ok, h.steps)
		default:
			if free[e.tool] == nil {
				free[e.tool] = map[string]bool{}
			}
			free[e.tool][e.hash] = true
			if n := len(free[e.tool]); n > fuzzPrices[e.tool].FreePerDay {
				t.Errorf("execution of %s %s covered by no paid call (unpaid arguments %d, free quota %d) (steps %q)",
					e.tool, e.hash[:8], n, fuzzPrices[e.tool].FreePerDay, h.steps)
			}
		}
	}
	for _, cv := range covers {
		if !cv.used && cv.call.State != vend.CallExecuting {
			// The books say it ran; the upstream never ran it (it ran
			// something else in its name, or nothing).
			t.Errorf("call %d (%s %s, %s) counts an execution the upstream never had (steps %q)",
				cv.call.ID, cv.call.Name, cv.call.ArgsHash[:8], cv.call.State, h.steps)
		}
	}
	if r, err := h.led.Verify(ctx); err != nil || !r.OK() {
		var b strings.Builder
		if r != nil {
			r.WriteTo(&b)
		}
		t.Errorf("ledger verify: %v\n%s", err, b.String())
	}
}
