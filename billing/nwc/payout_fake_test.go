package nwc_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/ecdsa"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/lightningnetwork/lnd/lntypes"
	"github.com/lightningnetwork/lnd/lnwire"
	"github.com/lightningnetwork/lnd/zpay32"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip44"

	"github.com/capvend/capvend/billing/nwc"
	"github.com/capvend/capvend/internal/testkit"
	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// answer is what the fake wallet says to one request: a result, an
// error code, or nothing (the answer lost).
type answer struct {
	result any
	code   string
	drop   bool
}

// fakeWallet is a NIP-47 wallet service on an in-process relay whose
// answers a test scripts, method by method: what a real wallet does
// rarely (an answer lost, a payment failed that went through) on demand.
type fakeWallet struct {
	uri     nwc.URI
	methods []string
	notes   []string // the notifications it says it sends (it sends none)

	mu      sync.Mutex
	answers map[string][]answer // by method, in order; the last one repeats
	calls   map[string]int
}

func newFakeWallet(t *testing.T, methods ...string) *fakeWallet {
	t.Helper()
	return newFakeWalletNoting(t, nil, methods...)
}

// newFakeWalletNoting is newFakeWallet whose info event and get_info
// also declare the notifications notes.
func newFakeWalletNoting(t *testing.T, notes []string, methods ...string) *fakeWallet {
	t.Helper()
	url := testkit.Relay(t)
	walletSK, clientSK := nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()
	walletPK, _ := nostr.GetPublicKey(walletSK)
	clientPK, _ := nostr.GetPublicKey(clientSK)
	w := &fakeWallet{uri: nwc.URI{Wallet: walletPK, Relays: []string{url}, Secret: clientSK}, methods: methods, notes: notes,
		answers: map[string][]answer{}, calls: map[string]int{}}
	conv, err := nip44.GenerateConversationKey(clientPK, walletSK)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	relay, err := nostr.RelayConnect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	info := nostr.Event{Kind: nwc.KindInfo, CreatedAt: nostr.Now(), Content: strings.Join(methods, " "),
		Tags: nostr.Tags{{"encryption", "nip44_v2"}}}
	if len(notes) > 0 {
		info.Tags = append(info.Tags, nostr.Tag{"notifications", strings.Join(notes, " ")})
	}
	info.Sign(walletSK)
	if err := relay.Publish(ctx, info); err != nil {
		t.Fatal(err)
	}
	sub, err := relay.Subscribe(ctx, nostr.Filters{{Kinds: []int{nwc.KindRequest}, Tags: nostr.TagMap{"p": {walletPK}}}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range sub.Events {
			plain, err := nip44.Decrypt(ev.Content, conv)
			if err != nil {
				continue
			}
			var req struct {
				Method string `json:"method"`
			}
			json.Unmarshal([]byte(plain), &req)
			a := w.next(req.Method)
			if a.drop {
				continue
			}
			body := map[string]any{"result_type": req.Method}
			if a.code != "" {
				body["error"] = map[string]string{"code": a.code, "message": strings.ToLower(a.code)}
			} else {
				body["result"] = a.result
			}
			b, _ := json.Marshal(body)
			content, _ := nip44.Encrypt(string(b), conv)
			reply := nostr.Event{Kind: nwc.KindResponse, CreatedAt: nostr.Now(), Content: content,
				Tags: nostr.Tags{{"e", ev.ID}, {"p", ev.PubKey}}}
			reply.Sign(walletSK)
			relay.Publish(ctx, reply)
		}
	}()
	return w
}

// script sets the answers to method, in order (the last repeats).
func (w *fakeWallet) script(method string, as ...answer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answers[method] = as
}

func (w *fakeWallet) count(method string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[method]
}

func (w *fakeWallet) next(method string) answer {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls[method]++
	if method == nwc.MethodGetInfo {
		return answer{result: map[string]any{"alias": "fake", "network": "regtest", "methods": w.methods, "notifications": w.notes}}
	}
	as := w.answers[method]
	switch len(as) {
	case 0:
		return answer{code: "NOT_IMPLEMENTED"}
	case 1:
		return as[0]
	}
	w.answers[method] = as[1:]
	return as[0]
}

// testInvoice is a signed regtest bolt11 for msat (0: no amount) and its
// preimage and payment hash.
func testInvoice(t *testing.T, msat int64, expiry time.Duration) (bolt11, preimage, hash string) {
	t.Helper()
	var pre lntypes.Preimage
	rand.Read(pre[:])
	h := pre.Hash()
	key, _ := btcec.NewPrivateKey()
	opts := []func(*zpay32.Invoice){zpay32.Description("refund"), zpay32.Expiry(expiry)}
	if msat > 0 {
		opts = append(opts, zpay32.Amount(lnwire.MilliSatoshi(msat)))
	}
	inv, err := zpay32.NewInvoice(&chaincfg.RegressionNetParams, h, time.Now(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := inv.Encode(zpay32.MessageSigner{SignCompact: func(msg []byte) ([]byte, error) {
		return ecdsa.SignCompact(key, chainhash.HashB(msg), true), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s, hex.EncodeToString(pre[:]), h.String()
}

// fakeFixture is a ledger with a refund of 21 sat owed, and a payer on a
// fake wallet's connection.
type fakeFixture struct {
	w *fakeWallet
	l *ledger.Ledger
	c *nwc.Client
	r vend.Refund
}

func newFakeFixture(t *testing.T, methods ...string) *fakeFixture {
	t.Helper()
	w := newFakeWallet(t, methods...)
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "capvend.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c, err := nwc.NewClient(w.uri, nwc.ClientConfig{Timeout: 3 * time.Second, ConnectTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	f := &fakeFixture{w: w, l: l, c: c}
	f.r = owedRefund(t, &fixture{l: l}, 21, "")
	return f
}

func (f *fakeFixture) payer(t *testing.T, cfg nwc.PayerConfig) *nwc.Payer {
	t.Helper()
	if cfg.PayTimeout == 0 {
		cfg.PayTimeout = time.Second
	}
	p, err := nwc.NewPayer(f.c, f.l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tx is the wallet's outgoing transaction of hash.
func tx(state, hash string, fee int64) answer {
	return answer{result: nwc.Transaction{Type: "outgoing", State: state, PaymentHash: hash, Amount: 21_000, FeesPaid: fee}}
}

// TestPayoutOutcomes: what the wallet answers to pay_invoice, and then
// to lookup_invoice, decides the payout, reserved before the request:
// booked with the fee the wallet reports, released when the wallet did
// not pay (and the error says what to do), left in flight when it
// cannot tell, and then resolved from a later lookup.
func TestPayoutOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pay    func(preimage string) answer
		lookup []answer // by hash
		state  vend.PayoutState
		fee    vend.Msat
		err    error  // the error PayRefund wraps
		says   string // and what it says
	}{
		{name: "paid", pay: func(pre string) answer { return answer{result: map[string]any{"preimage": pre, "fees_paid": 1_000}} },
			state: vend.PayoutBooked, fee: 1_000},
		{name: "paid, the fee only in the transaction", pay: func(pre string) answer { return answer{result: map[string]any{"preimage": pre}} },
			lookup: []answer{tx("settled", "", 2_000)}, state: vend.PayoutBooked, fee: 2_000},
		{name: "budget spent", pay: func(string) answer { return answer{code: "QUOTA_EXCEEDED"} },
			state: vend.PayoutReleased, err: nwc.ErrQuotaExceeded, says: "raise the connection's budget"},
		{name: "balance too low", pay: func(string) answer { return answer{code: "INSUFFICIENT_BALANCE"} },
			state: vend.PayoutReleased, err: nwc.ErrInsufficientBalance, says: "top the wallet up"},
		{name: "restricted", pay: func(string) answer { return answer{code: "RESTRICTED"} },
			state: vend.PayoutReleased, err: nwc.ErrRestricted, says: "grant the connection pay_invoice"},
		{name: "failed, unknown to the wallet", pay: func(string) answer { return answer{code: "PAYMENT_FAILED"} },
			lookup: []answer{{code: "NOT_FOUND"}}, state: vend.PayoutReleased, err: nwc.ErrPaymentFailed, says: "nothing was paid"},
		{name: "failed, and the wallet says failed", pay: func(string) answer { return answer{code: "PAYMENT_FAILED"} },
			lookup: []answer{tx("failed", "", 0)}, state: vend.PayoutReleased, err: nwc.ErrPaymentFailed},
		{name: "failed, yet the wallet paid it", pay: func(string) answer { return answer{code: "PAYMENT_FAILED"} },
			lookup: []answer{tx("settled", "", 500)}, state: vend.PayoutBooked, fee: 500},
		{name: "answer lost, paid", pay: func(string) answer { return answer{drop: true} },
			lookup: []answer{tx("settled", "", 300)}, state: vend.PayoutBooked, fee: 300},
		{name: "answer lost, pending", pay: func(string) answer { return answer{drop: true} },
			lookup: []answer{tx("pending", "", 0)}, state: vend.PayoutReserved, err: nwc.ErrPayoutLeft, says: "is pending"},
		{name: "an internal error, the payment unknown", pay: func(string) answer { return answer{code: "INTERNAL"} },
			lookup: []answer{{code: "NOT_FOUND"}}, state: vend.PayoutReserved, err: nwc.ErrPayoutLeft, says: "unknown to it"},
		{name: "a preimage that proves nothing, the payment pending", pay: func(string) answer {
			return answer{result: map[string]any{"preimage": strings.Repeat("00", 32)}}
		}, lookup: []answer{tx("pending", "", 0)}, state: vend.PayoutReserved, err: nwc.ErrPayoutLeft},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeFixture(t, nwc.MethodPayInvoice, nwc.MethodLookupInvoice)
			inv, pre, hash := testInvoice(t, 21_000, time.Hour)
			f.w.script(nwc.MethodPayInvoice, tc.pay(pre))
			lookups := append([]answer(nil), tc.lookup...)
			for i := range lookups {
				if tx, ok := lookups[i].result.(nwc.Transaction); ok {
					tx.PaymentHash = hash
					lookups[i].result = tx
				}
			}
			if len(lookups) == 0 {
				lookups = []answer{{code: "NOT_FOUND"}}
			}
			f.w.script(nwc.MethodLookupInvoice, lookups...)
			_, res, err := f.payer(t, nwc.PayerConfig{}).PayRefund(context.Background(), f.r.ID, inv)
			switch {
			case tc.err == nil && err != nil:
				t.Fatalf("pay: %v", err)
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Fatalf("pay: %v, want %v", err, tc.err)
			case tc.says != "" && !strings.Contains(err.Error(), tc.says):
				t.Fatalf("the error %q does not say %q", err, tc.says)
			}
			all, _ := f.l.Payouts(context.Background(), true)
			if len(all) != 1 || all[0].State != tc.state || all[0].Quote != hash || (tc.state == vend.PayoutBooked && all[0].Fee != tc.fee) {
				t.Fatalf("payouts %+v, want one %s (fee %d)", all, tc.state, tc.fee)
			}
			if tc.state == vend.PayoutBooked && res.Fee != tc.fee {
				t.Fatalf("result %+v", res)
			}
			r, _ := f.l.RefundByID(context.Background(), f.r.ID)
			if (r.State == vend.RefundPaid) != (tc.state == vend.PayoutBooked) {
				t.Fatalf("refund %s with its payout %s", r.State, tc.state)
			}
			if tc.state == vend.PayoutReserved {
				// A second payer is refused while it is in flight ...
				if _, _, err := f.payer(t, nwc.PayerConfig{}).PayRefund(context.Background(), f.r.ID, inv); !errors.Is(err, vend.ErrPayoutInFlight) {
					t.Fatalf("a second payer: %v", err)
				}
				// ... until the wallet says: failed, released.
				f.w.script(nwc.MethodLookupInvoice, tx("failed", hash, 0))
				ended, left, err := f.payer(t, nwc.PayerConfig{}).Resolve(context.Background())
				if err != nil || left != 0 || len(ended) != 1 || ended[0].State != vend.PayoutReleased {
					t.Fatalf("resolve: %+v %d %v", ended, left, err)
				}
			}
			mustVerify(t, f.l)
		})
	}
}

// TestPayoutNeedsTheGrant: a connection not granted pay_invoice (or
// lookup_invoice) is refused before anything is reserved, naming what to
// grant; so are an expired invoice and one for more than is owed; an
// invoice without an amount is paid exactly what is owed.
func TestPayoutNeedsTheGrant(t *testing.T) {
	ctx := context.Background()
	for _, methods := range [][]string{{nwc.MethodLookupInvoice}, {nwc.MethodPayInvoice}} {
		f := newFakeFixture(t, methods...)
		inv, _, _ := testInvoice(t, 21_000, time.Hour)
		_, _, err := f.payer(t, nwc.PayerConfig{}).PayRefund(ctx, f.r.ID, inv)
		missing := nwc.PayoutMethods[0]
		if methods[0] == missing {
			missing = nwc.PayoutMethods[1]
		}
		if !errors.Is(err, nwc.ErrMethodNotGranted) || !strings.Contains(err.Error(), missing) {
			t.Fatalf("granted %v: %v", methods, err)
		}
		if f.w.count(nwc.MethodPayInvoice) != 0 {
			t.Fatal("pay_invoice was sent")
		}
	}

	f := newFakeFixture(t, nwc.PayoutMethods...)
	expired, _, _ := testInvoice(t, 21_000, time.Second)
	time.Sleep(1100 * time.Millisecond)
	big, _, _ := testInvoice(t, 21_001, time.Hour)
	for _, tc := range []struct{ inv, says string }{
		{expired, "the invoice expired"},
		{big, "more than the 21.000 sat owed: refused"},
		{"lnbcrt1junk", "invalid invoice"},
	} {
		if _, _, err := f.payer(t, nwc.PayerConfig{}).PayRefund(ctx, f.r.ID, tc.inv); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("%s: %v", tc.says, err)
		}
	}
	if all, _ := f.l.Payouts(ctx, true); len(all) != 0 || f.w.count(nwc.MethodPayInvoice) != 0 {
		t.Fatalf("a refused payout was reserved or sent: %+v", all)
	}

	amountless, pre, _ := testInvoice(t, 0, time.Hour)
	f.w.script(nwc.MethodPayInvoice, answer{result: map[string]any{"preimage": pre, "fees_paid": 0}})
	r, res, err := f.payer(t, nwc.PayerConfig{}).PayRefund(ctx, f.r.ID, "LIGHTNING:"+strings.ToUpper(amountless))
	if err != nil || r.State != vend.RefundPaid || r.Paid != 21_000 || res.Amount != 21_000 {
		t.Fatalf("an invoice without an amount: %+v %+v %v", r, res, err)
	}
	mustVerify(t, f.l)
}

// TestPayoutLeftInFlightByACrash: the process dies between the wallet
// paying and the booking; the next payer on the connection resolves it
// first, from lookup_invoice, and books it with the wallet's fee; a
// payer on another connection leaves it alone.
func TestPayoutLeftInFlightByACrash(t *testing.T) {
	ctx := context.Background()
	f := newFakeFixture(t, nwc.PayoutMethods...)
	inv, pre, hash := testInvoice(t, 21_000, time.Hour)
	f.w.script(nwc.MethodPayInvoice, answer{result: map[string]any{"preimage": pre, "fees_paid": 700}})
	crash := f.payer(t, nwc.PayerConfig{Failpoint: func(step string) { panic(step) }})
	func() {
		defer func() { recover() }()
		crash.PayRefund(ctx, f.r.ID, inv)
	}()
	if left, _ := f.l.Payouts(ctx, false); len(left) != 1 {
		t.Fatalf("in flight after the crash: %+v", left)
	}
	// Another connection (another client key) is not the wallet that paid.
	other := newFakeWallet(t, nwc.PayoutMethods...)
	oc, err := nwc.NewClient(other.uri, nwc.ClientConfig{Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	op, _ := nwc.NewPayer(oc, f.l, nwc.PayerConfig{Name: "other"})
	if ended, left, err := op.Resolve(ctx); len(ended) != 0 || left != 0 || err != nil || other.count(nwc.MethodLookupInvoice) != 0 {
		t.Fatalf("another connection resolved it: %+v %d %v", ended, left, err)
	}
	f.w.script(nwc.MethodLookupInvoice, tx("settled", hash, 700))
	ended, left, err := f.payer(t, nwc.PayerConfig{}).Resolve(ctx)
	if err != nil || left != 0 || len(ended) != 1 || ended[0].State != vend.PayoutBooked || ended[0].Fee != 700 {
		t.Fatalf("resolved: %+v %d %v", ended, left, err)
	}
	if r, _ := f.l.RefundByID(ctx, f.r.ID); r.State != vend.RefundPaid || r.Fee != 700 {
		t.Fatalf("refund %+v", r)
	}
	if _, _, err := f.payer(t, nwc.PayerConfig{}).PayRefund(ctx, f.r.ID, inv); !errors.Is(err, vend.ErrRefundPaid) {
		t.Fatalf("paid again: %v", err)
	}
	if n := f.w.count(nwc.MethodPayInvoice); n != 1 {
		t.Fatalf("pay_invoice sent %d times", n)
	}
	mustVerify(t, f.l)
}
