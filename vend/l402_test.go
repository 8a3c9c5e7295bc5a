package vend_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/macaroon.v2"

	"github.com/capvend/capvend/ledger"
	"github.com/capvend/capvend/vend"
)

// l402Req is a call of an HTTP client that asked for an L402 challenge.
func l402Req(id, args string) vend.CallRequest {
	r := req(id, "demo_echo", args, nil)
	r.Client, r.Anonymous, r.L402 = "anonymous", true, true
	return r
}

// l402Retry is the repeat of a call presenting an L402 credential.
func l402Retry(id, args string, mac []byte, preimage string) vend.CallRequest {
	r := l402Req(id, args)
	r.Macaroon, r.PaymentProof = mac, preimage
	return r
}

// challenge makes an unpaid L402 call and returns its answer, its payment
// and the preimage its payer would learn.
func challenge(t *testing.T, h *harness, id, args string) (*vend.PaymentRequiredError, vend.Payment, string) {
	t.Helper()
	_, err := h.v.CallItem(context.Background(), l402Req(id, args))
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || pr.Macaroon == nil {
		t.Fatalf("unpaid L402 call: %v (%+v)", err, pr)
	}
	p := h.nextPayment(t)
	h.be.mu.Lock()
	pre := h.be.preimages[p.Ref]
	h.be.mu.Unlock()
	return pr, p, pre
}

// TestL402ReleasesItsCallOnce: an L402 call is answered with a macaroon
// whose identifier is Aperture's (version 0, the invoice's payment hash,
// a token id starting with the call id). The retry with the macaroon and
// the preimage, presented before the backend reported the payment, waits
// for the report (it is not answered as pending), then runs the call
// once; the same credential again is refused and runs nothing.
func TestL402ReleasesItsCallOnce(t *testing.T) {
	h := newHarness(t, false, nil)
	args := `{"text":"l402"}`
	pr, p, pre := challenge(t, h, "1", args)
	var m macaroon.Macaroon
	if err := m.UnmarshalBinary(pr.Macaroon); err != nil {
		t.Fatal(err)
	}
	id := m.Id()
	if len(id) != 66 || binary.BigEndian.Uint16(id) != 0 || hex.EncodeToString(id[2:34]) != p.Ref ||
		vend.CallID(binary.BigEndian.Uint64(id[34:42])) != p.CallID {
		t.Fatalf("identifier %x, payment hash %s, call %d", id, p.Ref, p.CallID)
	}

	ch := h.callAsync(l402Retry("1", args, pr.Macaroon, pre))
	h.be.pay(p.Ref) // the payer learnt the preimage; capvend's report comes after
	o := result(t, ch)
	if o.err != nil || !strings.Contains(string(o.res.Body), "echo:l402") {
		t.Fatalf("paid retry: %s %v", o.res.Body, o.err)
	}
	if _, err := h.v.CallItem(context.Background(), l402Retry("2", args, pr.Macaroon, pre)); !errors.Is(err, vend.ErrTokenUsed) {
		t.Fatalf("replay: %v, want %v", err, vend.ErrTokenUsed)
	}
	if got := h.tools.sentArgs(); len(got) != 1 {
		t.Fatalf("upstream ran %d times: %q", len(got), got)
	}
	verify(t, h.l)
}

// mint signs a macaroon like capvend's with key, for payment hash ref and
// call id, with caveats cavs.
func mint(t *testing.T, key []byte, ref string, id vend.CallID, cavs ...string) []byte {
	t.Helper()
	hash, _ := hex.DecodeString(ref)
	ident := binary.BigEndian.AppendUint16(nil, 0)
	ident = append(ident, hash...)
	ident = binary.BigEndian.AppendUint64(ident, uint64(id))
	ident = append(ident, make([]byte, 24)...)
	m, err := macaroon.New(key, ident, "capvend", macaroon.V2)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cavs {
		if err := m.AddFirstPartyCaveat([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := m.MarshalBinary()
	return b
}

// addCaveat returns mac with the first-party caveat cav added (what any
// holder can do without the root key).
func addCaveat(t *testing.T, mac []byte, cav string) []byte {
	t.Helper()
	var m macaroon.Macaroon
	if err := m.UnmarshalBinary(mac); err != nil {
		t.Fatal(err)
	}
	if err := m.AddFirstPartyCaveat([]byte(cav)); err != nil {
		t.Fatal(err)
	}
	b, _ := m.MarshalBinary()
	return b
}

// TestL402Refusals: every credential that is not exactly the paid call's
// is refused with its reason, runs nothing, asks for no payment, and
// leaves the paid call to its own credential, which then runs it once.
func TestL402Refusals(t *testing.T) {
	h := newHarness(t, false, nil)
	args := `{"text":"a"}`
	pr, p, pre := challenge(t, h, "a", args)
	h.be.pay(p.Ref)
	prB, pB, preB := challenge(t, h, "b", `{"text":"b"}`)
	h.be.pay(pB.Ref)
	key, err := h.l.L402RootKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	foreign := make([]byte, 32)
	rand.Read(foreign)
	until := "capvend_valid_until=" + strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	call := "capvend_call=tool " + mustCall(t, h, p.CallID).ArgsHash + " demo_echo"
	wrongPre := make([]byte, 32)
	rand.Read(wrongPre)

	revokedMac := mint(t, key, p.Ref, p.CallID, "services=capvend:0", until, call)
	revokedID, err := vend.L402TokenID(revokedMac)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.l.RevokeL402(context.Background(), revokedID, "test"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		args     string
		tool     string
		mac      []byte
		preimage string
		want     error
		reason   string
	}{
		{"wrong preimage", args, "", pr.Macaroon, hex.EncodeToString(wrongPre), vend.ErrL402Invalid, "not the invoice's"},
		{"no preimage", args, "", pr.Macaroon, "", vend.ErrL402Invalid, "no preimage"},
		{"not hex", args, "", pr.Macaroon, "zz", vend.ErrL402Invalid, "no preimage"},
		{"another call's preimage", args, "", pr.Macaroon, preB, vend.ErrL402Invalid, "not the invoice's"},
		{"not a macaroon", args, "", []byte("garbage"), pre, vend.ErrL402Invalid, "not a macaroon"},
		{"foreign key", args, "", mint(t, foreign, p.Ref, p.CallID, "services=capvend:0", until, call), pre, vend.ErrL402Invalid, "not signed"},
		{"expired", args, "", mint(t, key, p.Ref, p.CallID, "services=capvend:0", "capvend_valid_until=1", call), pre, vend.ErrL402Invalid, "expired"},
		{"another service", args, "", mint(t, key, p.Ref, p.CallID, "services=loop:0", until, call), pre, vend.ErrL402Invalid, "service"},
		{"no call caveat", args, "", mint(t, key, p.Ref, p.CallID, "services=capvend:0", until), pre, vend.ErrL402Invalid, "missing"},
		{"unknown caveat added", args, "", addCaveat(t, pr.Macaroon, "ip=127.0.0.1"), pre, vend.ErrL402Invalid, "unknown caveat"},
		{"expiry attenuated", args, "", addCaveat(t, pr.Macaroon, "capvend_valid_until=2"), pre, vend.ErrL402Invalid, "expired"},
		{"revoked", args, "", revokedMac, pre, vend.ErrL402Invalid, "revoked"},
		{"other arguments", `{"text":"b"}`, "", pr.Macaroon, pre, vend.ErrTokenMismatch, "another call"},
		{"another tool", args, "demo_fail", pr.Macaroon, pre, vend.ErrTokenMismatch, "another call"},
		{"call B's macaroon for call A", args, "", prB.Macaroon, preB, vend.ErrTokenMismatch, "another call"},
		{"call A's hash, call B's id", `{"text":"b"}`, "", mint(t, key, p.Ref, pB.CallID, "services=capvend:0", until,
			"capvend_call=tool "+mustCall(t, h, pB.CallID).ArgsHash+" demo_echo"), pre, vend.ErrL402Invalid, "no such payment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := l402Retry("r-"+tc.name, tc.args, tc.mac, tc.preimage)
			if tc.tool != "" {
				r.Name = tc.tool
			}
			_, err := h.v.CallItem(context.Background(), r)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("got %v, want %v (%q)", err, tc.want, tc.reason)
			}
		})
	}
	if got := h.tools.sentArgs(); len(got) != 0 {
		t.Fatalf("a refused credential ran %q", got)
	}
	select {
	case extra := <-h.be.last:
		t.Fatalf("a refused credential asked for a payment: %+v", extra)
	default:
	}
	if o, err := h.v.CallItem(context.Background(), l402Retry("ok", args, pr.Macaroon, pre)); err != nil || !strings.Contains(string(o.Body), "echo:a") {
		t.Fatalf("the paid call's own credential: %s %v", o.Body, err)
	}
	verify(t, h.l)
}

func mustCall(t *testing.T, h *harness, id vend.CallID) vend.Call {
	t.Helper()
	c, err := h.l.Call(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestL402SurvivesRestart: the root key is generated once and kept in the
// ledger: a macaroon minted before a restart releases its call after it.
func TestL402SurvivesRestart(t *testing.T) {
	h := newHarness(t, false, nil)
	args := `{"text":"r"}`
	pr, p, pre := challenge(t, h, "1", args)
	h.be.pay(p.Ref)
	path := h.l.Path()
	key1, err := h.l.L402RootKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h.l.Close()
	l, err := openLedger(context.Background(), path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	key2, err := l.L402RootKey(context.Background())
	if err != nil || hex.EncodeToString(key1) != hex.EncodeToString(key2) || len(key2) != 32 {
		t.Fatalf("root key changed across a restart (%v)", err)
	}
	h2 := harnessOn(t, l, false, nil)
	o, err := h2.v.CallItem(context.Background(), l402Retry("1", args, pr.Macaroon, pre))
	if err != nil || !strings.Contains(string(o.Body), "echo:r") {
		t.Fatalf("after restart: %s %v", o.Body, err)
	}
}
