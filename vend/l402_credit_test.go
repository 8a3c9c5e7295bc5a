package vend_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/macaroon.v2"

	"github.com/capvend/capvend/vend"
)

// creditChallenge asks for an L402 token for sats (TopUpTool over L402)
// and returns the challenge, its payment and the preimage its payer would
// learn.
func creditChallenge(t *testing.T, h *harness, id string, sats int) (*vend.PaymentRequiredError, vend.Payment, string) {
	t.Helper()
	r := l402Req(id, fmt.Sprintf(`{"sats":%d}`, sats))
	r.Name = vend.TopUpTool
	_, err := h.v.CallItem(context.Background(), r)
	var pr *vend.PaymentRequiredError
	if !errors.As(err, &pr) || pr.Macaroon == nil {
		t.Fatalf("unpaid L402 top-up: %v (%+v)", err, pr)
	}
	p := h.nextPayment(t)
	if p.Amount != vend.Msat(sats*1000) {
		t.Fatalf("top-up invoice of %d msat for %d sats", p.Amount, sats)
	}
	h.be.mu.Lock()
	pre := h.be.preimages[p.Ref]
	h.be.mu.Unlock()
	return pr, p, pre
}

// caveats returns the first-party caveats of a binary macaroon.
func caveats(t *testing.T, mac []byte) []string {
	t.Helper()
	var m macaroon.Macaroon
	if err := m.UnmarshalBinary(mac); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range m.Caveats() {
		out = append(out, string(c.Id))
	}
	return out
}

// TestL402CreditToken: an L402 request of capvend_topup for 100 sats is
// answered with a credit macaroon (capvend_credit=<account>, no
// capvend_call, good for a year) and the 100-sat invoice. Once paid, the credential pays
// four calls at 21 sats with no further payment request (the first, made
// before the top-up was repeated, credits it through TopUp); the fifth is
// told to top up; the top-up's own retry, credited already, is refused
// as used. The books verify.
func TestL402CreditToken(t *testing.T) {
	h := newHarness(t, false, withCredit)
	pr, p, pre := creditChallenge(t, h, "topup", 100)
	var account string
	var until int64
	for _, c := range caveats(t, pr.Macaroon) {
		if strings.HasPrefix(c, "capvend_call=") {
			t.Fatalf("a credit macaroon with a call caveat: %q", c)
		}
		if a, ok := strings.CutPrefix(c, "capvend_credit="); ok {
			account = a
		}
		if u, ok := strings.CutPrefix(c, "capvend_valid_until="); ok {
			until, _ = strconv.ParseInt(u, 10, 64)
		}
	}
	// Credit never expires here: the token is good for L402CreditValidity.
	if left := time.Until(time.Unix(until, 0)); left < vend.L402CreditValidity {
		t.Fatalf("a credit macaroon good for %s only", left)
	}
	if !strings.HasPrefix(account, "t") {
		t.Fatalf("credit macaroon caveats %q", caveats(t, pr.Macaroon))
	}
	h.be.pay(p.Ref)
	for i := range 5 {
		args := fmt.Sprintf(`{"text":"c%d"}`, i)
		res, err := h.v.CallItem(context.Background(), l402Retry(fmt.Sprint("c", i), args, pr.Macaroon, pre))
		if i == 4 {
			var ex *vend.CreditExhaustedError
			if !errors.As(err, &ex) || ex.Account != account || ex.Balance != 16_000 {
				t.Fatalf("fifth call: %s %v", res.Body, err)
			}
			break
		}
		if err != nil || !strings.Contains(string(res.Body), "echo:c") {
			t.Fatalf("call %d: %s %v", i, res.Body, err)
		}
		if info := creditOf(t, res.Body); info.Account != account || info.BalanceMsat != int64(100_000-21_000*(i+1)) {
			t.Fatalf("call %d: credit %+v", i, info)
		}
	}
	select {
	case extra := <-h.be.last:
		t.Fatalf("a credit call asked for a payment: %+v", extra)
	default:
	}
	retry := l402Retry("topup", `{"sats":100}`, pr.Macaroon, pre)
	retry.Name = vend.TopUpTool
	if _, err := h.v.CallItem(context.Background(), retry); !errors.Is(err, vend.ErrTokenUsed) {
		t.Fatalf("the top-up's retry after it was credited: %v, want %v", err, vend.ErrTokenUsed)
	}
	if got := h.tools.count("echo"); got != 4 {
		t.Fatalf("upstream ran %d times, want 4", got)
	}
	verify(t, h.l)
}

// TestL402CreditTopUpRetry: the stock L402 flow, the top-up repeated with
// its credential, credits the account once and answers its balance; the
// credential then pays a call.
func TestL402CreditTopUpRetry(t *testing.T) {
	h := newHarness(t, false, withCredit)
	pr, p, pre := creditChallenge(t, h, "topup", 50)
	h.be.pay(p.Ref)
	retry := l402Retry("topup", `{"sats":50}`, pr.Macaroon, pre)
	retry.Name = vend.TopUpTool
	res, err := h.v.CallItem(context.Background(), retry)
	if err != nil || res.IsError {
		t.Fatalf("top-up retry: %s %v", res.Body, err)
	}
	if info := creditOf(t, res.Body); info.BalanceMsat != 50_000 {
		t.Fatalf("after the top-up: %+v", info)
	}
	res, err = h.v.CallItem(context.Background(), l402Retry("c", `{"text":"x"}`, pr.Macaroon, pre))
	if err != nil || creditOf(t, res.Body).BalanceMsat != 29_000 {
		t.Fatalf("call: %s %v", res.Body, err)
	}
	verify(t, h.l)
}

// TestL402CreditRefusals: a credit credential that does not hold is
// refused with its reason, runs nothing, draws nothing and asks for no
// payment: both caveats or neither, a preimage that is not the top-up
// invoice's, a caveat naming another account (minted or added), a credit
// caveat on a call that is no top-up, a credit token of another account
// beside it, a revoked token, and the top-up's retry for other sats.
func TestL402CreditRefusals(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, false, withCredit)
	pr, p, pre := creditChallenge(t, h, "topup", 100)
	h.be.pay(p.Ref)
	other := h.buyCredit(t, req("topup-other", "", "", nil), 10)
	_, pp, ppre := challenge(t, h, "plain", `{"text":"plain"}`)
	h.be.pay(pp.Ref)

	key, err := h.l.L402RootKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var account string
	for _, c := range caveats(t, pr.Macaroon) {
		if a, ok := strings.CutPrefix(c, "capvend_credit="); ok {
			account = a
		}
	}
	until := "capvend_valid_until=" + strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	args := `{"text":"r"}`
	call := "capvend_call=tool " + argsHash(t, "tools/call", "demo_echo", args) + " demo_echo"
	wrongPre := hex.EncodeToString(make([]byte, 32))

	for _, tc := range []struct {
		name, tool, args string
		mac              []byte
		preimage, credit string
		want             error
		reason           string
	}{
		{"both caveats", "", args, mint(t, key, p.Ref, p.CallID, "services=capvend:0", until, call, "capvend_credit="+account), pre, "",
			vend.ErrL402Invalid, "not both"},
		{"neither caveat", "", args, mint(t, key, p.Ref, p.CallID, "services=capvend:0", until), pre, "", vend.ErrL402Invalid, "missing"},
		{"unpaid preimage", "", args, pr.Macaroon, wrongPre, "", vend.ErrL402Invalid, "not the invoice's"},
		{"another account minted", "", args, mint(t, key, p.Ref, p.CallID, "services=capvend:0", until, "capvend_credit="+other.Account), pre, "",
			vend.ErrL402Invalid, "another account"},
		{"another account added", "", args, addCaveat(t, pr.Macaroon, "capvend_credit="+other.Account), pre, "", vend.ErrL402Invalid, "or two"},
		{"credit caveat on a call", "", args, mint(t, key, pp.Ref, pp.CallID, "services=capvend:0", until, "capvend_credit="+account), ppre, "",
			vend.ErrL402Invalid, "no top-up"},
		{"credit token of another account", "", args, pr.Macaroon, pre, other.Token, vend.ErrL402Invalid, "different accounts"},
		{"top-up retry for other sats", vend.TopUpTool, `{"sats":99}`, pr.Macaroon, pre, "", vend.ErrTokenMismatch, "another call"},
		{"revoked", "", args, pr.Macaroon, pre, "", vend.ErrL402Invalid, "revoked"}, // last: it revokes the real token
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "revoked" {
				id, err := vend.L402TokenID(pr.Macaroon)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.l.RevokeL402(ctx, id, "test"); err != nil {
					t.Fatal(err)
				}
			}
			r := l402Retry("r-"+tc.name, tc.args, tc.mac, tc.preimage)
			if tc.tool != "" {
				r.Name = tc.tool
			}
			r.Credit = tc.credit
			_, err := h.v.CallItem(ctx, r)
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
	if b, err := h.l.CreditBalance(ctx, account); err != nil || b != 0 {
		t.Fatalf("balance of %s: %d msat (%v); want 0: its top-up was never repeated, and nothing was drawn", account, b, err)
	}
	if b, err := h.l.CreditBalance(ctx, other.Account); err != nil || b != 10_000 {
		t.Fatalf("balance of the other account: %d msat (%v), want 10000", b, err)
	}
	verify(t, h.l)
}

// TestL402CreditTopUpCanceledIsOwedBack: a credit top-up awaiting payment
// when the operator restored the ledger is canceled; its macaroon, paid
// afterwards, is refused as canceled and owed back (not "expired unpaid":
// that tells the customer to pay again), credits nothing and runs
// nothing, and the refusal names nothing of the books' reason.
func TestL402CreditTopUpCanceledIsOwedBack(t *testing.T) {
	h := newHarness(t, false, withCredit)
	pr, p, pre := creditChallenge(t, h, "topup", 100)
	if _, err := h.l.SettleRestored(context.Background(), "the ledger was restored from file:///srv/replica"); err != nil {
		t.Fatal(err)
	}
	h.be.pay(p.Ref)
	_, err := h.v.CallItem(context.Background(), l402Retry("c", `{"text":"x"}`, pr.Macaroon, pre))
	if !errors.Is(err, vend.ErrTokenCanceled) || errors.Is(err, vend.ErrTokenExpired) || strings.Contains(err.Error(), "/srv/replica") {
		t.Fatalf("a call on the canceled top-up's macaroon: %v, want %v", err, vend.ErrTokenCanceled)
	}
	if n := h.tools.count("echo"); n != 0 {
		t.Fatalf("ran %d times", n)
	}
}
