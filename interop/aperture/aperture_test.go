// Package aperture_test checks capvend's L402 against Lightning Labs' own
// l402 package (github.com/lightninglabs/aperture v0.4.0): their client
// parses capvend's challenge and pays it, and the Authorization header
// their code builds runs the call on capvend. It is a module of its own
// so that aperture's dependencies never move capvend's (lnd, grpc,
// protobuf): run it with `cd interop/aperture && go test ./...`.
package aperture_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/ecdsa"
	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/lightninglabs/aperture/l402"
	"github.com/lightninglabs/lndclient"
	"github.com/lightningnetwork/lnd/lntypes"
	"github.com/lightningnetwork/lnd/lnwire"
	"github.com/lightningnetwork/lnd/zpay32"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"gopkg.in/macaroon.v2"

	"github.com/capvend/capvend/adapters/mcpfront"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/pricing"
	"github.com/capvend/capvend/vend"
)

// invoiceBackend issues real regtest bolt11 invoices (signed by a key of
// its own) recorded in the ledger, and settles one when pay is called, as
// LND reports a settled invoice.
type invoiceBackend struct {
	led  *ledger.Ledger
	key  *btcec.PrivateKey
	mu   sync.Mutex
	pre  map[string]lntypes.Preimage
	rep  func(vend.PaymentEvent)
	runs chan struct{}
}

func (b *invoiceBackend) Name() vend.Backend { return vend.BackendLND }

func (b *invoiceBackend) Request(ctx context.Context, r vend.PaymentRequest) (vend.Payment, error) {
	var pre lntypes.Preimage
	rand.Read(pre[:])
	hash := sha256.Sum256(pre[:])
	inv, err := zpay32.NewInvoice(&chaincfg.RegressionNetParams, hash, time.Now(),
		zpay32.Amount(lnwire.MilliSatoshi(r.Amount)), zpay32.Description(r.Memo), zpay32.Expiry(r.Expiry))
	if err != nil {
		return vend.Payment{}, err
	}
	bolt11, err := inv.Encode(zpay32.MessageSigner{SignCompact: func(msg []byte) ([]byte, error) {
		return ecdsa.SignCompact(b.key, chainhash.HashB(msg), true), nil
	}})
	if err != nil {
		return vend.Payment{}, err
	}
	ref := hex.EncodeToString(hash[:])
	p, err := b.led.RecordPayment(ctx, r.CallID, vend.NewPayment{Backend: vend.BackendLND, Kind: vend.KindInvoice, Ref: ref,
		Bolt11: bolt11, Amount: r.Amount, ExpiresAt: time.Now().Add(r.Expiry)})
	if err == nil {
		b.mu.Lock()
		b.pre[ref] = pre
		b.mu.Unlock()
	}
	return p, err
}

// pay settles the invoice of payment hash ref and returns its preimage.
func (b *invoiceBackend) pay(ref string) (lntypes.Preimage, error) {
	p, err := b.led.Payment(context.Background(), ref)
	if err != nil {
		return lntypes.Preimage{}, err
	}
	p, err = b.led.SettlePayment(context.Background(), vend.Settlement{Ref: ref, Amount: p.Amount})
	if err != nil {
		return lntypes.Preimage{}, err
	}
	b.mu.Lock()
	pre, rep := b.pre[ref], b.rep
	b.mu.Unlock()
	rep(vend.PaymentEvent{Payment: p})
	return pre, nil
}

func (b *invoiceBackend) Cancel(ctx context.Context, ref string) error {
	_, err := b.led.EndPayment(ctx, ref, vend.PaymentCanceled, "canceled")
	return err
}

func (b *invoiceBackend) Run(ctx context.Context, report func(vend.PaymentEvent)) error {
	b.mu.Lock()
	b.rep = report
	b.mu.Unlock()
	close(b.runs)
	<-ctx.Done()
	return ctx.Err()
}

// upstream is one priced tool that records its runs.
type upstream struct {
	mu   sync.Mutex
	runs int
}

func (u *upstream) Tools() []vend.Item {
	return []vend.Item{{Name: "shop_quote", Server: "shop", UpstreamName: "quote",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`)}}
}

func (u *upstream) CallTool(context.Context, vend.Item, json.RawMessage, json.RawMessage, func(json.RawMessage)) (json.RawMessage, error) {
	u.mu.Lock()
	u.runs++
	u.mu.Unlock()
	return json.RawMessage(`{"content":[{"type":"text","text":"quoted"}]}`), nil
}

// payer is the Lightning client Aperture's interceptor pays through: it
// pays capvend's invoice by settling it in capvend's backend, as the
// network would, and hands back the preimage.
type payer struct {
	lndclient.LightningClient
	be    *invoiceBackend
	t     *testing.T
	calls int
}

func (p *payer) PayInvoice(_ context.Context, invoice string, _ btcutil.Amount, _ *uint64) chan lndclient.PaymentResult {
	p.calls++
	out := make(chan lndclient.PaymentResult, 1)
	inv, err := zpay32.Decode(invoice, &chaincfg.RegressionNetParams)
	if err != nil {
		out <- lndclient.PaymentResult{Err: err}
		return out
	}
	pre, err := p.be.pay(hex.EncodeToString(inv.PaymentHash[:]))
	out <- lndclient.PaymentResult{Err: err, Preimage: pre, PaidAmt: btcutil.Amount(*inv.MilliSat / 1000)}
	return out
}

const callBody = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"shop_quote","arguments":{"q":"x"}}}`

// TestApertureClientPaysCapvend: capvend's 402 challenge, handed to
// Aperture's client interceptor as Aperture's gRPC proxy hands it over,
// is parsed (the macaroon, the bolt11 decoded for its payment hash) and
// paid; the macaroon Aperture then holds (with its preimage caveat) goes
// through Aperture's l402.SetHeader, and that Authorization header runs
// the call on capvend, once. Aperture's l402.FromHeader reads the same
// header back, and its DecodeIdentifier reads capvend's identifier.
func TestApertureClientPaysCapvend(t *testing.T) {
	led, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	key, _ := btcec.NewPrivateKey()
	be := &invoiceBackend{led: led, key: key, pre: map[string]lntypes.Preimage{}, runs: make(chan struct{})}
	up := &upstream{}
	book, err := pricing.NewBook(map[string]map[string]pricing.Rule{"shop": {"quote": {Price: 5000}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := vend.New(vend.Config{Ledger: led, Backends: []vend.PaymentBackend{be}, Tools: up, Prices: book, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { v.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()
	<-be.runs
	front, err := mcpfront.New(mcpfront.Config{Vendor: v, HTTP402: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(front.Handler())
	defer srv.Close()

	resp, _ := post(t, srv.URL, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"aperture-interop","version":"1"}}}`, nil)
	sid := resp.Header.Get("Mcp-Session-Id")
	post(t, srv.URL, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)

	// The unpaid call: HTTP 402 and its challenges.
	resp, body := post(t, srv.URL, sid, "", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid call: %d %s", resp.StatusCode, body)
	}

	// Aperture's client: the challenge arrives as its gRPC proxy sends
	// it (status "payment required", WWW-Authenticate in the trailer).
	pay := &payer{be: be, t: t}
	store, err := l402.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ic := l402.NewInterceptor(&lndclient.LndServices{Client: pay, ChainParams: &chaincfg.RegressionNetParams},
		store, 10*time.Second, 100, 10, true)
	var paidMD map[string]string
	calls := 0
	invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		calls++
		for _, o := range opts {
			if c, ok := o.(grpc.PerRPCCredsCallOption); ok {
				paidMD, _ = c.Creds.GetRequestMetadata(ctx)
			}
			if tr, ok := o.(grpc.TrailerCallOption); ok && calls == 1 {
				*tr.TrailerAddr = metadata.MD{strings.ToLower(l402.AuthHeader): resp.Header.Values("WWW-Authenticate")}
			}
		}
		if calls == 1 {
			return status.Error(l402.GRPCErrCode, l402.GRPCErrMessage)
		}
		return nil
	}
	if err := ic.UnaryInterceptor(context.Background(), "/capvend/call", nil, nil, nil, invoker); err != nil {
		t.Fatalf("Aperture's interceptor: %v", err)
	}
	if pay.calls != 1 || paidMD["macaroon"] == "" {
		t.Fatalf("Aperture paid %d times, sent %v", pay.calls, paidMD)
	}
	macBytes, err := hex.DecodeString(paidMD["macaroon"])
	if err != nil {
		t.Fatal(err)
	}
	var mac macaroon.Macaroon
	if err := mac.UnmarshalBinary(macBytes); err != nil {
		t.Fatal(err)
	}
	preHex, ok := l402.HasCaveat(&mac, l402.PreimageKey)
	if !ok {
		t.Fatal("Aperture's paid macaroon has no preimage caveat")
	}
	pre, err := lntypes.MakePreimageFromStr(preHex)
	if err != nil {
		t.Fatal(err)
	}
	id, err := l402.DecodeIdentifier(bytes.NewReader(mac.Id()))
	if err != nil || id.PaymentHash != pre.Hash() {
		t.Fatalf("Aperture reads capvend's identifier as %+v (%v), preimage hash %s", id, err, pre.Hash())
	}

	// The header Aperture's client code builds runs the call, once.
	h := http.Header{}
	if err := l402.SetHeader(&h, &mac, pre); err != nil {
		t.Fatal(err)
	}
	if _, got, err := l402.FromHeader(&h); err != nil || got != pre {
		t.Fatalf("Aperture's FromHeader on that header: %v", err)
	}
	resp, body = post(t, srv.URL, sid, "", h)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "quoted") {
		t.Fatalf("paid call: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, srv.URL, sid, "", h)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("replay: %d %s", resp.StatusCode, body)
	}
	if up.runs != 1 {
		t.Fatalf("the tool ran %d times", up.runs)
	}
}

// post sends body (the tools/call if "") in the session sid (none if "")
// of protocol 2025-11-25, with the headers h.
func post(t *testing.T, url, sid, body string, h http.Header) (*http.Response, string) {
	t.Helper()
	if body == "" {
		body = callBody
	}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
